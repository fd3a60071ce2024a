"""The pipelined transfer worker and Mooncake's posted writes, in-process with fake engines."""
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_hydra.disagg import control
from sglang_hydra.disagg.addressing import build_entries, group_contiguous_runs
from sglang_hydra.disagg.addressing import build_entries_fast
from sglang_hydra.disagg.backends.mooncake import MooncakePrefillManager
from sglang_hydra.disagg.buffers import TensorKVBuffers, kv_args_from_source
from sglang_hydra.disagg.prefill_side import Peer, PrefillKVManager
from sglang_hydra.disagg.states import KVPoll

from .conftest import make_rec


# ---------------------------------------------------------------- address building
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 300)), max_size=40),
       st.lists(st.tuples(st.integers(1, 1 << 46), st.integers(1, 1 << 46), st.sampled_from([16, 1024, 16384])),
                min_size=1, max_size=6))
def test_fast_entries_equal_reference_entries(pairs, bufs):
    src = [p for p, _ in pairs]
    dst = [p for _, p in pairs]
    sp, dp, il = zip(*bufs)
    assert build_entries_fast(sp, dp, il, src, dst) == build_entries(sp, dp, il, group_contiguous_runs(src, dst))


def test_fast_entries_merge_runs_and_check_lengths():
    assert build_entries_fast([0], [1000], [10], [1, 2, 3, 7], [5, 6, 7, 8]) == [(10, 1050, 30), (70, 1080, 10)]
    with pytest.raises(ValueError):
        build_entries_fast([0], [0], [1], [1, 2], [1])


# ---------------------------------------------------------------- transfer worker
class _Sock:
    def __init__(self):
        self.sent = []

    def send_multipart(self, frames, flags=0):
        self.sent.append(list(frames))

    def close(self, linger=None):
        pass


class _Handle:
    def __init__(self, room):
        self.room = room
        self.release = threading.Event()
        self.stopped = False


class _AsyncManager(PrefillKVManager):
    """Writes "complete" when the test releases their handle; records concurrency."""
    backend_name = "test-async"

    def init_engine(self):
        self.handles = {}
        self.max_concurrent = 0
        self._live = 0
        self._lk = threading.Lock()

    def start_transfer(self, peer, room, entries):
        h = _Handle(room)
        with self._lk:
            self.handles[room] = h
            self._live += 1
            self.max_concurrent = max(self.max_concurrent, self._live)
        return h

    def progress_transfer(self, h, stop_submitting):
        h.stopped = h.stopped or stop_submitting
        if not h.release.is_set():
            return None
        with self._lk:
            self._live -= 1
        return (0, "", True)


@pytest.fixture
def worker_mgr(monkeypatch):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_QUEUE_SIZE", "1")
    monkeypatch.setenv("SGLANG_HYDRA_DISAGG_MAX_INFLIGHT_TRANSFERS", "4")
    buf = TensorKVBuffers(num_layers=1, num_pages=32, page_size=4, head_num=1, head_dim=4)
    args = kv_args_from_source(buf)
    mgr = _AsyncManager(args, "prefill", make_rec("zmq"), bootstrap_port=1)
    sock = _Sock()
    reg = control.Registration("dec", "127.0.0.1", 1, args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens,
                               args.page_size)
    mgr.peers["dec"] = Peer(reg=reg, sock=sock)
    yield mgr, sock
    for h in mgr.handles.values():
        h.release.set()
    mgr.close()


def _request(mgr, room):
    mgr.transfer_infos[room] = control.TransferInfo(room, "dec", [room])
    mgr.status.update(room, KVPoll.WaitingForInput)
    mgr.add_transfer_request(room, [room])


