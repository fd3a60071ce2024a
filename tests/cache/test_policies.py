"""Eviction order of each policy on hand-made trees; registry and config validation."""
import pytest

from sglang_hydra.cache import (
    EvictionPolicy, Param, RadixTree, available_policies, get_policy_info, make_policy,
    register_eviction_policy, validate_policy_config,
)
from sglang_hydra.config.choices import choices


def order_of_eviction(policy, setup, cfg=None, page_size=1):
    """Run ``setup`` (list of (keys, clock)) via serve on an unbounded tree, then evict
    one page at a time and return the evicted keys."""
    pol = make_policy(policy, cfg, page_size=page_size)
    t = RadixTree(None, pol)
    for keys, clock in setup:
        t.serve(keys, clock)
    evicted = []
    while t.size:
        before = {n.key for n in t.iter_nodes()}
        assert t.evict(1) == 1
        evicted.extend(before - {n.key for n in t.iter_nodes()})
    return evicted


SETUP = [(["a", "b"], 1), (["c"], 2), (["a", "d"], 3), (["c"], 4), (["e"], 5)]


def test_lru_order():
    assert order_of_eviction("lru", SETUP) == ["b", "d", "a", "c", "e"]


def test_lfu_order():
    # counts: a=2, b=1, c=2, d=1, e=1 -> one-hit leaves first by recency, then a/c
    assert order_of_eviction("lfu", SETUP) == ["b", "d", "e", "a", "c"]


def test_fifo_order():
    # insertion: a,b@1  c@2  d@3  e@5; a becomes a leaf only after b and d go
    assert order_of_eviction("fifo", SETUP) == ["b", "c", "d", "a", "e"]


def test_slru_order_and_threshold():
    assert order_of_eviction("slru", SETUP) == ["b", "d", "e", "a", "c"]
    # threshold 3: nobody is protected -> LRU order
    assert order_of_eviction("slru", SETUP, {"protected_threshold": 3}) == \
        order_of_eviction("lru", SETUP)


def test_priority_order():
    pol = make_policy("priority")
    t = RadixTree(None, pol)
    t.serve(["x"], 1, priority=5)
    t.serve(["y"], 2, priority=0)
    t.serve(["z"], 3, priority=5)
    t.evict(1)
    assert {n.key for n in t.iter_nodes()} == {"x", "z"}
    t.evict(1)
    assert {n.key for n in t.iter_nodes()} == {"z"}


def test_tlru_evicts_tel_safe_tail_first():
    # chain of 6 pages (page_size 512): with threshold 4 pages and estimate 1 page the
    # budget is hw + 1 - 4 = 3 pages, so depths >= 3 are TEL-safe.
    cfg = {"threshold": 4 * 512, "next_prompt_estimate": 512}
    setup = [(["p0", "p1", "p2", "p3", "p4", "p5"], 1), (["q0"], 2)]
    order = order_of_eviction("tlru", setup, cfg, page_size=512)
    # q0 (hw 1, budget 0) is TEL-safe too; then the unsafe chain goes in LRU order
    assert order == ["p5", "p4", "p3", "q0", "p2", "p1", "p0"]


def test_belady_evicts_furthest_next_use():
    chains = [["a"], ["b"], ["c"], ["b"], ["a"]]
    pol = make_policy("belady")
    t = RadixTree(2, pol)
    pol.prepare(chains)
    hits = [t.serve(c, i) for i, c in enumerate(chains)]
    # at request 2 the cache must drop a (next use 4) rather than b (next use 3)
    assert hits == [0, 0, 0, 1, 0]


def test_ghost_lru_remembers_evicted_reuse():
    pol = make_policy("ghost_lru", {"alpha": 100.0, "ewma": 1.0})
    t = RadixTree(2, pol)
    t.serve(["a"], 0)
    t.serve(["b"], 1)
    t.serve(["c"], 2)          # evicts a (one-hit), lifetime sample 2
    assert "a" in pol._ghost
    t.serve(["a"], 3)          # re-inserted from the ghost -> proven (count 2)
    node = t.root.children["a"]
    assert node.hit_count == 2
    t.serve(["d"], 4)          # b or c must go, not the proven a
    t.serve(["e"], 5)
    assert "a" in t.root.children


