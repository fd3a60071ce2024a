"""``zmq``: a real transfer backend without native libraries (bytes over ZMQ sockets).

Prefill pushes every ``(src, dst, len)`` entry as a ``KV_DATA`` message on the same PUSH socket
that later carries the request's status, so ordering per decode is guaranteed. Decode's receive
thread checks the destination against the request's own pages and ``recv_into``s the payload
straight into its KV buffers, then acknowledges the last entry; prefill only concludes Success
after that acknowledgement (so a dead decode turns into a Failed request, not a silent loss).
Before sending, prefill refuses entries outside the decode's registered regions, as a one-sided
engine would.
"""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Dict, List, Tuple

import zmq

from .. import control
from ..addressing import page_ranges, within_regions
from ..base import BackendClasses
from ..bootstrap import BootstrapServer
from ..decode_side import CommonKVReceiver, DecodeKVManager
from ..manager import role_dispatch
from ..prefill_side import CommonKVSender, PrefillKVManager
from ..states import KVPoll


def _view(addr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(addr)).cast("B")


class ZmqPrefillManager(PrefillKVManager):
    backend_name = "zmq"

    def init_engine(self) -> None:
        self._acks: Dict[int, Tuple[threading.Event, list]] = {}
        self._acks_lock = threading.Lock()

    def handle_extra(self, frames) -> bool:
        if frames[0] != control.KV_ACK:
            return False
        room, ok, reason = control.decode_ack(frames)
        with self._acks_lock:
            slot = self._acks.get(room)
        if slot is not None:
            slot[1].append((ok, reason))
            slot[0].set()
        return True

    def transfer(self, peer, room: int, entries) -> Tuple[int, str]:
        regions = peer.reg.regions()
        for src, dst, n in entries:
            if not within_regions(dst, n, regions):
                return -1, (f"WRITE rejected: remote address {dst:#x}+{n} is not within any "
                            f"registered buffer of the decode")
        if not entries:
            return 0, ""
        ev = threading.Event()
        with self._acks_lock:
            self._acks[room] = (ev, [])
        try:
            rm = str(room).encode()
            tracker = None
            with peer.lock:
                if peer.closed:
                    return -1, "connection to decode is closed"
                for i, (src, dst, n) in enumerate(entries):
                    flags = control.DATA_LAST if i == len(entries) - 1 else 0
                    tracker = peer.sock.send_multipart(
                        [control.KV_DATA, rm, control.encode_data_header(dst, n, flags), _view(src, n)],
                        copy=False, track=True)
            deadline = time.monotonic() + self.env.prefill_send_timeout
            if not ev.wait(max(0.0, deadline - time.monotonic())):
                return -1, f"no acknowledgement from decode within {self.env.prefill_send_timeout}s"
            if tracker is not None:
                tracker.wait(max(0.1, deadline - time.monotonic()))
            ok, reason = self._acks[room][1][0]
            return (0, "") if ok else (-1, f"decode refused the data: {reason}")
        except zmq.ZMQError as e:
            return -1, f"zmq send failed: {e}"
        finally:
            with self._acks_lock:
                self._acks.pop(room, None)


class ZmqDecodeManager(DecodeKVManager):
    backend_name = "zmq"
    # decode's own receive thread does every write, and only into pages of rooms that are still
    # waiting or transferring; data of a failed or cleared room is drained and dropped. So a
    # failed request's pages can go back to the allocator at once (no deferred release needed).
    late_writes_possible = False

    def init_engine(self) -> None:
        self._allowed: Dict[int, List[Tuple[int, int]]] = {}

    def _room_ranges(self, room: int):
        rng = self._allowed.get(room)
        if rng is None:
            pages = self._room_pages.get(room)
            if pages is None:
                return None
            rng = [(self.args.kv_data_ptrs[b] + off, n) for b, off, n in page_ranges(self.args.kv_item_lens, pages)]
            self._allowed[room] = rng
        return rng

    def recv_data(self, sock, room: int) -> None:
        dst, n, flags = control.decode_data_header(sock.recv())
        st = self.status.get(room)
        ranges = self._room_ranges(room) if st in (KVPoll.WaitingForInput, KVPoll.Transferring) else None
        if ranges is None or not within_regions(dst, n, ranges):
            sock.recv()  # drain and drop the payload
            reason = ("KV_DATA for a request that is no longer waiting" if ranges is None
                      else f"KV_DATA at {dst:#x}+{n} outside the request's pages")
            if st not in (None, KVPoll.Failed, KVPoll.Success):
                self.fail(room, reason)
            if flags & control.DATA_LAST:
                self._ack(room, False, reason)
            return
        if st == KVPoll.WaitingForInput:
            self.status.update(room, KVPoll.Transferring)
        got = sock.recv_into(_view(dst, n))
        if got != n:
            self.fail(room, f"KV_DATA size mismatch ({got} != {n})")
            if flags & control.DATA_LAST:
                self._ack(room, False, "size mismatch")
            return
        if flags & control.DATA_LAST:
            self._ack(room, True)

    def _ack(self, room: int, ok: bool, reason: str = "") -> None:
        addr = self._room_addr.get(room)
        if addr is None:
            return
        try:
            self.send_to_prefill(addr, control.encode_ack(room, ok, reason), "ack")
        except RuntimeError:
            pass


ZmqKVManager = role_dispatch("ZmqKVManager", ZmqPrefillManager, ZmqDecodeManager)


class ZmqKVSender(CommonKVSender):
    pass


class ZmqKVReceiver(CommonKVReceiver):
    def clear(self) -> None:
        self.mgr._allowed.pop(self.room, None)
        super().clear()


class ZmqKVBootstrapServer(BootstrapServer):
    pass


def backend_classes() -> BackendClasses:
    return BackendClasses(ZmqKVManager, ZmqKVSender, ZmqKVReceiver, ZmqKVBootstrapServer)


def available() -> bool:
    return True
