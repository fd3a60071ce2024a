"""Every fault ends the request Failed, frees its pages, leaves the other side serving, and is bounded."""
import dataclasses
import re
import threading
import time

import pytest

from sglang_hydra.disagg.workers import PrefillWorker
from sglang_hydra.utils.ports import free_port
from sglang_hydra.disagg.states import KVPoll

from .conftest import BACKENDS, make_rec
from .helpers import assert_clean, decode_worker, serving_prefill


def _statuses(res):
    return {r.room: r.status for r in res.requests}


@pytest.mark.parametrize("backend", BACKENDS)
def test_bootstrap_unreachable(backend, fast_env):
    rec = make_rec(backend)
    with decode_worker(rec) as d:
        res = d.fetch(f"127.0.0.1:{free_port()}", [1, 2], 4, timeout=20)
        assert _statuses(res) == {1: "Failed", 2: "Failed"}
        # bounded by count, not by the fetch's 20 s timeout: a finite number of bootstrap attempts (the
        # configured 3, raised until their backoff spans two heartbeats), then no further request is issued
        tries = [int(m.group(1)) for r in res.requests for m in [re.search(r"after (\d+) attempt\(s\)", r.reason)] if m]
        assert tries and all(3 <= n < 64 for n in tries), [r.reason for r in res.requests]
        assert_clean(res)
        with serving_prefill(rec) as (p, _):          # the decode keeps serving afterwards
            ok = d.fetch(p.bootstrap_addr, [3, 4], 4, timeout=20)
        assert _statuses(ok) == {3: "Success", 4: "Success"}


def test_bootstrap_slow(fast_env):
    fast_env.setenv("SGLANG_HYDRA_DISAGG_BOOTSTRAP_HTTP_TIMEOUT", "0.3")
    fast_env.setenv("SGLANG_HYDRA_DISAGG_BOOTSTRAP_RETRIES", "2")
    rec = make_rec("zmq")
    with serving_prefill(rec, slow_bootstrap=True) as (p, _), decode_worker(rec) as d:
        p.server.delay_s = 1.0
        res = d.fetch(p.bootstrap_addr, [1], 4, timeout=20)
        # every attempt timed out at 0.3 s (the server answers after 1 s), a finite number of them
        assert res.requests[0].status == "Failed" and "TimeoutError: timed out" in res.requests[0].reason
        assert re.search(r"after [2-9] attempt\(s\)", res.requests[0].reason), res.requests[0].reason
        assert_clean(res)
        p.server.delay_s = 0.0
        ok = d.fetch(p.bootstrap_addr, [2], 4, timeout=20)
        assert ok.requests[0].status == "Success"


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_killed_mid_transfer(backend, fast_env, peers):
    rec = make_rec(backend)
    slow = peers("prefill", "--backend", backend, "--bootstrap-port", str(free_port()), "--transfer-delay", "30")
    with decode_worker(rec) as d:
        out = {}
        th = threading.Thread(target=lambda: out.setdefault("r", d.fetch(slow.ready["bootstrap"], [1, 2], 4,
                                                                         timeout=20)))
        th.start()
        deadline = time.monotonic() + 10
        while not all(d.mgr.status.get(r) == KVPoll.WaitingForInput for r in (1, 2)):
            assert time.monotonic() < deadline, "metadata was never sent"
            time.sleep(0.02)
        time.sleep(0.3)  # prefill has the metadata and is inside its (slowed) transfer
        slow.kill()
        th.join(15)
        assert not th.is_alive()
        res = out["r"]
        assert _statuses(res) == {1: "Failed", 2: "Failed"}
        # the heartbeat (2 misses x 0.2 s) ended them, not the fetch's own 20 s timeout
        assert all("Lost connection" in r.reason and "timed out" not in r.reason for r in res.requests)
        assert_clean(res)
        fresh = peers("prefill", "--backend", backend, "--bootstrap-port", str(free_port()))
        ok = d.fetch(fresh.ready["bootstrap"], [3, 4], 4, timeout=20)
        assert _statuses(ok) == {3: "Success", 4: "Success"} and all(r.verified for r in ok.requests)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_killed(backend, fast_env, peers):
    rec = make_rec(backend)
    with serving_prefill(rec, delay=1.0) as (p, out):
        dead = peers("decode", "--backend", backend, "--prefill", p.bootstrap_addr, "--rooms", "1", "--pages", "4")
        deadline = time.monotonic() + 10
        while 1 not in p.mgr.transfer_infos:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        dead.kill()
        deadline = time.monotonic() + 8            # delay 1 s + send timeout 2 s, with margin
        while p.mgr.status.get(1) not in (None, KVPoll.Failed):
            assert time.monotonic() < deadline, f"room 1 still {p.mgr.status.get(1)}"
            time.sleep(0.05)
        p.mgr.transfer_delay = 0.0
        live = peers("decode", "--backend", backend, "--prefill", p.bootstrap_addr, "--rooms", "2,3", "--pages", "4")
        got = live.expect("RESULT", 30)
    assert {r["room"]: r["status"] for r in got["requests"]} == {2: "Success", 3: "Success"}
    res = out["res"]
    st = _statuses(res)
    assert st[1] == "Failed" and st[2] == st[3] == "Success"
    assert "Failed to send kv chunk" in [r for r in res.requests if r.room == 1][0].reason
    assert_clean(res)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transfer_rejected_by_engine(backend, fast_env):
    rec = make_rec(backend)
    with serving_prefill(rec) as (p, out), decode_worker(rec, bad_page_rooms=[2]) as d:
        res = d.fetch(p.bootstrap_addr, [1, 2, 3], 4, timeout=20, max_inflight=1)
        later = d.fetch(p.bootstrap_addr, [4], 4, timeout=20)
    assert _statuses(res) == {1: "Success", 2: "Failed", 3: "Success"}
    bad = [r for r in res.requests if r.room == 2][0]
    assert "Failed to send kv chunk" in bad.reason
    assert later.requests[0].status == "Success"
    assert_clean(res)
    assert _statuses(out["res"]) == {1: "Success", 2: "Failed", 3: "Success", 4: "Success"}
    assert_clean(out["res"])


