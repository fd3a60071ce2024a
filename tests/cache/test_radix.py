"""Radix tree: API behaviour, invariants under random operations, naive cross-check."""
import random

import pytest
from hypothesis import given, settings, strategies as st

from sglang_hydra.cache import RadixTree, block_page_keys, chained_page_keys, make_policy
from sglang_hydra.cache.movers import CountingMover
from sglang_hydra.cache.radix import block_page_weights
from sglang_hydra.cache.tiered import TieredCache
from naive import naive_replay


def chains_from_paths(paths):
    """Turn lists of small branch labels into prefix-unique page keys (tuples of labels)."""
    return [[tuple(p[: j + 1]) for j in range(len(p))] for p in paths]


def test_match_insert_and_sizes():
    t = RadixTree(capacity=10)
    assert t.match_prefix([1, 2, 3]).length == 0
    k, node = t.insert([1, 2, 3])
    assert k == 0 and t.size == 3 and node.key == 3 and node.depth == 2
    m = t.match_prefix([1, 2, 9])
    assert m.length == 2 and m.last_node.key == 2
    k, _ = t.insert([1, 2, 4, 5])
    assert k == 2 and t.size == 5
    assert sorted(n.key for n in t.evictable_leaves()) == [3, 5]
    assert t.match_prefix([1, 2, 4, 5]).last_node.path_keys() == [1, 2, 4, 5]
    t.check_invariants()


def test_lock_ref_protects_and_accounts():
    t = RadixTree(capacity=None)
    _, a = t.insert([1, 2, 3])
    _, b = t.insert([1, 2, 4])
    assert t.inc_lock_ref(a) == -3 and t.protected_size == 3 and t.evictable_size == 1
    assert t.inc_lock_ref(b) == -1 and t.protected_size == 4
    assert t.evict(10) == 0
    assert t.dec_lock_ref(b) == 1
    assert t.evict(10) == 1          # only page 4 is an unlocked leaf
    assert t.match_prefix([1, 2, 4]).length == 2
    t.dec_lock_ref(a)
    assert t.evict(10) == 3 and t.size == 0
    with pytest.raises(RuntimeError):
        t.dec_lock_ref(a)
    t.check_invariants()


def test_serve_pins_current_request():
    t = RadixTree(capacity=2)
    assert t.serve([1, 2, 3], clock=0) == 0
    # the request itself is larger than the capacity: nothing of it may be evicted
    assert t.size == 3
    assert t.serve([7], clock=1) == 0
    assert t.size == 2 and t.match_prefix([1, 2, 3]).length == 1
    t.check_invariants()


def test_leaf_only_eviction_order_lru():
    t = RadixTree(capacity=4)
    t.serve([1, 2], 0)
    t.serve([1, 3], 1)
    t.serve([1, 2], 2)       # touches 1 and 2
    t.serve([5, 6], 3)       # 5 pages > 4: evict the LRU leaf, which is 3
    assert t.match_prefix([1, 3]).length == 1
    assert t.match_prefix([1, 2]).length == 2


def test_chained_page_keys():
    a = chained_page_keys(list(range(10)), 4)
    b = chained_page_keys(list(range(8)) + [99, 98], 4)
    assert len(a) == 2 and a == b                       # partial page dropped
    c = chained_page_keys([9] + list(range(1, 8)), 4)
    assert c[0] != a[0] and c[1] != a[1]                 # a different first page changes all
    assert chained_page_keys([], 4) == []
    with pytest.raises(ValueError):
        chained_page_keys([1], 0)


def test_block_page_keys_split_and_group():
    assert block_page_keys([7, 8], 600, 512) == [7, 8]
    # 512/128 = 4 sub-pages per block; last block holds 88 tokens -> 1 page
    assert block_page_keys([7, 8], 600, 128) == [28, 29, 30, 31, 32]
    assert block_page_keys([7, 8, 9], 1100, 1024) == [8, 9]
    with pytest.raises(ValueError):
        block_page_keys([1], 100, 300)


path_st = st.lists(st.integers(0, 2), min_size=0, max_size=6)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["serve", "lock", "unlock", "evict", "match"]),
                              path_st, st.integers(0, 5)), max_size=40),
       capacity=st.integers(0, 12),
       policy=st.sampled_from(["lru", "lfu", "fifo", "slru", "priority", "ghost_lru", "ghost_lfu",
                              "auto_ghost_lfu", "hit_density"]))
