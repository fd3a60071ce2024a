"""workload.tiered_replay: HiCache off = the single-tier replay rules; results; inputs."""
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_hydra.config.testing import make_record
from sglang_hydra.workload.replay import replay
from sglang_hydra.workload.tiered_replay import (TieredReplayResult, sim_host_pages, storage_read_rate,
                                                 tiered_replay)
from sglang_hydra.workload.trace import Request, load_trace

TRACE = Path("/work/shared/traces/conversation_trace.jsonl")


@pytest.fixture(scope="module")
def conversation():
    assert TRACE.exists(), f"the conversation trace is needed at {TRACE}"
    return load_trace(TRACE).requests


def _rec(**kw):
    base = dict(model_path="tiny", radix_eviction_policy="lru")
    base.update(kw)
    return make_record(**base)


@pytest.mark.parametrize("policy,capacity,expected", [("lru", 1000, 12_847), ("lfu", 1000, 13_871),
                                                      ("fifo", 4000, 24_853)])
def test_hicache_off_reproduces_the_reference_block_counts(conversation, policy, capacity, expected):
    rec = _rec(page_size=512, max_total_tokens=capacity * 512)
    r = tiered_replay(rec, conversation, policy=policy)
    assert r.mode == "sim" and not r.hierarchical
    assert r.hit_pages == {"device": expected, "host": 0, "storage": 0}
    assert r.lookup_pages == 288_500


@pytest.mark.parametrize("page_size", [16, 512])
@pytest.mark.parametrize("policy,cfg", [("lru", None), ("slru", None), ("ghost_lru", None), ("belady", None),
                                        ("tlru", {"threshold": 4096, "next_prompt_estimate": 1024})])
def test_hicache_off_matches_metadata_replay_request_by_request(conversation, page_size, policy, cfg):
    reqs = conversation[:1500]
    rec = _rec(page_size=page_size, max_total_tokens=300 * 512)
    meta = replay(rec, reqs, policy=policy, policy_config=cfg, keep_per_request=True)
    tier = tiered_replay(rec, reqs, policy=policy, policy_config=cfg)
    assert tier.hit_pages["device"] == meta.hit_pages
    assert tier.counts["device_evicted_pages"] == meta.evictions
    hit_tokens = [min(k * page_size, r.input_length) for k, r in zip(meta.per_request_hit_pages, reqs)]
    assert tier.device_hit_tokens == hit_tokens
    assert tier.uncached_tokens == [r.input_length - h for r, h in zip(reqs, hit_tokens)]


def test_hicache_on_adds_host_and_storage_hits_and_result_is_json(conversation):
    reqs = conversation[:2000]
    off = tiered_replay(_rec(page_size=16, max_total_tokens=100_000), reqs)
    on = tiered_replay(_rec(page_size=16, max_total_tokens=100_000, enable_hierarchical_cache=True,
                            hicache_ratio=2.0, hicache_storage_backend="file"), reqs)
    assert on.hit_pages["device"] == off.hit_pages["device"]     # same device decisions
    assert on.hit_pages["host"] > 0 and on.hit_pages["storage"] > 0
    assert on.token_hit_rate["total"] > off.token_hit_rate["total"]
    d = on.to_dict()
    assert "device_hit_tokens" not in d and "ttft_s" not in d
    json.dumps(d)
    full = on.to_dict(include_per_request=True)
    assert len(full["device_hit_tokens"]) == 2000
    json.dumps(full)
    assert d["page_lookups_per_s"] > 0 and "lookups_per_s" not in d
    # per-request splits add up to the input
    for a, b, c, u, r in zip(on.device_hit_tokens, on.host_hit_tokens, on.storage_hit_tokens,
                             on.uncached_tokens, reqs):
        assert a + b + c + u == r.input_length and min(a, b, c, u) >= 0


class _Hardware:
    storage_read_gbps = 2.0


def test_storage_bandwidth_as_number_or_hardware_object():
    assert storage_read_rate(None) is None
    assert storage_read_rate(3e9) == 3e9
    assert storage_read_rate(_Hardware()) == 2e9
    for bad in (0, -1.0, True, "fast", object()):
        with pytest.raises(ValueError):
            storage_read_rate(bad)