def test_waiting_timeout_env(fast_env):
    fast_env.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "0.5")
    rec = make_rec("zmq")
    with serving_prefill(rec, delay=1.5) as (p, out), decode_worker(rec) as d:
        res = d.fetch(p.bootstrap_addr, [1], 4, timeout=20)
        # order, not a stopwatch: the decode gave up (its 0.5 s wait) while the prefill was still
        # inside its 1.5 s slowed transfer of room 1, which has not ended yet
        assert p.mgr.status.get(1) not in (KVPoll.Success, KVPoll.Failed), p.mgr.status.get(1)
        r = res.requests[0]
        assert r.status == "Failed" and "timed out after 0.5s" in r.reason
        assert_clean(res)
        time.sleep(2.0)   # prefill finishes its slowed transfer attempt and sees the abort
    pres = out["res"]
    assert _statuses(pres) == {1: "Failed"} and "abort" in pres.requests[0].reason
    assert_clean(pres)


def test_bootstrap_timeout_env(fast_env):
    fast_env.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "0.3")
    w = PrefillWorker(make_rec("zmq"), bootstrap_port=0)
    try:
        res = w.serve([1, 2], pages_per_request=4, timeout=10)
    finally:
        w.close()
    assert _statuses(res) == {1: "Failed", 2: "Failed"}
    # both ended on the variable's 0.3 s bootstrap timeout, not on serve's own 10 s one
    assert all("timed out after 0.3s in KVPoll.Bootstrapping" in r.reason for r in res.requests)
    assert_clean(res)


@pytest.mark.parametrize("backend", BACKENDS)
def test_checksum_mismatch_fails_request(backend, fast_env):
    fast_env.setenv("SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB", "1.0")
    rec = make_rec(backend, checksum=True)
    with serving_prefill(rec) as (p, _), decode_worker(rec) as d:
        bad = d.fetch(p.bootstrap_addr, [1, 2], 4, timeout=20)
        d.mgr.env = dataclasses.replace(d.mgr.env, checksum_mismatch_prob=0.0)
        good = d.fetch(p.bootstrap_addr, [3], 4, timeout=20)
    assert _statuses(bad) == {1: "Failed", 2: "Failed"}
    assert all(r.checksum is False and "checksum mismatch" in r.reason for r in bad.requests)
    assert_clean(bad)
    assert good.requests[0].status == "Success" and good.requests[0].checksum is True


def test_injected_poll_failure_env(fast_env):
    fast_env.setenv("SGLANG_TEST_DISAGG_FAILURE_PROB", "1.0")
    rec = make_rec("zmq")
    with decode_worker(rec) as d:
        with serving_prefill(rec) as (p, _):
            res = d.fetch(p.bootstrap_addr, [1], 4, timeout=10)
    assert res.requests[0].status == "Failed" and "injected" in res.requests[0].reason
    assert_clean(res)


def test_a_request_that_cannot_fit_the_prefill_pool_fails_at_once_on_both_sides(fast_env):
    """Prefill knows at once that 40 pages never fit its 16: it fails the room and tells decode,
    which frees the pages (no waiting timeout); the prefill keeps serving."""
    from sglang_hydra.disagg.workers import DecodeWorker, PlainBufferShape
    rec = make_rec("zmq")
    small = PlainBufferShape(num_layers=2, head_num=2, head_dim=16, page_size=16, num_pages=16)
    big = dataclasses.replace(small, num_pages=128)
    with serving_prefill(rec, geometry=small) as (p, out):
        d = DecodeWorker(rec, geometry=big)
        try:
            res = d.fetch(p.bootstrap_addr, [1, 2], 40, timeout=20)
            ok = d.fetch(p.bootstrap_addr, [3], 4, timeout=20)
        finally:
            d.close()
    assert all(r.status == "Failed" and "40 KV pages do not fit in this prefill's pool" in r.reason
               for r in res.requests)
    assert all(r.release == "now" for r in res.requests)   # prefill settled them: nothing can land
    assert_clean(res)
    assert ok.requests[0].status == "Success" and ok.requests[0].verified
    assert _statuses(out["res"]) == {1: "Failed", 2: "Failed", 3: "Success"}
    assert_clean(out["res"])