def test_invariants_under_random_operations(ops, capacity, policy):
    t = RadixTree(capacity, make_policy(policy))
    locks = []
    for clock, (op, path, extra) in enumerate(ops, start=1):
        keys = [tuple(path[: j + 1]) for j in range(len(path))]
        if op == "serve":
            t.serve(keys, clock, priority=extra)
            if t.size > capacity:
                # only possible when everything left is pinned by locks or this request
                leaves = t.evictable_leaves()
                assert all(n.key in set(keys) for n in leaves)
        elif op == "lock" and keys:
            _, node = t.insert(keys, clock)
            t.inc_lock_ref(node)
            locks.append(node)
        elif op == "unlock" and locks:
            t.dec_lock_ref(locks.pop(extra % len(locks)))
        elif op == "evict":
            before = t.size
            got = t.evict(extra)
            assert t.size == before - got
        elif op == "match":
            t.match_prefix(keys, clock)
        t.check_invariants()
        cached = {n.key for n in t.iter_nodes()}
        # prefix closure: every cached page's prefix is cached
        for key in cached:
            assert all(key[:j] in cached for j in range(1, len(key)))
        # locked pages are never evicted
        for node in locks:
            assert node.parent is not None and node.key in cached


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "belady", "slru", "priority", "tlru"])
def test_matches_naive_simulator(policy):
    rng = random.Random(policy)
    paths = []
    for _ in range(300):
        depth = rng.randint(1, 7)
        paths.append([rng.choice([0, 0, 1, 2]) for _ in range(depth)])
    chains = chains_from_paths(paths)
    prios = [rng.randint(0, 2) for _ in chains]
    for cap in (3, 8, 15):
        kw = {}
        cfg = None
        if policy == "tlru":
            cfg = {"threshold": 4 * 512, "next_prompt_estimate": 1 * 512}
            kw["tlru"] = (4, 1)
        expect = naive_replay(chains, cap, policy, priorities=prios, **kw)
        # the bare tree, and the cache every replay runs (TieredCache, one tier); a device
        # cannot hold a request larger than itself (TieredCache keeps its leading pages),
        # the rules (§8: every request fits) keep it whole, so that case is the tree's only
        builds = [lambda pol: RadixTree(cap, pol)]
        if max(map(len, chains)) <= cap:
            builds.append(lambda pol: TieredCache(CountingMover(cap), policy=pol, page_size=512,
                                                  hierarchical=False))
        for build in builds:
            pol = make_policy(policy, cfg, page_size=512)
            t = build(pol)
            if pol.needs_future:
                pol.prepare(chains)
            got = [t.serve(c, i, prios[i] if policy == "priority" else 0)
                   for i, c in enumerate(chains)]
            assert got == expect, (type(t).__name__, policy, cap)
            t.check_invariants()


# ------------------------------------------------------------ weighted nodes
def test_weighted_units_split_and_accounting():
    t = RadixTree(capacity=None)
    assert t.serve(["a", "b"], 0, weights=[4, 4]) == 0
    assert t.size == 8 and t.num_nodes == 2
    # a shorter last unit matches inside "b": the node is split, only 2 pages touched
    assert t.serve(["a", "b"], 1, weights=[4, 2]) == 6
    assert t.num_nodes == 3 and t.size == 8
    up = t.root.children["a"].children["b"]
    assert (up.lo, up.weight, up.last_access) == (0, 2, 1)
    assert (up.children["b"].lo, up.children["b"].weight, up.children["b"].last_access) == (2, 2, 0)
    t.check_invariants()
    # a longer unit continues the partial run, then grows
    t2 = RadixTree(capacity=None)
    t2.serve(["a", "b"], 0, weights=[4, 1])
    assert t2.serve(["a", "b", "c"], 1, weights=[4, 4, 3]) == 5
    assert t2.size == 11 and t2.match_prefix(["a", "b", "c"], weights=[4, 4, 3]).length == 11
    t2.check_invariants()
    with pytest.raises(ValueError):
        t2.serve(["a"], 2, weights=[0])


def test_weighted_locks_and_whole_leaf_eviction():
    t = RadixTree(capacity=None)
    _, a = t.insert(["x", "y"], weights=[3, 5])
    assert t.inc_lock_ref(a) == -8 and t.protected_size == 8
    # splitting a locked node keeps the lock on both halves
    assert t.match_prefix(["x", "y"], weights=[3, 2]).length == 5
    t.check_invariants()
    assert t.evict(1) == 0
    assert t.dec_lock_ref(a) == 8
    assert t.evict(1) == 3              # the whole leaf run y[2:5] goes at once
    assert t.size == 5 and t.evictions == 3 and t.evicted_nodes == 1
    t.check_invariants()


