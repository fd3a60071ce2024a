"""Deferred page release: a late one-sided write must never land in pages a later request owns.

The race: decode gives up on a request (here: its waiting timeout) while prefill's writes for it
are already posted to the engine. If decode hands the pages straight back to its allocator, the
next request gets the same pages (the allocator reuses freed pages first), receives its own data,
and then the late write of the failed request lands on top of it.

``serving_prefill(..., slow_rooms={room: seconds})`` (the test-only ``faults.with_faults``) makes
prefill post that room's writes at once (past its abort check, as if already handed to the NIC)
and land them ``seconds`` later.
"""
import time

import pytest
import torch

from sglang_hydra.disagg import control
from sglang_hydra.disagg.workers import DecodeWorker, build_kv_source, check_pages
from sglang_hydra.disagg.states import KVPoll

from .conftest import BACKENDS, make_rec, mooncake_importable
from .helpers import FifoAllocator, RecordingAllocator, assert_clean, serving_prefill

needs_mooncake = pytest.mark.skipif(not mooncake_importable(), reason="mooncake.engine not importable")

SLOW = 3.0      # seconds between "posted" and "landed" for the slow room (room 2 must finish first)
WAIT = 0.5      # decode's waiting timeout


def _decode(rec):
    src, alloc = build_kv_source(rec)
    rec_alloc = RecordingAllocator(alloc)
    return DecodeWorker(rec, source=src, allocator=rec_alloc), rec_alloc


def _prefill(rec, **faults):
    src, alloc = build_kv_source(rec)
    return serving_prefill(rec, source=src, allocator=FifoAllocator(alloc), **faults)


def _snapshot(args, pages):
    return [args.tensors[b].reshape(-1).view(torch.uint8).view(-1, il)[list(pages)].clone()
            for b, il in enumerate(args.kv_item_lens)]


def _race(fast_env, deferred: bool):
    """Room 1 times out on decode while its writes are posted; room 2 follows at once.

    Returns (decode result 1, decode result 2, pages 1, pages 2, room-2 data intact after the
    late write, late write landed in pages 1, the decode worker, prefill results by room).
    """
    fast_env.setenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "1" if deferred else "0")
    fast_env.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAIT))
    fast_env.setenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", "15")
    rec = make_rec("mooncake")
    with _prefill(rec, slow_rooms={1: SLOW}) as (p, out):
        d, allocs = _decode(rec)
        try:
            t0 = time.monotonic()
            r1 = d.fetch(p.bootstrap_addr, [1], 4, timeout=20)
            # the waiting timeout ended room 1 (not the run deadline), before its slow write landed
            assert r1.requests[0].status == "Failed" and f"timed out after {WAIT}s" in r1.requests[0].reason
            assert 1 in p.mgr._writing                           # its posted write is still in flight
            r2 = d.fetch(p.bootstrap_addr, [2], 4, timeout=20)   # a later request, right away
            assert r2.requests[0].status == "Success" and r2.requests[0].verified
            pages1, pages2 = allocs.allocs[0], allocs.allocs[1]
            # let room 1's posted write land (posted at ~t0, lands at ~t0 + SLOW)
            time.sleep(max(0.0, t0 + SLOW + 0.7 - time.monotonic()))
            intact = check_pages(d.args, pages2, 2)
            landed = check_pages(d.args, pages1, 1) if not set(pages1) & set(pages2) else not intact
            d.drain_quarantine(timeout=5)
        finally:
            d.close()
    return r1, r2, pages1, pages2, intact, landed, d, {r.room: r for r in out["res"].requests}, out["res"]


@needs_mooncake
def test_late_write_does_not_corrupt_a_later_request(fast_env):
    r1, r2, pages1, pages2, intact, landed, d, pres, pside = _race(fast_env, deferred=True)
    assert landed, "the slow write never landed: the race was not exercised"
    assert intact, "room 1's late write overwrote the pages of room 2"
    assert not set(pages1) & set(pages2)
    # room 1's pages were held until prefill confirmed the posted writes settled, then released
    assert r1.requests[0].release == "deferred" and r1.quarantined_pages == len(pages1)
    (room, how, held), = d.releases
    assert room == 1 and how == "confirmed" and held >= SLOW - WAIT - 0.3
    d.allocator.check_invariants()
    assert d.allocator.used == 0
    assert pres[1].status == "Failed" and "abort" in pres[1].reason
    assert pres[2].status == "Success"
    assert_clean(pside)


@needs_mooncake
def test_the_race_is_real_without_deferred_release(fast_env):
    """Control experiment: the old behaviour (free at once) lets room 1's late write corrupt room 2."""
    r1, r2, pages1, pages2, intact, landed, d, pres, _ = _race(fast_env, deferred=False)
    assert r1.requests[0].release == "now"
    assert pages1 == pages2            # the freed pages were handed out again at once ...
    assert not intact                  # ... and the late write landed on room 2's data
    d.allocator.check_invariants()