def test_registry_contents_and_choices():
    names = available_policies()
    for n in ("lru", "lfu", "fifo", "slru", "priority", "tlru", "belady", "ghost_lru"):
        assert n in names
    assert "belady" not in available_policies(include_replay_only=False)
    assert get_policy_info("belady").replay_only
    cfg_choices = choices("RADIX_EVICTION_POLICY")
    assert "ghost_lru" in cfg_choices
    assert "belady" not in cfg_choices and "fifo" not in cfg_choices


def test_register_plugin_extends_config_choices():
    class MRU(EvictionPolicy):
        name = "test_mru"

        def key(self, node):
            return -node.last_access

    register_eviction_policy("test_mru", MRU)
    assert "test_mru" in choices("RADIX_EVICTION_POLICY")
    assert order_of_eviction("test_mru", [(["a"], 1), (["b"], 2)]) == ["b", "a"]
    with pytest.raises(ValueError):
        register_eviction_policy("lru", MRU)
    with pytest.raises(TypeError):
        register_eviction_policy("x_bad", object)

    from sglang_hydra.config.testing import make_record

    rec = make_record(radix_eviction_policy="test_mru")
    assert rec.radix_eviction_policy == "test_mru"


def test_validate_policy_config_messages():
    assert validate_policy_config("lru", None) == []
    assert validate_policy_config("slru", {"protected_threshold": 3}) == []
    errs = validate_policy_config("slru", {"foo": 1})
    assert len(errs) == 1 and "'foo'" in errs[0] and "'slru'" in errs[0]
    errs = validate_policy_config("lru", {"foo": 1})
    assert "'foo'" in errs[0] and "'lru'" in errs[0] and "no parameters" in errs[0]
    errs = validate_policy_config("slru", {"protected_threshold": "x"})
    assert "'protected_threshold'" in errs[0] and ">= 1" in errs[0]
    errs = validate_policy_config("slru", {"protected_threshold": True})
    assert errs
    errs = validate_policy_config("tlru", {"threshold": 100, "next_prompt_estimate": 200})
    assert "greater than" in errs[0]
    assert validate_policy_config("tlru", None)       # 0 <= 0, as the reference engine
    errs = validate_policy_config("tlru", {"threshold": -1})
    assert "'threshold'" in errs[0] and ">= 0" in errs[0]
    assert validate_policy_config("tlru", {"threshold": 8192, "next_prompt_estimate": 512}) == []
    assert "unknown eviction policy" in validate_policy_config("nope", None)[0]
    assert "mapping" in validate_policy_config("lru", [1])[0]
    assert validate_policy_config("ghost_lru", {"alpha": 2, "ghost_factor": 0}) == []
    assert validate_policy_config("ghost_lru", {"ewma": 0})
    with pytest.raises(ValueError, match="'foo'"):
        make_policy("slru", {"foo": 1})


def test_params_declared():
    for name in available_policies():
        cls = get_policy_info(name).cls
        for pname, spec in cls.PARAMS.items():
            assert isinstance(spec, Param) and spec.accepts(spec.default) or name == "tlru"


def _ghost_lfu_tree(cfg):
    pol = make_policy("ghost_lfu", cfg)
    return pol, RadixTree(3, pol)