def test_weighted_serve_respects_capacity():
    t = RadixTree(capacity=10)
    t.serve(["a", "b"], 0, weights=[4, 4])
    t.serve(["c"], 1, weights=[4])        # 12 > 10: leaf b (4 pages) goes, not a
    assert t.size == 8 and t.evictions == 4
    assert t.match_prefix(["a", "b"], weights=[4, 4]).length == 4
    t.check_invariants()


def test_block_page_weights_match_keys():
    for ids, length, ps in [([7, 8], 600, 128), ([7, 8, 9], 1100, 1), ([5], 512, 16),
                            ([5, 6], 1024, 64), ([1, 2], 513, 1)]:
        w = block_page_weights(ids, length, ps)
        assert sum(w) == len(block_page_keys(ids, length, ps))
        assert w[:-1] == [512 // ps] * (len(ids) - 1)
    assert block_page_weights([], 0, 16) == []
    with pytest.raises(ValueError):
        block_page_weights([1], 10, 300)


weighted_ops = st.lists(
    st.tuples(st.sampled_from(["serve", "lock", "unlock", "evict", "match", "insert"]),
              st.lists(st.tuples(st.integers(0, 2), st.integers(1, 4)), max_size=5),
              st.integers(0, 8)),
    max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=weighted_ops, capacity=st.integers(0, 25),
       policy=st.sampled_from(["lru", "lfu", "fifo", "slru", "priority", "ghost_lru", "ghost_lfu",
                              "auto_ghost_lfu", "hit_density"]))
def test_weighted_invariants_under_random_operations(ops, capacity, policy):
    """Units with random page counts: a unit's key names its prefix, and only a request's
    last unit may hold fewer pages than a full one, as a trace's partial last block does."""
    t = RadixTree(capacity, make_policy(policy))
    locks = []
    for clock, (op, path, extra) in enumerate(ops, start=1):
        keys = [tuple(p for p, _ in path[: j + 1]) for j in range(len(path))]
        # As in a trace, only a request's last unit may be partial; earlier ones are full (4 pages).
        weights = [4] * (len(path) - 1) + [w for _, w in path[-1:]]
        request_pages = {(key, p) for key, w in zip(keys, weights) for p in range(w)}
        before_pages = t.cached_pages()
        if op == "serve":
            # hits = longest cached page prefix, in pages
            expect = 0
            for key, w in zip(keys, weights):
                run = 0
                while run < w and (key, run) in before_pages:
                    run += 1
                expect += run
                if run < w:
                    break
            assert t.serve(keys, clock, priority=extra, weights=weights) == expect
            assert request_pages <= t.cached_pages()       # the request is pinned
            if t.size > capacity:
                leaves = t.evictable_leaves()
                assert all((n.key, n.lo) in request_pages for n in leaves)
        elif op == "lock" and keys:
            _, node = t.insert(keys, clock, weights=weights)
            t.inc_lock_ref(node)
            locks.append((node, request_pages))
        elif op == "unlock" and locks:
            t.dec_lock_ref(locks.pop(extra % len(locks))[0])
        elif op == "evict":
            before = t.size
            got = t.evict(extra)
            assert t.size == before - got
            assert got >= min(extra, got + t.evictable_size) or not t.evictable_leaves()
        elif op == "match":
            m = t.match_prefix(keys, clock, weights=weights)
            assert m.last_node.depth + 1 == m.length
        elif op == "insert":
            t.insert(keys, clock, weights=weights)
        t.check_invariants()
        cached = t.cached_pages()
        # prefix closure, in pages: page p of a unit needs pages < p and the parent unit
        for key, p in cached:
            if p:
                assert (key, p - 1) in cached
            elif len(key) > 1:
                assert (key[:-1], 0) in cached
        for _, pages in locks:
            assert pages <= cached


@pytest.mark.parametrize("policy", ["lru", "lfu", "fifo", "belady", "slru", "priority", "tlru"])
def test_weight_one_units_equal_page_keys(policy):
    """Weighted API with all weights 1 is the page-granular tree (same hits)."""
    rng = random.Random(policy + "w")
    chains = chains_from_paths([[rng.choice([0, 0, 1, 2]) for _ in range(rng.randint(1, 7))]
                                for _ in range(200)])
    cfg = {"threshold": 4 * 512, "next_prompt_estimate": 512} if policy == "tlru" else None
    got = []
    for weighted in (False, True):
        pol = make_policy(policy, cfg, page_size=512)
        t = RadixTree(8, pol)
        if pol.needs_future:
            pol.prepare(chains)
        got.append([t.serve(c, i, weights=[1] * len(c) if weighted else None)
                    for i, c in enumerate(chains)])
    assert got[0] == got[1]


def test_unbounded_weighted_equals_page_granular():
    """Without eviction, one node per unit gives exactly the per-page hits."""
    rng = random.Random(7)
    t_pages = RadixTree(None)
    t_units = RadixTree(None)
    for i in range(300):
        path = [rng.choice([0, 0, 1, 2]) for _ in range(rng.randint(1, 6))]
        keys = [tuple(path[: j + 1]) for j in range(len(path))]
        weights = [4] * (len(keys) - 1) + [rng.randint(1, 4)]
        pages = [(key, p) for key, w in zip(keys, weights) for p in range(w)]
        assert t_units.serve(keys, i, weights=weights) == t_pages.serve(pages, i)
    t_units.check_invariants()
    assert t_units.size == t_pages.size and t_units.num_nodes < t_pages.num_nodes


# ------------------------------------------------------------ sglang semantics
def test_sglang_semantics_evicts_whole_engine_nodes():
    """One insert is one engine node: evicting it frees every page it brought, even when
    fewer are needed (the rules evict page by page)."""
    engine = RadixTree(capacity=6, semantics="sglang")
    rules = RadixTree(capacity=6)
    for t in (engine, rules):
        t.serve([1, 2, 3, 4], 0)
        t.serve([9, 8], 1)
    # 3 new pages need 3 freed: rules drop pages 4, 3 and 2, the engine all of 1..4
    assert engine.serve([7, 6, 5], 2) == 0 and rules.serve([7, 6, 5], 2) == 0
    assert engine.size == 5 and rules.size == 6
    assert engine.serve([1, 2], 3) == 0 and rules.serve([1, 2], 3) == 1
    engine.check_invariants()


def test_sglang_semantics_split_where_a_match_ends():
    """A match that ends inside an engine node splits it; the upper part becomes a node of
    its own (fresh stamps), the lower part keeps the old node's creation stamp."""
    t = RadixTree(capacity=None, semantics="sglang")
    t.serve([1, 2, 3, 4], 0)
    n4 = t.root.children[1].children[2].children[3].children[4]
    created = n4.insert_time
    assert t.serve([1, 2, 5], 1) == 2
    n2 = t.root.children[1].children[2]
    assert n2.seg != n4.seg and n2.seg == t.root.children[1].seg
    assert n4.insert_time == created and n2.insert_time > created
    # the pages of one engine node share their statistics (hits are counted at insert)
    assert n2.hit_count == 2 and n4.hit_count == 1
    t.check_invariants()


def test_sglang_semantics_is_one_tier_only():
    with pytest.raises(ValueError, match="cache_semantics=sglang"):
        TieredCache(CountingMover(10, 10), policy=make_policy("lru"), semantics="sglang")
    with pytest.raises(ValueError, match="unknown cache semantics"):
        RadixTree(10, semantics="engine")


@pytest.mark.parametrize("policy", ["lru", "lfu", "slru", "priority", "span_lru", "ghost_lru", "ghost_lfu",
                                    "auto_ghost_lfu", "hit_density"])
def test_sglang_semantics_invariants_under_random_requests(policy):
    """Structure, sizes and locks stay consistent; the tree never exceeds its capacity when
    every request fits; whole-segment eviction never frees a page of the current request."""
    rng = random.Random(f"sglang-{policy}")
    for weighted in (False, True):
        t = TieredCache(CountingMover(40), policy=make_policy(policy), hierarchical=False, semantics="sglang")
        for i in range(400):
            path = [rng.choice([0, 0, 1, 2, 3]) for _ in range(rng.randint(1, 9))]
            keys = [tuple(path[: j + 1]) for j in range(len(path))]
            weights = [rng.randint(1, 4) for _ in keys] if weighted else None
            total = len(keys) if weights is None else sum(weights)
            k = t.serve(keys, i, rng.randint(0, 2), weights)
            assert 0 <= k <= total
            t.check_invariants()
            assert t.size <= 40 and t.protected_size == 0
            # the request just served is cached whole
            assert t._walk(keys, weights, 0, False)[0] == total
