"""``hit_density``'s state machine, shared by the replay policy and the engine plugin.

That SGLang-with-plugin hits the replay's pages exactly is
tests/cache/test_engine_radix_differential.py (reference venv)."""
from sglang_hydra.cache.policies import make_policy


def _hd_requests(n=1500):
    """Conversations that return late: page j of conversation c, turns growing by two pages."""
    reqs = []
    for i in range(n):
        c = (i * 7) % 97
        turn = i // 97
        reqs.append([f"c{c}"] + [f"c{c}t{t}" for t in range(2 * turn + 2)])
    return reqs


def test_hit_density_core_by_arrival_does_not_depend_on_key_values():
    """The engine's page ids (hashes of tokens) and the replay's keys differ in value, not
    in order: with identity="arrival" the same touches give the same ages, shares and entries."""
    from sglang_hydra.cache.hit_density_core import hit_density_core

    a, b = hit_density_core({"epoch": 50}), hit_density_core({"epoch": 50})
    a.bind(60)
    b.bind(60)
    rename = {}
    for now, req in enumerate(_hd_requests(), start=1):
        a.touch(req, now, len(req))
        b.touch([rename.setdefault(k, hash((k, "engine")) & (2 ** 62 - 1)) for k in req], now, len(req))
    assert a._ttl == b._ttl and a._long == b._long and a._mix == b._mix
    assert any(a._ttl) or any(a._long), "learned nothing: the check would be vacuous"
    assert sorted(a._cur.values()) == sorted(b._cur.values())
    assert {k: a.page_age(k) for k in rename} == {k: b.page_age(v) for k, v in rename.items()}


def test_hit_density_core_checks_its_parameters():
    import pytest
    from sglang_hydra.cache.hit_density_core import hit_density_core

    with pytest.raises(ValueError, match="'classes' must be an integer in"):
        hit_density_core({"classes": 0})
    with pytest.raises(ValueError, match="'decay' must be a number in"):
        hit_density_core({"decay": 1.0})
    with pytest.raises(ValueError, match="unknown parameter"):
        hit_density_core({"alpha": 1})


def test_sglang_semantics_run_hit_density_on_pages_with_fresh_keys():
    """Under sglang semantics the replay feeds the core one key per page (as the plugin
    hashes pages), re-keys every candidate when the ages change (the engine evaluates
    priorities when evict() starts), and breaks ties by recency."""
    from sglang_hydra.cache.radix import RadixTree

    pol = make_policy("hit_density", {"epoch": 1000})
    t = RadixTree(100, pol, semantics="sglang")
    assert pol.core.by_arrival and not pol.engine_node_hooks   # no clock read at evict()
    for i in range(5):
        t.serve([f"s{i}", f"t{i}", f"u{i}"], i, weights=[4, 4, 3])
    assert pol.core._units == pol.core._pages == 55
    assert "t0" in pol.core._cur and ("t0", 3) in pol.core._cur and ("t0", 0) not in pol.core._cur
    leaf = t.root.children["s4"].children["t4"].children["u4"]
    assert pol.key(leaf) == (leaf.last_access, leaf.last_access)     # ages 0 before learning
    pol.core._ttl = [5] * len(pol.core._ttl)                        # new ages ...
    pol.core.generation += 1
    pol._rekey_if_new_ages()                                         # ... every candidate re-keyed
    live = [(k, n) for k, seq, n in t._heap if n.heap_seq == seq and not n.children and n.parent is not None]
    assert live and all(k == (n.last_access + 5, n.last_access) for k, n in live)
    rules = make_policy("hit_density", {"epoch": 1000})
    RadixTree(100, rules).serve(["a"], 0)
    assert not rules.engine_node_hooks and not rules.core.by_arrival and "a" in rules.core._cur
