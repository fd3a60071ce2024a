"""One tree, two movers: the byte-free replay and the real-bytes replay count the same pages.

Every test replays the same requests with ``mover="count"`` and ``mover="bytes"`` (model
``tiny``) and compares every per-tier page count and every per-request token split; the
real-bytes run also checks each page it loaded back against the bytes it was written with.
"""
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_hydra.config.testing import make_record
from sglang_hydra.workload.trace import Request
from sglang_hydra.workload.tiered_replay import tiered_replay

PS = 16
BLOCK = 64            # 4 pages per trace block keeps real-bytes runs small


def conversation_trace(seed, n=60, max_blocks=6, step_ms=500):
    """Requests whose block ids name whole prefixes (a later turn extends an earlier one,
    or a new conversation starts), with partial last blocks and shared timestamps."""
    rng = random.Random(seed)
    chains = []
    next_id = 0
    out = []
    t = 0
    for _ in range(n):
        if chains and rng.random() < 0.7:
            base = list(rng.choice(chains))
            base = base[:rng.randint(1, len(base))]
        else:
            base = []
        extra = rng.randint(0 if base else 1, 3)
        ids = base + list(range(next_id, next_id + extra))
        next_id += extra
        ids = ids[:max_blocks]
        chains.append(ids)
        length = (len(ids) - 1) * BLOCK + rng.randint(1, BLOCK)
        if rng.random() < 0.5:
            t += rng.randint(1, step_ms)
        out.append(Request(timestamp=float(t), input_length=length, output_length=1, hash_ids=tuple(ids)))
    return out


class FakeTimeline:
    """An engine that prefills uncached tokens at a fixed rate, one request at a time."""

    def __init__(self, seconds_per_token=2e-5):
        self.s = seconds_per_token
        self.free_at = 0.0

    def start_time(self, arrival_s):
        return max(arrival_s, self.free_at)

    def serve(self, arrival_s, input_tokens, device_hit_tokens, host_hit_tokens, storage_hit_tokens,
              storage_wait_s=0.0):
        start = self.start_time(arrival_s)
        uncached = input_tokens - device_hit_tokens - host_hit_tokens - storage_hit_tokens
        self.free_at = start + storage_wait_s + uncached * self.s + 1e-3
        return self.free_at - arrival_s


def record(tmp_path=None, *, wp="write_through", storage=None, policy="lru", dev_pages=24, ratio=2.0,
           prefetch="best_effort", policy_config=None, hicache=True, host_mode="cache"):
    kw = dict(model_path="tiny", max_total_tokens=dev_pages * PS, page_size=PS,
              radix_eviction_policy=policy)
    if policy_config is not None:
        kw["radix_eviction_policy_config"] = policy_config
    if hicache:
        kw.update(enable_hierarchical_cache=True, hicache_ratio=ratio, hicache_write_policy=wp,
                  hicache_host_memory_mode=host_mode)
    if storage:
        extra = {"prefetch_threshold": PS}
        if storage == "file":
            extra["file_storage_path"] = str(tmp_path / "l3")
        kw.update(hicache_storage_backend=storage, hicache_storage_prefetch_policy=prefetch,
                  hicache_storage_backend_extra_config=json.dumps(extra))
    return make_record(**kw)


def both(rec, reqs, *, timeline_factory=None, **kw):
    sim = tiered_replay(rec, reqs, mover="count", block_size=BLOCK,
                        timeline=timeline_factory() if timeline_factory else None, **kw)
    full = tiered_replay(rec, reqs, mover="bytes", block_size=BLOCK,
                         timeline=timeline_factory() if timeline_factory else None, **kw)
    return sim, full


def assert_identical(sim, full):
    assert sim.mode == "sim" and full.mode == "full"
    assert sim.device_pages == full.device_pages and sim.host_pages == full.host_pages
    assert sim.tier_counts() == full.tier_counts()
    for name in ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens", "uncached_tokens", "ttft_s"):
        assert getattr(sim, name) == getattr(full, name), name
    assert full.verify_mismatch_pages == 0


@pytest.mark.parametrize("wp", ["write_through", "write_through_selective", "write_back"])
@pytest.mark.parametrize("storage", [None, "file"])
def test_write_policies_with_and_without_storage(tmp_path, wp, storage):
    reqs = conversation_trace(1)
    sim, full = both(record(tmp_path, wp=wp, storage=storage), reqs)
    assert_identical(sim, full)
    c = sim.counts
    assert c["device_evicted_pages"] > 0 and c["host_written_pages"] > 0
    assert c["host_hit_pages"] > 0 or c["storage_hit_pages"] > 0
    if storage:
        assert c["storage_written_pages"] > 0
        assert full.bytes_moved["storage_write"] == c["storage_written_pages"] * full.page_bytes
        if wp == "write_through":
            assert c["storage_hit_pages"] > 0
    assert full.verified_pages > 0


