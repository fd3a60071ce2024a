"""Achieved bandwidth per tier: real bytes over real busy time, next to the start-up ceiling."""
import json
import time

import pytest

from sglang_hydra.cache.hicache import HiCache
from sglang_hydra.cache.storage import SimStorage, page_hashes
from sglang_hydra.config.testing import make_record
from sglang_hydra.memory import build_memory
from sglang_hydra.workload.metrics import TransferMeter, format_rate

PS = 16


def _keys(ids):
    return page_hashes([(i,) for i in ids])


def _cache(storage=None, wp="write_through", dev_pages=16, prefetch_threshold=PS):
    mem = build_memory(make_record(enable_hierarchical_cache=True, hicache_ratio=2.0, max_total_tokens=dev_pages * PS,
                                   page_size=PS, hicache_write_policy=wp, hicache_io_backend="direct"))
    return HiCache(mem, write_policy=wp, storage=storage, prefetch_threshold=prefetch_threshold)


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_meter_counts_busy_time_once_and_skips_idle_time():
    clk = FakeClock()
    m = TransferMeter(clock=clk)
    m.start("storage_read")          # t=0 .. 2
    clk.t = 1.0
    m.start("storage_read")          # overlaps: t=1 .. 3
    clk.t = 2.0
    m.stop("storage_read", 1_000_000_000)
    clk.t = 3.0
    m.stop("storage_read", 1_000_000_000)
    clk.t = 10.0                     # 7 s idle
    with m.timing("storage_read") as moved:
        clk.t = 11.0
        moved.append(2_000_000_000)
    assert m.seconds("storage_read") == pytest.approx(4.0)      # not 2 + 2 + 1, not 11
    assert m.rate_gbps("storage_read") == pytest.approx(1.0)
    assert m.calls("storage_read") == 3
    assert m.rate_gbps("d2h") is None and format_rate(None) == "-"
    assert format_rate(0.0021) == "0.0021"                        # not "0.00"
    with pytest.raises(RuntimeError):
        m.stop("h2d")


def test_one_request_backs_up_in_one_transfer():
    c = _cache()
    c.serve(_keys(range(5)))
    assert c.meter.calls("d2h") == 1
    assert c.meter.bytes("d2h") == 5 * c.page_bytes
    assert c.meter.rate_gbps("d2h") > 0


def test_storage_write_counts_only_bytes_the_storage_received():
    """Pages storage already holds are not written again and not reported as moved (the old
    accounting booked them as written, with almost no time, inflating the rate)."""
    st = SimStorage()
    c = _cache(storage=st, prefetch_threshold=8 * PS)     # too short to prefetch: the pages are recomputed
    ks = _keys([1, 2, 3])
    for k in ks:
        st.set(k, c.expected_page(k))
    written_before = st.stats["bytes_written"]
    c.serve(ks)
    assert c.stats["storage_write_skipped_pages"] == 3
    assert c.meter.bytes("storage_write") == 0 and c.meter.rate_gbps("storage_write") is None
    c.serve(_keys([7]))
    assert c.meter.bytes("storage_write") == c.page_bytes == st.stats["bytes_written"] - written_before


class SlowSetSim(SimStorage):
    """Writes take ``delay`` seconds per call: the achieved rate is known in advance."""

    delay = 0.05

    def batch_set(self, keys, values):
        time.sleep(self.delay)
        return super().batch_set(keys, values)


def test_achieved_storage_write_rate_matches_the_time_spent_writing():
    st = SlowSetSim()
    c = _cache(storage=st, dev_pages=64)
    for base in range(0, 40, 4):
        c.serve(_keys(range(base, base + 4)))                       # 10 requests, one batch_set each
    calls = c.meter.calls("storage_write")
    expected = c.meter.bytes("storage_write") / (calls * SlowSetSim.delay) / 1e9
    assert calls == 10 and c.meter.bytes("storage_write") == 40 * c.page_bytes
    assert 0.4 * expected <= c.meter.rate_gbps("storage_write") <= expected * 1.0001


def test_full_replay_reports_real_bytes_rates_and_ratios(tmp_path, full_mode):
    """Storage bytes in job.mode=full's report are the bytes the backend itself counted, in both a
    cold and a warm (second) run over the same directory, and every direction that moved bytes
    has an achieved rate and a ratio to the ceiling measured before the first request."""
    from sglang_hydra.workload.bandwidth import TIER_DIRECTIONS
    from sglang_hydra.workload.trace import load_trace

    rec = make_record(enable_hierarchical_cache=True, hicache_ratio=2.0, max_total_tokens=4096 * PS, page_size=PS,
                      hicache_write_policy="write_through", hicache_storage_backend="file",
                      hicache_io_backend="direct",
                      hicache_storage_backend_extra_config=json.dumps({"file_storage_path": str(tmp_path),
                                                                       "prefetch_threshold": 32}))
    tr = load_trace()
    cold = full_mode(rec, tr, max_requests=8)
    warm = full_mode(rec, tr, max_requests=8)
    for r in (cold, warm):
        f = r["full_mode"]
        assert f["storage_write_bytes"] == r["storage_stats"]["bytes_written"]
        assert f["storage_read_bytes"] == r["storage_stats"]["bytes_read"]
        for d in TIER_DIRECTIONS:
            assert f[f"{d}_ceiling_gbps"] > 0
            if f[f"{d}_bytes"]:
                assert f[f"{d}_achieved_gbps"] > 0 and f[f"{d}_transfer_s"] > 0
                assert f[f"{d}_ceiling_ratio"] == pytest.approx(f[f"{d}_achieved_gbps"] / f[f"{d}_ceiling_gbps"])
            else:
                assert f[f"{d}_achieved_gbps"] is None and f[f"{d}_ceiling_ratio"] is None
    assert cold["full_mode"]["storage_write_bytes"] > 0
    assert warm["full_mode"]["storage_write_bytes"] < cold["full_mode"]["storage_write_bytes"]   # already stored
    assert warm["full_mode"]["storage_read_bytes"] > 0
    assert not [f for f in tmp_path.iterdir() if not f.name.endswith(".bin")]      # probe pages removed