def _wait(cond, timeout=5.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def _kinds(sock):
    return [(f[0], int(f[1])) for f in sock.sent]


def test_worker_keeps_several_requests_in_flight(worker_mgr):
    mgr, sock = worker_mgr
    for room in range(1, 7):
        _request(mgr, room)
    _wait(lambda: len(mgr.handles) == 4)           # the cap: 4 in flight, 2 queued
    time.sleep(0.05)
    assert len(mgr.handles) == 4 and mgr.max_concurrent == 4
    assert all(mgr.status.get(r) == KVPoll.Transferring for r in range(1, 5))
    mgr.handles[3].release.set()                   # completion order is free
    _wait(lambda: mgr.status.get(3) == KVPoll.Success)
    _wait(lambda: len(mgr.handles) == 5)           # a queued one moved up
    for h in list(mgr.handles.values()):
        h.release.set()
    _wait(lambda: len(mgr.handles) == 6)
    mgr.handles[6].release.set()
    _wait(lambda: all(mgr.status.get(r) == KVPoll.Success for r in range(1, 7)))
    statuses = [control.StatusMessage.decode(f) for f in sock.sent if f[0] == control.KV_STATUS]
    assert sorted(m.room for m in statuses) == list(range(1, 7))
    assert all(m.status == KVPoll.Success and m.settled for m in statuses)


def test_abort_while_writing_is_acknowledged_only_after_the_writes_settle(worker_mgr):
    mgr, sock = worker_mgr
    _request(mgr, 1)
    _wait(lambda: 1 in mgr.handles)
    mgr._on_abort(1, "dec")
    time.sleep(0.05)
    assert mgr.handles[1].stopped                           # told to post nothing more
    assert control.ABORT_ACK not in [f[0] for f in sock.sent]  # but writes are still in flight
    mgr.handles[1].release.set()
    _wait(lambda: control.ABORT_ACK in [f[0] for f in sock.sent])
    st = [control.StatusMessage.decode(f) for f in sock.sent if f[0] == control.KV_STATUS]
    assert len(st) == 1 and st[0].status == KVPoll.Failed and st[0].settled and "abort" in st[0].reason


def test_abort_before_posting_is_acknowledged_at_once_and_nothing_is_written(worker_mgr):
    mgr, sock = worker_mgr
    mgr.transfer_infos[1] = control.TransferInfo(1, "dec", [1])
    mgr.status.update(1, KVPoll.WaitingForInput)
    mgr._on_abort(1, "dec")
    assert _kinds(sock) == [(control.ABORT_ACK, 1)]
    mgr.add_transfer_request(1, [1])
    _wait(lambda: any(f[0] == control.KV_STATUS for f in sock.sent))
    assert 1 not in mgr.handles


def test_a_cleared_room_is_never_written(worker_mgr):
    """The scheduler cleared the room (status gone) before the worker got to it."""
    mgr, sock = worker_mgr
    mgr.transfer_infos[1] = control.TransferInfo(1, "dec", [1])
    mgr.add_transfer_request(1, [1])          # no status: cleared
    _wait(lambda: any(f[0] == control.KV_STATUS for f in sock.sent))
    assert 1 not in mgr.handles


# ---------------------------------------------------------------- mooncake posting
class _Engine:
    """transfer_submit_write / transfer_check_status with scripted outcomes."""

    def __init__(self, outcome=None, submit_fail_at=None):
        self.next = 1
        self.state = {}
        self.outcome = outcome or {}
        self.submit_fail_at = submit_fail_at
        self.posted = []
        self.checked_after_final = 0

    def transfer_submit_write(self, session, src, dst, n):
        if self.submit_fail_at is not None and len(self.posted) == self.submit_fail_at:
            return 0
        bid = self.next
        self.next += 1
        self.posted.append((src, dst, n))
        self.state[bid] = 0
        return bid

    def finish_all(self):
        for bid in self.state:
            if self.state[bid] == 0:
                self.state[bid] = self.outcome.get(bid, 1)

    def transfer_check_status(self, bid):
        st = self.state[bid]
        if st is None:
            self.checked_after_final += 1
            raise AssertionError("polled a batch the engine already freed")
        if st in (1, -1):
            self.state[bid] = None   # final: freed by the engine
        return st


def _mc(engine, max_batch=1024):
    m = MooncakePrefillManager.__new__(MooncakePrefillManager)
    m.engine = engine
    m.max_batch = max_batch
    m._posted = {}
    m.failed_sessions = set()
    return m


def _posted(entries=10, deadline=60.0):
    from sglang_hydra.disagg.backends.mooncake import _Posted
    return _Posted("s", [(i, 1000 + i, 8) for i in range(entries)], time.monotonic() + deadline)


def test_mooncake_posts_at_most_the_batch_cap_per_peer():
    eng = _Engine()
    m, h = _mc(eng, max_batch=4), _posted(10)
    assert m.progress_transfer(h, False) is None
    assert len(eng.posted) == 4 and m._posted["s"] == 4
    for _ in range(3):
        eng.finish_all()
        m.progress_transfer(h, False)
    eng.finish_all()
    assert m.progress_transfer(h, False) == (0, "", True)
    assert [e for e in eng.posted] == h.entries and m._posted["s"] == 0


def test_mooncake_failed_write_fails_the_request_once_everything_settled():
    eng = _Engine(outcome={2: -1})
    m, h = _mc(eng), _posted(5)
    m.progress_transfer(h, False)
    eng.finish_all()
    rc, reason, settled = m.progress_transfer(h, False)
    assert rc == -1 and settled and "failed" in reason and "s" in m.failed_sessions


def test_mooncake_engine_timeout_is_unsettled():
    eng = _Engine(outcome={1: -2})
    m, h = _mc(eng), _posted(2)
    m.progress_transfer(h, False)
    eng.finish_all()
    rc, reason, settled = m.progress_transfer(h, False)
    assert rc == -1 and not settled and "timed out" in reason


def test_mooncake_abort_stops_posting_and_waits_for_posted_writes():
    eng = _Engine()
    m, h = _mc(eng, max_batch=3), _posted(10)
    m.progress_transfer(h, False)
    assert m.progress_transfer(h, True) is None          # 3 still in flight
    eng.finish_all()
    assert m.progress_transfer(h, True) == (-1, "aborted before all writes were posted", True)
    assert len(eng.posted) == 3


def test_mooncake_submit_failure_and_backstop_deadline():
    eng = _Engine(submit_fail_at=2)
    m, h = _mc(eng), _posted(5)
    assert m.progress_transfer(h, False) is None          # two posted, the third refused
    eng.finish_all()
    rc, reason, settled = m.progress_transfer(h, False)
    assert rc == -1 and settled and "could not post" in reason
    eng2 = _Engine()
    m2, h2 = _mc(eng2), _posted(3, deadline=0.0)
    assert m2.progress_transfer(h2, False) == (-1, "posted writes did not complete in time", False)
    assert m2._posted["s"] == 0