@pytest.mark.parametrize("policy,cfg", [("lfu", None), ("slru", None), ("priority", None), ("fifo", None),
                                        ("ghost_lru", None), ("belady", None),
                                        ("tlru", {"threshold": 64, "next_prompt_estimate": 16})])
def test_every_policy_counts_the_same_in_both_movers(tmp_path, policy, cfg):
    reqs = conversation_trace(2)
    rec = record(tmp_path, wp="write_through_selective", storage="sim")
    sim, full = both(rec, reqs, policy=policy, policy_config=cfg)
    assert_identical(sim, full)
    assert sim.counts["device_evicted_pages"] > 0


@pytest.mark.parametrize("prefetch", ["best_effort", "wait_complete", "timeout"])
def test_prefetch_policies_under_a_timeline_and_a_storage_bandwidth(tmp_path, prefetch):
    reqs = conversation_trace(3, n=80)
    rec = record(tmp_path, wp="write_through", storage="file", prefetch=prefetch, dev_pages=16, ratio=1.0)
    page_bytes = 16 * 256            # tiny: 256 bytes of KV per token
    rate = page_bytes * 200          # 200 pages/s: some prefetches are still running at admission
    sim, full = both(rec, reqs, timeline_factory=FakeTimeline, storage_read_bytes_per_s=rate)
    assert_identical(sim, full)
    assert sim.ttft_s is not None and all(t > 0 for t in sim.ttft_s)
    if prefetch == "wait_complete":
        assert sim.storage_wait_s_total > 0 and sim.counts["prefetch_terminated"] == 0
    if prefetch == "best_effort":
        assert sim.storage_wait_s_total == 0


def test_buffer_only_host_mode(tmp_path):
    rec = record(tmp_path, wp="write_through", storage="sim", host_mode="buffer_only")
    sim, full = both(rec, conversation_trace(4))
    assert_identical(sim, full)
    assert sim.counts["storage_hit_pages"] > 0 and sim.counts["host_hit_pages"] == 0


def test_hicache_off_counts_the_same(tmp_path):
    sim, full = both(record(tmp_path, hicache=False), conversation_trace(5))
    assert_identical(sim, full)
    assert sim.counts["host_written_pages"] == 0 and sim.hit_pages["host"] == 0


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), wp=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
       storage=st.sampled_from([None, "sim"]), policy=st.sampled_from(["lru", "lfu", "slru", "ghost_lru"]),
       dev_pages=st.integers(8, 40), ratio=st.sampled_from([1.0, 2.0, 3.0]),
       prefetch=st.sampled_from(["best_effort", "wait_complete", "timeout"]), bandwidth=st.booleans())
def test_random_traces_count_identically(tmp_path, seed, wp, storage, policy, dev_pages, ratio, prefetch, bandwidth):
    reqs = conversation_trace(seed, n=40)
    rec = record(tmp_path, wp=wp, storage=storage, policy=policy, dev_pages=dev_pages, ratio=ratio,
                 prefetch=prefetch)
    rate = 16 * 256 * 300 if bandwidth else None
    sim, full = both(rec, reqs, timeline_factory=FakeTimeline if bandwidth else None,
                     storage_read_bytes_per_s=rate)
    assert_identical(sim, full)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), wp=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
       storage=st.booleans(), buffer_only=st.booleans(), dev=st.integers(4, 30), host=st.integers(0, 40),
       policy=st.sampled_from(["lru", "lfu", "slru", "ghost_lru", "fifo"]))
def test_tree_invariants_hold_after_every_request(seed, wp, storage, buffer_only, dev, host, policy):
    """Device set prefix-closed, device-child counts, page totals within the tiers, no lock
    left behind - after every admission, also with prefetches in flight."""
    from sglang_hydra.cache.movers import CountingMover
    from sglang_hydra.cache.policies import make_policy
    from sglang_hydra.cache.radix import block_page_weights
    from sglang_hydra.cache.tiered import TieredCache

    buffer_only = buffer_only and storage and host > 0
    cache = TieredCache(CountingMover(dev, host, has_storage=storage, page_bytes=4096), policy=make_policy(policy),
                        page_size=PS, write_policy=wp, host_mode="buffer_only" if buffer_only else "cache",
                        prefetch_threshold=PS, storage_read_bytes_per_s=4096 * 50 if seed % 2 else None)
    reqs = conversation_trace(seed, n=50)
    waiting = []
    for i, r in enumerate(reqs):
        cache.arrive(i, r.hash_ids, block_page_weights(r.hash_ids, r.input_length, PS, BLOCK), r.timestamp / 1000)
        waiting.append(i)
        if i % 3 == 2 or i == len(reqs) - 1:          # admit in small groups: prefetches wait
            while waiting:
                cache.scheduling_pass(waiting, r.timestamp / 1000)
                adm = cache.admit(waiting.pop(0), clock=i, now_s=r.timestamp / 1000)
                assert adm.hit_pages <= adm.lookup_pages
                cache.check_invariants()