def test_ghost_lfu_credit_grows_with_reuse_count_up_to_cap():
    """A page read three times outlives a page read twice, which outlives a one-hit page;
    with cap=1 the two proven pages are equal again (plain ghost_lru credit)."""
    pol, t = _ghost_lfu_tree({"alpha": 1.0, "beta": 1.0, "cap": 8.0, "ewma": 1.0})
    pol._life = 10.0
    t.serve(["x"], 0); t.serve(["x"], 1); t.serve(["x"], 2)   # count 3, last access 2
    t.serve(["y"], 3); t.serve(["y"], 4)                       # count 2, last access 4
    t.serve(["z"], 5)                                          # count 1, last access 5
    keys = {k: pol.key(t.root.children[k]) for k in "xyz"}
    assert keys == {"x": 2 + 20.0, "y": 4 + 10.0, "z": 5}
    t.serve(["w"], 6)                                          # full: the one-hit z goes
    assert set(t.root.children) == {"x", "y", "w"}
    capped, t2 = _ghost_lfu_tree({"alpha": 1.0, "beta": 1.0, "cap": 1.0})
    capped._life = 10.0
    for k, c in (("x", 0), ("x", 1), ("x", 2), ("y", 3), ("y", 4)):
        t2.serve([k], c)
    assert capped.key(t2.root.children["x"]) - 2 == capped.key(t2.root.children["y"]) - 4 == 10.0


def test_ghost_lfu_restores_counts_from_the_ghost_table():
    """An evicted page that comes back resumes its count + 1 and so its credit."""
    pol, t = _ghost_lfu_tree({"alpha": 50.0, "ewma": 1.0})
    pol._life = 10.0                              # as if one-hit pages had lived 10 ticks
    t.serve(["a"], 0); t.serve(["a"], 1)          # count 2: key 1 + 50 * 10
    t.serve(["b"], 2); t.serve(["c"], 3)
    t.serve(["d"], 40)                            # life sample: b evicted (one-hit, idle 38)
    assert "b" in pol._ghost and "a" in t.root.children
    t.serve(["b"], 41)                            # back from the ghost: proven
    assert t.root.children["b"].hit_count == 2
    t.serve(["e"], 42)                            # one of the one-hit pages c/d goes, not a or b
    assert {"a", "b", "e"} <= set(t.root.children)


def test_ghost_lfu_config_keys_are_checked():
    assert validate_policy_config("ghost_lfu", {"alpha": 3, "beta": 0, "cap": 1}) == []
    errs = validate_policy_config("ghost_lfu", {"gamma": 1, "cap": 0.5, "beta": -1})
    assert len(errs) == 3
    assert any("'gamma'" in e and "'ghost_lfu'" in e for e in errs)
    assert any("'cap'" in e and ">= 1" in e for e in errs)
    assert any("'beta'" in e and ">= 0" in e for e in errs)
    assert "ghost_lfu" in choices("RADIX_EVICTION_POLICY")


def _hot_set_under_a_scan(rounds=30, hot=20, scan=3):
    """Single-page requests: one of ``hot`` pages in turn, then ``scan`` pages never seen
    again.  The hot pages come back every ``hot * (scan + 1)`` requests, beyond what LRU
    keeps in 40 pages, so only a credit for proven reuse hits them."""
    reqs, fresh = [], 0
    for r in range(rounds):
        for h in range(hot):
            reqs.append([f"hot{h}"])
            for _ in range(scan):
                reqs.append([f"once{fresh}"])
                fresh += 1
    return reqs


def _hits(policy, cfg, reqs, capacity=40):
    t = RadixTree(capacity, make_policy(policy, cfg))
    return sum(t.serve(keys, i) for i, keys in enumerate(reqs)), t.policy


def test_auto_ghost_lfu_learns_to_credit_a_hot_set_under_a_scan():
    reqs = _hot_set_under_a_scan()
    lru, _ = _hits("lru", None, reqs)
    auto, pol = _hits("auto_ghost_lfu", {"alpha": 0.0, "sample": 1, "epoch": 50}, reqs)
    assert lru == 0
    assert pol.alpha > 0                       # started as LRU, the miniatures chose a credit
    assert auto > len(reqs) // 8               # most hot-page returns hit in the end


def test_auto_ghost_lfu_is_deterministic_across_processes():
    """Page sampling must not depend on Python's per-process string hash seed."""
    from hash_seed import same_output_under_two_hash_seeds

    same_output_under_two_hash_seeds(
        "from tests.cache.test_policies import _hits, _hot_set_under_a_scan;"
        "print(_hits('auto_ghost_lfu', {'sample': 3, 'epoch': 20}, _hot_set_under_a_scan(10))[0])")