def test_prefetch_pages_follow_the_storage_bandwidth():
    """floor(wait * bandwidth / page bytes) pages land by admission under best_effort."""
    page_bytes = 16 * 256
    # 8-page device, 16-page host, write-through to storage.  Requests 1 and 2 push request
    # 0's blocks out of both tiers (storage keeps them); request 3 reads them again.  It
    # arrives at 0.5 s but the engine is busy until 1.0 s: 0.5 s of prefetching at 6 pages/s
    # = 3 pages have landed when it starts.
    reqs = [Request(0.0, 128, 1, (1, 2)), Request(1.0, 128, 1, (9, 10)), Request(2.0, 128, 1, (11, 12)),
            Request(500.0, 128, 1, (1, 2))]

    class Busy:
        def start_time(self, arrival_s):
            return max(arrival_s, 1.0) if arrival_s > 0.1 else arrival_s

        def serve(self, arrival_s, *a, **k):
            return 0.0

    rec = _rec(page_size=16, max_total_tokens=8 * 16, enable_hierarchical_cache=True,
               hicache_storage_backend="file", hicache_storage_prefetch_policy="best_effort",
               hicache_storage_backend_extra_config=json.dumps({"prefetch_threshold": 16}))
    r = tiered_replay(rec, reqs, block_size=64, storage_read_bytes_per_s=6 * page_bytes, timeline=Busy(),
                      host_pages=16)
    assert r.storage_hit_tokens == [0, 0, 0, 3 * 16] and r.ttft_s == [0.0] * 4
    unbounded = tiered_replay(rec, reqs, block_size=64, host_pages=16)
    assert unbounded.storage_hit_tokens[3] == 8 * 16 and unbounded.ttft_s is None


def test_sim_host_pages_come_from_the_record_not_the_machine():
    rec = _rec(page_size=16, max_total_tokens=16_000, enable_hierarchical_cache=True, hicache_ratio=3.0)
    assert sim_host_pages(rec, 1000, 256) == 3000 + 1
    r = tiered_replay(rec, [Request(0.0, 100, 1, (1,))])
    assert r.host_pages == 3001 and r.device_pages == 1000
    r = tiered_replay(rec, [Request(0.0, 100, 1, (1,))], host_pages=77, device_pages=10)
    assert r.host_pages == 77 and r.device_pages == 10


def test_bad_inputs_are_clear_errors():
    rec = _rec(page_size=16, max_total_tokens=1600)
    with pytest.raises(ValueError, match="unknown mover"):
        tiered_replay(rec, [], mover="teleport")
    with pytest.raises(ValueError, match="unknown eviction policy"):
        tiered_replay(rec, [], policy="nope")
    with pytest.raises(ValueError, match="max_requests"):
        tiered_replay(rec, [], max_requests=-1)
    with pytest.raises(ValueError, match="host_pages"):
        tiered_replay(rec, [], mover="bytes", host_pages=3)


def test_sim_mode_never_reads_the_wall_clock_for_results(monkeypatch):
    """Results are a function of the trace: a clock that jumps around changes nothing."""
    import time as time_module
    import itertools
    reqs = [Request(float(10 * i), 64 * (1 + i % 3), 1, tuple(range(i % 4, i % 4 + 1 + i % 3))) for i in range(40)]
    rec = _rec(page_size=16, max_total_tokens=160, enable_hierarchical_cache=True, hicache_ratio=1.0,
               hicache_storage_backend="file", hicache_storage_prefetch_policy="timeout")
    a = tiered_replay(rec, reqs, block_size=64, storage_read_bytes_per_s=1e5)
    jumps = itertools.count(0, 1000.0)
    monkeypatch.setattr(time_module, "perf_counter", lambda: next(jumps))
    monkeypatch.setattr(time_module, "monotonic", lambda: next(jumps))
    monkeypatch.setattr(time_module, "time", lambda: next(jumps))
    b = tiered_replay(rec, reqs, block_size=64, storage_read_bytes_per_s=1e5)
    da, db = a.to_dict(include_per_request=True), b.to_dict(include_per_request=True)
    for k in ("wall_time_s", "page_lookups_per_s"):
        da.pop(k), db.pop(k)
    assert da == db


def test_unbounded_device_and_disabled_cache(conversation):
    inf = tiered_replay(_rec(page_size=512, max_total_tokens=None), conversation)
    assert inf.device_pages is None and inf.hit_pages["device"] == 105_710     # replay_rules §5 infinite
    off = tiered_replay(_rec(page_size=512, max_total_tokens=512_000, disable_radix_cache=True),
                        conversation[:100])
    assert sum(off.hit_pages.values()) == 0
    assert off.uncached_tokens == [r.input_length for r in conversation[:100]]