@needs_mooncake
def test_abort_before_posting_writes_nothing_and_is_acknowledged(fast_env):
    """Prefill checks the abort before it posts: the aborted room's pages are never written."""
    fast_env.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAIT))
    rec = make_rec("mooncake")
    with _prefill(rec, delay=1.5) as (p, out):
        d, allocs = _decode(rec)
        try:
            r1 = d.fetch(p.bootstrap_addr, [1], 4, timeout=20)
            assert r1.requests[0].status == "Failed"
            pages1 = allocs.allocs[0]
            before = _snapshot(d.args, pages1)
            assert d.drain_quarantine(timeout=3) == 0          # the ABORT_ACK comes at once ...
            if r1.requests[0].release == "deferred":
                (room, how, held), = d.releases
                assert how == "confirmed" and held < 1.0
            else:                                               # ... possibly before decode even looked
                assert r1.requests[0].release == "now" and not d.releases
            time.sleep(1.6)                                     # past the prefill's delay
            assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(d.args, pages1)))
            assert not check_pages(d.args, pages1, 1)
            assert_clean(d.fetch(p.bootstrap_addr, [], 4))
        finally:
            d.close()
    pres = out["res"].requests
    assert len(pres) == 1 and pres[0].status == "Failed" and "abort" in pres[0].reason
    assert_clean(out["res"])


@needs_mooncake
def test_unconfirmed_pages_are_released_by_the_timeout(fast_env):
    """No confirmation in time: the hold ends after the deferred-release timeout, not before."""
    fast_env.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAIT))
    fast_env.setenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", "0.8")
    rec = make_rec("mooncake")
    with _prefill(rec, slow_rooms={1: 3.0}) as (p, _):
        d, _ = _decode(rec)
        try:
            r1 = d.fetch(p.bootstrap_addr, [1], 4, timeout=20)
            # order of events: the request failed and its pages are held ...
            assert r1.requests[0].release == "deferred" and r1.pages_in_use_after == 4
            assert d.release_quarantined() == 0 and d.releases == []      # ... not released early ...
            assert d.drain_quarantine(timeout=5) == 0                      # ... then released ...
            (room, how, held), = d.releases
            # ... by the timeout (no confirmation), after holding at least the configured 0.8 s,
            # while prefill's posted write of the room is still in flight (it lands at ~3 s)
            assert room == 1 and how == "timeout" and held >= 0.8
            assert 1 in p.mgr._writing
            d.allocator.check_invariants()
            time.sleep(2.6)   # let the slow write finish before the prefill shuts down
        finally:
            d.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_deferred_release_can_be_turned_off(backend, fast_env):
    fast_env.setenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "0")
    fast_env.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAIT))
    rec = make_rec(backend)
    with _prefill(rec, delay=1.0) as (p, _):
        d, _ = _decode(rec)
        try:
            r = d.fetch(p.bootstrap_addr, [1], 4, timeout=20)
            assert r.requests[0].status == "Failed" and r.requests[0].release == "now"
            assert_clean(r)
            time.sleep(0.7)
        finally:
            d.close()


def test_zmq_releases_at_once_because_decode_does_the_writes(fast_env):
    fast_env.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", str(WAIT))
    rec = make_rec("zmq")
    with _prefill(rec, slow_rooms={1: 1.5}) as (p, out):
        d, allocs = _decode(rec)
        try:
            r1 = d.fetch(p.bootstrap_addr, [1], 4, timeout=20)
            assert r1.requests[0].release == "now"
            assert_clean(r1)
            r2 = d.fetch(p.bootstrap_addr, [2], 4, timeout=20)
            assert r2.requests[0].status == "Success"
            assert allocs.allocs[0] == allocs.allocs[1]        # the same pages were reused ...
            time.sleep(1.5)
            assert check_pages(d.args, allocs.allocs[1], 2)    # ... and room 1's late data was dropped
        finally:
            d.close()
    pres = {r.room: r.status for r in out["res"].requests}
    assert pres == {1: "Failed", 2: "Success"}


def test_control_messages_for_deferred_release():
    sm = control.StatusMessage(5, KVPoll.Failed, "x", settled=False)
    assert control.StatusMessage.decode(sm.encode()) == sm
    legacy = sm.encode()[:6]                                   # a 6-frame status means settled
    assert control.StatusMessage.decode(legacy).settled is True
    assert control.decode_abort_ack(control.encode_abort_ack(7, "p")) == (7, "p")
    assert control.decode_reg_ack(control.encode_reg_ack("p", {"endpoint": "h:1"})) == ("p", {"endpoint": "h:1"})
    with pytest.raises(control.ProtocolError):
        control.decode_abort_ack([control.ABORT_ACK, b"1"])
