"""Real transfers with byte-for-byte verification (zmq always, mooncake when importable)."""
import time

import pytest

from sglang_hydra.disagg.workers import DecodeWorker, build_kv_source
from sglang_hydra.jobs.pd_pair_processes import run_pair

from .conftest import BACKENDS, make_rec, mooncake_importable
from .helpers import ReversingAllocator, assert_clean, decode_worker, serving_prefill


@pytest.mark.parametrize("backend", BACKENDS)
def test_in_process_transfer_verified(backend, fast_env):
    rec = make_rec(backend, checksum=True)
    with serving_prefill(rec) as (p, out), decode_worker(rec) as d:
        # fragment decode's free list so destination pages do not line up with source pages
        hold = d.allocator.alloc(20)
        d.allocator.free(hold[::2])
        res = d.fetch(p.bootstrap_addr, list(range(1, 13)), 4, timeout=20)
        d.allocator.free(hold[1::2])
        res.pages_in_use_after = d.allocator.used
    assert [r.status for r in res.requests] == ["Success"] * 12
    assert all(r.verified and r.checksum for r in res.requests)
    assert_clean(res)
    assert out["res"].succeeded == 12
    assert_clean(out["res"])


@pytest.mark.skipif(not mooncake_importable(), reason="mooncake.engine not importable")
def test_mooncake_batch_limit_is_handled(fast_env):
    """2,400 separate entries in one request: above the TCP transport's ~2,050 queue limit."""
    rec = make_rec("mooncake", max_total_tokens=16 * 1024)
    with serving_prefill(rec) as (p, out):
        src, alloc = build_kv_source(rec)
        d = DecodeWorker(rec, source=src, allocator=ReversingAllocator(alloc))
        try:
            res = d.fetch(p.bootstrap_addr, [1], 600, timeout=30)
        finally:
            d.close()
    assert res.requests[0].status == "Success", res.requests[0].reason
    assert res.requests[0].verified


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_pair_two_processes(backend):
    rec = make_rec(backend, checksum=True)
    t0 = time.monotonic()
    r = run_pair(rec, requests=24, pages_per_request=8, timeout=60)
    assert time.monotonic() - t0 < 60
    assert r.errors == [] and r.failed == 0 and r.succeeded == 24, (r.errors, r.failures)
    assert r.pages_moved == 24 * 8 and r.bytes_moved > 0 and r.gbps and r.gbps > 0
    assert r.p50_ms is not None and r.p99_ms >= r.p50_ms
    assert r.checksum_checked == 24 and r.checksum_mismatches == 0
    assert all(x.verified for x in r.decode.requests)
    assert r.prefill.succeeded == 24
    assert_clean(r.prefill)
    assert_clean(r.decode)
    assert r.prefill.endpoints["bootstrap"].startswith("http://127.0.0.1:")
    assert r.decode.registration["buffers"] == r.prefill.registration["buffers"] > 0


def test_run_pair_mooncake_tcp_alias():
    if not mooncake_importable():
        pytest.skip("mooncake.engine not importable")
    r = run_pair(make_rec("mooncake_tcp"), requests=4, pages_per_request=4, timeout=60)
    assert r.backend == "mooncake" and r.succeeded == 4, (r.errors, r.failures)


def test_fake_backend_decode_only_moves_nothing():
    rec = make_rec("fake", mode="decode")
    with decode_worker(rec) as d:
        res = d.fetch(None, [1, 2, 3], 4, timeout=5)
        assert all(r.status == "Success" for r in res.requests)
        assert all(bool((t == 0).all()) for _, t in d.source.contiguous_buffers())
    assert_clean(res)
    r = run_pair(rec, requests=5, pages_per_request=4, timeout=30)
    assert r.succeeded == 5 and r.prefill is None
