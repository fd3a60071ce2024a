"""One tree, two movers: the byte-free simulation and the real-bytes one count the same pages.

Every test runs the same requests through the deployment simulation (one engine, model
``tiny`` timed on an H100 preset) with the counting mover (``job.mode=sim``) and the real-bytes
mover (``job.mode=full``) and compares every per-tier page count, every per-request token split
and every TTFT; the real-bytes run also checks each page it loaded back against the bytes it was
written with.
"""
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_hydra.config.hardware import compose_hardware
from sglang_hydra.config.testing import make_record
from sglang_hydra.workload.assemble import TIER_COUNT_KEYS, DeploymentInputs, build_deployment
from sglang_hydra.workload.deployment import simulate
from sglang_hydra.workload.trace import Request

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


class Outcome:
    """One simulation's cache-side results (summed over its one engine)."""

    def __init__(self, mode, result, built):
        self.mode = mode
        engine = result.engines["agg"][0]
        cache = engine.cache
        self.device_pages, self.host_pages = cache.device_pages, cache.host_pages
        self.counts = dict(cache.counts)
        self.page_bytes = cache.page_bytes
        reqs = result.requests
        self.device_hit_tokens = [s.device_hit for s in reqs]
        self.host_hit_tokens = [s.host_hit for s in reqs]
        self.storage_hit_tokens = [s.storage_hit for s in reqs]
        self.uncached_tokens = [s.input_len - s.device_hit - s.host_hit - s.storage_hit for s in reqs]
        self.ttft_s = [s.first_token_s - s.arrival_s for s in reqs]
        self.storage_wait_s_total = sum(s.storage_wait_s for s in reqs)
        self.hit_pages = {"device": self.counts["device_hit_pages"], "host": self.counts["host_hit_pages"],
                          "storage": self.counts["storage_hit_pages"]}
        self.bytes_moved, self.verified_pages, self.verify_mismatch_pages = {}, 0, 0
        for mover in built.byte_movers:
            for d in ("d2h", "h2d", "storage_write", "storage_read"):
                self.bytes_moved[d] = mover.meter.bytes(d)
            self.verified_pages = mover.stats["verified_pages"]
            self.verify_mismatch_pages = mover.stats["verify_mismatch_pages"]

    def tier_counts(self):
        return {k: self.counts.get(k, 0) for k in TIER_COUNT_KEYS}


def both(rec, reqs, *, policy=None, policy_config=None, storage_read_bytes_per_s=None):
    """The deployment simulation of ``rec`` on one engine, with the counting mover (``job.mode=sim``)
    and with real bytes (``job.mode=full``): same loop, same decisions, different mover."""
    settings = [("gpus_per_node", 1, "test"), ("host_memory_gb", 16, "test")]
    if storage_read_bytes_per_s:
        settings.append(("storage_read_gbps", storage_read_bytes_per_s / 1e9, "test"))
    hw, problems = compose_hardware("h100_80gb", settings)
    assert not problems
    out = []
    for mode in ("sim", "full"):
        built = build_deployment(DeploymentInputs(hardware=hw, record=rec, cache_mode=mode, policy=policy,
                                                  policy_config=policy_config))
        built.model.block_size = BLOCK
        pool = built.model.groups["agg"].spec.pool_tokens
        fits = [r for r in reqs if r.input_length + 1 <= pool]     # the server refuses the others
        try:
            out.append(Outcome(mode, simulate(built.model, fits, arrival="as_is"), built))
        finally:
            built.close()
    return out


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
    sim, full = both(rec, reqs, storage_read_bytes_per_s=rate)
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
    sim, full = both(rec, reqs, storage_read_bytes_per_s=rate)
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
