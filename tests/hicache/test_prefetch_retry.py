"""memory.hicache_storage_prefetch_retry_{poll_interval,max_attempts}: storage misses of a
waiting request are asked again every poll_interval scheduling passes, at most max_attempts
times (reference storage_prefetch.py:StoragePrefetchRetries); 0 disables."""
import json
from types import SimpleNamespace

import pytest

from sglang_hydra.cache.hicache import HiCache, PrefetchRetries
from sglang_hydra.cache.storage import SimStorage, page_hashes
from sglang_hydra.config.testing import make_record
from sglang_hydra.memory import build_memory
from sglang_hydra.workload.trace import Request

PS = 16


def _keys(ids):
    return page_hashes([(i,) for i in ids])


# ----------------------------------------------------------------- the pass schedule
@pytest.mark.parametrize("interval", [0, 1, 8])
def test_miss_is_due_interval_passes_later_and_never_for_the_head(interval):
    r = PrefetchRetries(interval, 3)
    r.poll_miss("queued")
    r.poll_miss("head")
    for scheduling_pass in range(1, interval + 3):
        ready = r.pop_ready(["head", "queued"])
        assert ready == (["queued"] if interval > 0 and scheduling_pass == interval + 1 else [])
    assert r.attempts("head") == 0


def test_attempt_budget():
    r = PrefetchRetries(1, 2)
    seen = 0
    r.poll_miss("q")
    for _ in range(20):
        ready = r.pop_ready(["head", "q"])
        seen += len(ready)
        if ready:
            r.poll_miss("q")                    # the re-issued query missed again
    assert seen == 2 and r.attempts("q") == 2
    assert not PrefetchRetries(4, 0).enabled and not PrefetchRetries(0, 4).enabled


# ----------------------------------------------------------------- a page that shows up later
class AppearsAfterPasses(SimStorage):
    """Storage whose pages become visible only after ``after`` scheduling passes of ``cache``
    (another instance's write still in flight when the request first asks)."""

    def __init__(self, after):
        super().__init__()
        self.after = after
        self.cache = None

    def _visible(self):
        return self.cache is not None and self.cache.passes >= self.after

    def exists(self, key):
        return self._visible() and super().exists(key)

    def get(self, key):
        return super().get(key) if self._visible() else None


def _queue_case(interval, attempts, appear_after, ahead=12):
    """``ahead`` requests, then the target, arrive together; one admission per pass."""
    st = AppearsAfterPasses(appear_after)
    mem = build_memory(make_record(enable_hierarchical_cache=True, hicache_ratio=2.0, max_total_tokens=64 * PS,
                                   page_size=PS, hicache_io_backend="direct"))
    c = HiCache(mem, storage=st, prefetch_threshold=PS, prefetch_policy="wait_complete",
                prefetch_retry_poll_interval=interval, prefetch_retry_max_attempts=attempts)
    st.cache = c
    target = _keys([900, 901, 902])
    for k in target:
        st.set(k, c.expected_page(k))
    order = []
    for i in range(ahead):
        c.arrive(("ahead", i), _keys([10 * i + 1]))
        order.append(("ahead", i))
    c.arrive("target", target)
    order.append("target")
    out = None
    while order:
        c.scheduling_pass(order)
        rid = order.pop(0)
        if rid == "target":
            c.target_retries = c.retries.attempts("target")
        o = c.admit(rid)
        if rid == "target":
            out = o
    c.check_invariants()
    assert c.hpool.available_size() + sum(1 for n in c.nodes.values() if n.host is not None) * PS == c.hpool.size
    c.close()
    return out, c


def test_page_found_by_a_retry_is_loaded():
    # arrival (pass 0): not visible yet; retries at passes 3 (still missing) and 6 (there)
    out, c = _queue_case(interval=2, attempts=8, appear_after=5)
    assert out["storage"] == 3
    assert c.target_retries == 2 and c.stats["prefetch_retry_issued"] == 1
    assert c.stats["verify_mismatch_pages"] == 0 and c.stats["verified_pages"] >= 3


@pytest.mark.parametrize("interval,attempts", [(0, 8), (2, 0)])
def test_zero_disables_retries(interval, attempts):
    out, c = _queue_case(interval, attempts, appear_after=5)
    assert out["storage"] == 0 and c.stats["prefetch_retries"] == 0


def test_budget_runs_out_before_the_page_appears():
    out, c = _queue_case(interval=2, attempts=1, appear_after=5)      # only the pass-3 retry
    assert out["storage"] == 0 and c.target_retries == 1


def test_queue_head_is_not_held_back():
    out, c = _queue_case(interval=1, attempts=8, appear_after=1, ahead=0)
    assert out["storage"] == 0 and c.target_retries == 0


# ----------------------------------------------------------------- through the full replay
def _burst_trace(n):
    """``n`` requests with one timestamp (they queue), then one more later; no shared blocks."""
    reqs = [Request(0.0, 512, 1, (i,)) for i in range(n)]
    return reqs + [Request(3000.0, 512, 1, (n,))]


@pytest.mark.parametrize("interval,attempts,expected", [(1, 8, 6), (1, 1, 4), (0, 8, 0), (1, 0, 0)])
def test_full_replay_counts_passes_and_retries(tmp_path, interval, attempts, expected, full_mode):
    """Six simultaneous arrivals, nothing in storage, one request running at a time
    (``max_running_requests=1``): request j is admitted at pass j + 1 and is the queue head then.  With interval 1 a miss seen at pass p is due at pass p + 1, and
    one registered during a retry at pass p is due at p + 2: requests 2..5 retry at pass 2,
    requests 4..5 again at pass 4 (6 retries); with a budget of 1 only the first round (4)."""
    rec = make_record(enable_hierarchical_cache=True, hicache_ratio=2.0, max_total_tokens=256 * PS, page_size=PS,
                      max_running_requests=1, hicache_io_backend="direct", hicache_storage_backend="file",
                      hicache_storage_prefetch_retry_poll_interval=interval,
                      hicache_storage_prefetch_retry_max_attempts=attempts,
                      hicache_storage_backend_extra_config=json.dumps({"file_storage_path": str(tmp_path),
                                                                       "prefetch_threshold": PS}))
    r = full_mode(rec, _burst_trace(6))
    counts = r["cache"]["tier_counts"]
    assert counts["scheduling_passes"] == 7
    assert counts["prefetch_retries"] == expected
    assert counts["prefetch_retry_issued"] == 0           # nothing ever appeared in storage
    assert r["requests"]["requests_completed"] == 7 and r["full_mode"]["verify_mismatch_pages"] == 0


def test_record_fields_reach_the_cache(tmp_path, monkeypatch, full_mode):
    from sglang_hydra.cache.tiered import TieredCache

    seen = {}
    real = TieredCache.__init__

    def spy(self, *a, **kw):
        seen.update(kw)
        real(self, *a, **kw)

    monkeypatch.setattr(TieredCache, "__init__", spy)
    rec = make_record(enable_hierarchical_cache=True, max_total_tokens=64 * PS, page_size=PS,
                      hicache_io_backend="direct", hicache_storage_prefetch_retry_poll_interval=3,
                      hicache_storage_prefetch_retry_max_attempts=5)
    full_mode(rec, [SimpleNamespace(timestamp=0.0, input_length=32, output_length=1, hash_ids=(1,),
                                         priority=0)])
    assert seen["retry_poll_interval"] == 3 and seen["retry_max_attempts"] == 5
