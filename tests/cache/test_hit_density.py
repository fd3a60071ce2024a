"""``hit_density``: retention ages learned from return gaps beat LRU where ages matter."""
import pytest

from sglang_hydra.cache import RadixTree, make_policy, validate_policy_config
from sglang_hydra.cache.tiered import TieredCache
from sglang_hydra.cache.movers import CountingMover
from sglang_hydra.config.choices import choices
from hash_seed import same_output_under_two_hash_seeds
from test_policies import _hot_set_under_a_scan


def _hits(policy, cfg, reqs, capacity, semantics="rules"):
    t = RadixTree(capacity, make_policy(policy, cfg), semantics=semantics)
    hits = sum(t.serve(keys, i) for i, keys in enumerate(reqs))
    t.check_invariants()
    return hits, t.policy


def _late_returns(n=3000, gap=100):
    """Single-page requests: a new page every other request, read again exactly ``gap``
    requests later and never after.  With 40 pages LRU keeps the pages of ~40 requests: 0
    hits.  Keeping all pages for ``gap`` requests would take 50 pages; keeping four in five
    of them (chosen by request hash) that long and dropping the rest at once fits."""
    reqs = []
    for i in range(n):
        if i % 2 == 0:
            reqs.append([f"p{i}"])
        else:
            j = i - 1 - gap
            reqs.append([f"p{j}"] if j >= 0 else [f"w{i}"])
    return reqs


def test_beats_lru_when_every_page_returns_after_lru_evicted_it():
    reqs = _late_returns()
    lru, _ = _hits("lru", None, reqs, 40)
    returns = sum(1 for r in reqs if r[0].startswith("p")) // 2
    hd, pol = _hits("hit_density", {"epoch": 50}, reqs, 40)
    assert lru == 0
    # once learned (a few epochs), about 40 / 50 of the returns hit; ghost_lru cannot (no page is
    # ever proven before its only return)
    assert hd > 0.5 * returns
    assert _hits("ghost_lru", None, reqs, 40)[0] < 0.05 * returns
    # a single-page request's page is its last page: that class keeps a share long, the rest not
    last = pol.classes
    assert 0.5 < pol._mix[last] < 1 and pol._long[last] >= 100 > pol.retention[last]


def test_proven_pages_get_the_longer_retention_under_a_scan():
    reqs = _hot_set_under_a_scan()
    lru, _ = _hits("lru", None, reqs, 40)
    hd, pol = _hits("hit_density", {"epoch": 50, "classes": 2}, reqs, 40)
    assert lru == 0
    assert hd > len(reqs) // 8
    assert pol.retention[1] >= 80 and pol.retention[0] < pol.retention[1]


@pytest.mark.parametrize("semantics", ["rules", "sglang"])
def test_runs_under_both_semantics_in_the_replay_cache(semantics):
    reqs = _late_returns(1200)
    t = TieredCache(CountingMover(40), policy=make_policy("hit_density", {"epoch": 50}), hierarchical=False,
                    semantics=semantics)
    hits = sum(t.serve(keys, i) for i, keys in enumerate(reqs))
    t.check_invariants()
    assert t.size <= 40 and hits > 0


def test_starts_as_lru():
    """Before its first reconfiguration every retention age is 0: the key is last_access."""
    reqs = [[f"a{i}", f"b{i}"] for i in range(30)]
    lru, _ = _hits("lru", None, reqs, 10)
    hd, pol = _hits("hit_density", {"epoch": 1000}, reqs, 10)
    assert hd == lru and pol.retention == [0] * (pol.classes + 2)


def test_config_keys_are_checked():
    assert validate_policy_config("hit_density", {"classes": 2, "epoch": 10, "decay": 0.5, "horizon": 4}) == []
    errs = validate_policy_config("hit_density", {"alpha": 1, "classes": 0, "decay": 1.0, "epoch": 2.5})
    assert len(errs) == 4
    assert any("unknown key 'alpha'" in e and "'hit_density'" in e and "'horizon'" in e for e in errs)
    assert any("'classes'" in e and "[1, 16]" in e for e in errs)
    assert any("'decay'" in e and "(0, 1)" in e for e in errs)
    assert any("'epoch'" in e and "integer" in e for e in errs)
    assert "hit_density" in choices("RADIX_EVICTION_POLICY")


def test_is_deterministic_across_processes():
    """The request hash that picks the long-kept share must not depend on PYTHONHASHSEED."""
    code = ("from tests.cache.test_hit_density import _hits, _late_returns;"
            "print(_hits('hit_density', {'epoch': 50}, _late_returns(800), 40)[0])")
    same_output_under_two_hash_seeds(code)


@pytest.mark.parametrize("semantics, expected", [("rules", 0), ("sglang", 7)])
def test_last_page_leaf_is_ranked_by_its_engine_node(semantics, expected):
    """A request's last page is rarely read again (a trace's partial last block), but under
    sglang semantics the engine evicts the whole node it ends, so the leaf takes the
    retention of the page above it in that node."""
    pol = make_policy("hit_density", {"epoch": 1000})
    t = RadixTree(None, pol, semantics=semantics)
    t.serve(["a", "b", "c"], 0)
    last = pol.classes                     # class of a request's last, newly read page
    pol.core._ttl = [7] * (pol.classes + 2)
    pol.core._ttl[last] = 0
    pol.core.generation += 1               # ages changed (the memo of the sglang keys knows it)
    leaf = t.root.children["a"].children["b"].children["c"]
    key = pol.key(leaf)
    if semantics == "sglang":              # the engine's (priority, last access) order
        assert key[1] == leaf.last_access
        key = key[0]
    assert key - leaf.last_access == expected


def test_capacity_in_pages_is_converted_to_keys_for_weighted_units():
    """With several pages per key (page 16 on a 512-token-block trace) the counters count keys
    and the capacity counts pages: the policy tracks keys per page to compare them."""
    pol = make_policy("hit_density", {"epoch": 1000})
    t = RadixTree(100, pol)
    for i in range(5):
        t.serve([f"s{i}", f"t{i}", f"u{i}"], i, weights=[4, 4, 3])
    assert pol._units == 15 and pol._pages == 55
