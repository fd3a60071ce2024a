"""Replay metrics on small hand-checked workloads."""
import json

import pytest

from sglang_hydra.config.testing import make_record
from sglang_hydra.workload import Request, load_trace, replay
from sglang_hydra.workload.metrics import hits_by_depth, nearest_rank, tail_stats


def req(ids, length=None, ts=0):
    length = 512 * len(ids) if length is None else length
    return Request(ts, length, 10, tuple(ids))


def test_nearest_rank():
    vals = list(range(1, 11))
    assert nearest_rank(vals, 0.5) == 5
    assert nearest_rank(vals, 0.9) == 9       # ceil(9.000000000000002) would give 10
    assert nearest_rank(vals, 0.99) == 10
    assert nearest_rank([], 0.5) == 0
    with pytest.raises(ValueError):
        nearest_rank(vals, 0)


def test_hits_by_depth_and_tail():
    assert hits_by_depth([0, 1, 3, 5]) == {"0": 3, "1": 2, "2-3": 3, "4-7": 1}
    assert hits_by_depth([0, 0]) == {}
    assert tail_stats([0, 10, 20], 10) == {"frac_gt": 1 / 3, "mean_excess": 10 / 3}


def test_small_replay_metrics():
    reqs = [req([1, 2], 700), req([1, 2, 3], 1200), req([1, 4], 600), req([9])]
    rec = make_record(page_size=512, max_total_tokens=100 * 512)
    res = replay(rec, reqs, tail_threshold_tokens=500)
    # hits: 0, 2 (1,2 full blocks), 1, 0
    assert res.hit_blocks == 3 and res.lookup_blocks == 8
    assert res.hit_tokens == 0 + 1024 + 512 + 0
    unc = sorted([700, 1200 - 1024, 600 - 512, 512])
    assert res.uncached_tokens_p50 == unc[1] and res.uncached_tokens_p99 == unc[-1]
    assert res.frac_uncached_gt_threshold == 0.5
    assert res.mean_excess_over_threshold == pytest.approx((200 + 12) / 4)
    assert sum(res.hits_by_depth.values()) == res.hit_pages
    json.dumps(res.to_dict())
    assert "per_request_hit_pages" not in res.to_dict()


def test_full_hit_on_partial_block_counts_block():
    reqs = [req([1, 2], 700), req([1, 2], 700)]
    res = replay(make_record(page_size=512, max_total_tokens=10 * 512), reqs)
    assert res.hit_blocks == 2 and res.hit_tokens == 700


def test_disabled_cache_and_max_requests():
    tr = load_trace(max_requests=200)
    rec = make_record(page_size=512, max_total_tokens=1000 * 512, disable_radix_cache=True)
    res = replay(rec, tr, max_requests=50)
    assert res.requests == 50 and res.hit_blocks == 0 and res.radix_cache_disabled


def test_record_policy_and_config_are_used():
    tr = load_trace(max_requests=400)
    rec = make_record(page_size=512, max_total_tokens=300 * 512, radix_eviction_policy="tlru",
                      radix_eviction_policy_config={"threshold": 8192, "next_prompt_estimate": 512})
    res = replay(rec, tr)
    assert res.policy == "tlru" and res.policy_config["threshold"] == 8192
    assert res.evictions > 0


def test_smaller_pages_split_blocks():
    tr = load_trace(max_requests=300)
    r512 = replay(make_record(page_size=512, max_total_tokens=800 * 512), tr)
    r64 = replay(make_record(page_size=64, max_total_tokens=800 * 512), tr,
                 keep_per_request=True)
    assert r64.capacity_pages == 800 * 8
    assert r64.lookup_pages > 7 * r512.lookup_pages
    assert r64.lookup_blocks == r512.lookup_blocks
    # same token capacity: finer pages never lose whole-block hits on this prefix
    assert abs(r64.block_hit_rate - r512.block_hit_rate) < 0.05
    assert len(r64.per_request_hit_pages) == 300


def test_bad_arguments():
    rec = make_record(page_size=512, max_total_tokens=512)
    with pytest.raises(ValueError, match="mode"):
        replay(rec, [], mode="full")
    with pytest.raises(ValueError, match="unknown eviction policy"):
        replay(rec, [], policy="nope")
    with pytest.raises(ValueError, match="'foo'"):
        replay(rec, [], policy="slru", policy_config={"foo": 1})
    empty = replay(rec, [])
    assert empty.requests == 0 and empty.block_hit_rate == 0.0


def test_progress_bar(capsys):
    tr = load_trace(max_requests=50)
    res = replay(make_record(page_size=512, max_total_tokens=100 * 512), tr, progress=True)
    assert res.requests == 50
    assert "simulate" in capsys.readouterr().err


def test_small_pages_use_weighted_nodes_and_match_page_tree():
    """Unbounded, one node per block gives exactly the per-page tree's hits."""
    from sglang_hydra.cache import RadixTree, block_page_keys

    tr = load_trace(max_requests=300)
    res = replay(make_record(page_size=64), tr, keep_per_request=True)
    tree = RadixTree(None)
    expect = [tree.serve(block_page_keys(r.hash_ids, r.input_length, 64), i)
              for i, r in enumerate(tr.requests[:300])]
    assert res.per_request_hit_pages == expect
    assert res.lookup_pages == sum(len(block_page_keys(r.hash_ids, r.input_length, 64))
                                   for r in tr.requests[:300])
    assert res.evictions == 0


def test_page_size_one_sample_is_consistent():
    tr = load_trace()
    res = replay(make_record(page_size=1), tr)
    assert res.requests == len(tr)
    assert res.hit_tokens == res.hit_pages and res.lookup_pages == res.input_tokens
    bounded = replay(make_record(page_size=1, max_total_tokens=2000 * 512), tr)
    assert bounded.evictions > 0 and bounded.hit_pages <= res.hit_pages
    for policy in ("lfu", "tlru", "belady", "ghost_lru"):
        cfg = {"threshold": 8192, "next_prompt_estimate": 512} if policy == "tlru" else None
        r = replay(make_record(page_size=16, max_total_tokens=2000 * 512), tr, policy=policy,
                   policy_config=cfg)
        assert 0 < r.hit_pages <= res.hit_pages
