"""The prefill (sender) side: decode registrations, per-room metadata, and the transfer workers.

Flow of one room: decode's ``REGISTER`` makes it a peer; its ``META`` opens the room (only that
peer may send the room's metadata or abort it); the scheduler's :class:`CommonKVSender.send`
queues the source pages; a transfer worker builds the (src, dst, len) entries, checks that the
room was not aborted, posts the writes through the backend and reports the terminal
``KV_STATUS`` (with the digest when checksums are on).

Backend hooks (data plane):

* ``on_peer_registered(peer)``                      - a decode registered its buffers;
* ``transfer(peer, room, entries) -> (rc, reason)`` - move the bytes synchronously (rc 0 = success);
* or ``start_transfer`` / ``progress_transfer``      - post the writes, report completion later; the
  worker then keeps up to ``SGLANG_HYDRA_DISAGG_MAX_INFLIGHT_TRANSFERS`` rooms in flight and checks
  for an abort before it posts more writes of a room.

Late writes: posted writes cannot be recalled. A room aborted while its writes are in flight is
acknowledged (``ABORT_ACK``) only once they have settled; a room whose writes may still land (an
engine timeout) is reported ``settled=0`` and never acknowledged, so decode keeps its pages.
"""
from __future__ import annotations

import logging
import queue
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import zmq

from . import control
from .addressing import Entry, build_entries_fast
from .base import BaseKVSender, KVTransferMetric
from .bootstrap import BootstrapError, fetch_rank, register_rank
from .checksum import adler32_pages
from .manager import KVManagerCore
from .states import TERMINAL, KVPoll, KVTransferError

logger = logging.getLogger("sglang_hydra.disagg")

_MIN_NAP = 5e-5     # transfer worker poll back-off while writes are in flight (s)
_MAX_NAP = 1e-3
_UNSETTLED_MEMORY_S = 600.0


@dataclass
class Peer:
    """Prefill's view of one registered decode."""
    reg: control.Registration
    sock: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False  # set under ``lock`` once the socket is closed; senders must check it
    gone: Optional[str] = None  # why this decode is known dead (its control port refuses connections)


_Peer = Peer   # the name the backends and older tests use


@dataclass
class _Job:
    room: int
    src_pages: List[int]


@dataclass
class _Active:
    """A room a transfer worker is working on."""
    job: _Job
    info: control.TransferInfo
    peer: Peer
    entries: List[Entry]
    digest: int
    posted: bool = False        # registered in ``_writing``: writes of the room may be in flight
    handle: Any = None


class PrefillKVManager(KVManagerCore):
    mode = "prefill"
    # a backend whose failed ``transfer`` never leaves writes behind may set this to True
    sync_failure_settled = False

    def _init_role(self) -> None:
        self.peers: Dict[str, Peer] = {}
        self.transfer_infos: Dict[int, control.TransferInfo] = {}
        self.prefill_digests: Dict[int, int] = {}
        self._peers_lock = threading.Lock()
        # rooms with posted writes, and who asked to abort them (answered once they settle)
        self._room_lock = threading.Lock()
        self._writing: Dict[int, _Active] = {}
        self._abort_waiters: Dict[int, str] = {}
        self._unsettled: Dict[int, float] = {}   # room -> when: writes may still land, never ACK
        self.max_transfers_in_flight = self.env.max_inflight_transfers
        self._queues = [queue.Queue() for _ in range(self.env.queue_size)]
        self.bootstrap_addr = f"{self.host}:{self.bootstrap_port}"

    def _start_role_threads(self) -> None:
        self._workers = [threading.Thread(target=self._transfer_worker, args=(q,), daemon=True,
                                          name=f"disagg-transfer-{i}") for i, q in enumerate(self._queues)]
        for w in self._workers:
            w.start()
        self._registered = threading.Event()
        self._keeper = threading.Thread(target=self._keep_registered, daemon=True, name="disagg-bootstrap-keeper")
        self._keeper.start()

    # ---------------------------------------------------------------- backend hooks
    def on_peer_registered(self, peer: Peer) -> None:
        pass

    def transfer(self, peer: Peer, room: int, entries: List[Entry]) -> Tuple[int, str]:
        raise NotImplementedError

    def start_transfer(self, peer: Peer, room: int, entries: List[Entry]) -> Any:
        """Post the writes of one room; returns a handle for :meth:`progress_transfer`.

        The default runs the synchronous :meth:`transfer` (one room at a time per worker).
        """
        rc, reason = self.transfer(peer, room, entries)
        return (rc, reason, rc == 0 or self.sync_failure_settled)

    def progress_transfer(self, handle: Any, stop_submitting: bool) -> Optional[Tuple[int, str, bool]]:
        """``None`` while writes are in flight, else ``(rc, reason, settled)``.

        ``stop_submitting``: the room was aborted, post nothing more (already posted writes still
        have to settle). ``settled`` is False when writes may still land later (an engine timeout):
        the room is then never acknowledged and decode falls back to its release timeout.
        """
        return handle

    def abandon_transfer(self, handle: Any) -> None:
        """Shutdown: the worker stops waiting for ``handle`` (default: nothing to do)."""

    # ---------------------------------------------------------------- bootstrap
    def register_to_bootstrap(self) -> None:
        a = self.args
        payload = {
            "attn_tp_size": 1, "attn_tp_rank": a.engine_rank, "attn_cp_size": 1, "attn_cp_rank": 0,
            "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
            "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": self.host, "rank_port": self.rank_port,
            "page_size": a.page_size, "kv_cache_dtype": a.kv_cache_dtype, "kv_item_lens": a.kv_item_lens,
            "transfer_backend": self.backend_name, "kv_checksum": self.checksum_enabled,
            "prefill_http_port": getattr(self.record, "port", None),
            "decode_allocation_policy": getattr(self.record, "disaggregation_decode_allocation_policy", "early"),
        }
        register_rank(self.bootstrap_addr, payload, retries=self.env.bootstrap_retries,
                      timeout=self.env.bootstrap_http_timeout, backoff=self.env.bootstrap_backoff,
                      secret=self.bootstrap_secret)
        self._registration = payload
        self._registered.set()
        logger.info("[prefill] rank registered at bootstrap %s as tcp://%s", self.bootstrap_addr, self.endpoint)

    def _keep_registered(self) -> None:
        """Re-register with a bootstrap server that restarted (it lost the route table).

        Every heartbeat interval (``SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL``) once registered:
        look up our own rank; a server that answers but does not know us gets the registration
        again (one attempt; the next tick retries). Without this, a bootstrap server that was
        killed and restarted answers every new decode with 503 forever, though prefill is alive.
        """
        while not self._stop.wait(self.env.heartbeat_interval):
            if not self._registered.is_set():
                continue
            try:
                fetch_rank(self.bootstrap_addr, 0, 0, self.args.engine_rank, 0, retries=1,
                           timeout=self.env.bootstrap_http_timeout, secret=self.bootstrap_secret, retry_on=())
                continue
            except BootstrapError as e:
                if "HTTP 404" not in str(e) and "HTTP 503" not in str(e):
                    continue   # unreachable: nothing to re-register with yet
            try:
                register_rank(self.bootstrap_addr, self._registration, retries=1,
                              timeout=self.env.bootstrap_http_timeout, secret=self.bootstrap_secret)
                logger.warning("[prefill] bootstrap %s had lost this rank (restarted?); registered it again",
                               self.bootstrap_addr)
            except BootstrapError as e:
                logger.debug("[prefill] re-registration failed: %s", e)

    # ---------------------------------------------------------------- control messages
    def _handle(self, frames: List[bytes]) -> None:
        kind = frames[0]
        if kind == control.REGISTER:
            self._on_register(control.Registration.decode(frames))
        elif kind == control.META:
            self._on_meta(control.TransferInfo.decode(frames))
        elif kind == control.ABORT:
            room, session = control.decode_abort(frames)
            self._on_abort(room, session)
        elif not self.handle_extra(frames):
            logger.warning("[prefill] unknown control message %r", kind[:32])

    def _on_register(self, reg: control.Registration) -> None:
        if reg.page_size != self.args.page_size or list(reg.kv_item_lens) != list(self.args.kv_item_lens):
            logger.error("[prefill] decode %s has an incompatible layout (page_size %d, item sizes %s); "
                         "ignoring it", reg.session, reg.page_size, sorted(set(reg.kv_item_lens)))
            return
        theirs = (reg.extra or {}).get("kv_checksum")
        if theirs is not None and bool(theirs) != self.checksum_enabled:
            logger.error("[prefill] decode %s has KV checksums %s, this prefill %s; ignoring it (both sides must "
                         "set disaggregation_enable_kv_checksum alike)", reg.session[:8],
                         "on" if theirs else "off", "on" if self.checksum_enabled else "off")
            return
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.SNDTIMEO, int(self.env.prefill_send_timeout * 1000))
        sock.connect(f"tcp://{reg.ip}:{reg.port}")
        peer = Peer(reg=reg, sock=sock)
        self.on_peer_registered(peer)
        with self._peers_lock:
            old = self.peers.pop(reg.session, None)
            self.peers[reg.session] = peer
        if old is not None:
            with old.lock:
                old.closed = True
                old.sock.close(0)
        # tell decode who we are (off the receive thread: the first send waits for the connection)
        body = dict(self.registration_extra(), endpoint=self.endpoint)
        threading.Thread(target=self._send_frames, args=(peer, control.encode_reg_ack(self.session, body),
                                                         "registration ack"),
                         daemon=True, name="disagg-reg-ack").start()
        logger.info("[prefill] decode %s registered: endpoint tcp://%s:%d, %d buffers %s",
                    reg.session[:8], reg.ip, reg.port, len(reg.kv_data_ptrs), reg.extra or "")

    def _on_meta(self, info: control.TransferInfo) -> None:
        """A room's destination pages. The first registered decode to send them owns the room."""
        if info.session not in self.peers:
            logger.warning("[prefill] metadata for room %d from unregistered decode %s", info.room, info.session)
            return
        owner = self.transfer_infos.get(info.room)
        if owner is not None and owner.session != info.session:
            logger.warning("[prefill] metadata for room %d from decode %s ignored: the room belongs to decode %s",
                           info.room, info.session[:8], owner.session[:8])
            return
        self.transfer_infos[info.room] = info
        self.status.update(info.room, KVPoll.WaitingForInput)

    def reject(self, room: int, reason: str) -> None:
        """Fail ``room`` before any transfer and tell its decode why (it need not wait for a timeout)."""
        self.fail(room, reason)
        info = self.transfer_infos.get(room)
        with self._peers_lock:
            peer = self.peers.get(info.session) if info else None
        self._send_status(peer, control.StatusMessage(room, KVPoll.Failed, reason, settled=True))
        # nothing will run for this room here: forget it as a sender's clear() would
        self.status.pop(room)
        self.failure_reasons.pop(room, None)
        self.transfer_infos.pop(room, None)

    def _owns(self, room: int, session: str) -> bool:
        info = self.transfer_infos.get(room)
        return info is not None and info.session == session

    def _on_abort(self, room: int, session: str) -> None:
        """Decode gave up on ``room``: post nothing more; acknowledge once nothing can land."""
        if not self._owns(room, session):
            logger.warning("[prefill] abort of room %d from decode %s ignored: not the room's owner",
                           room, session[:8])
            return
        with self._room_lock:
            self.fail(room, f"request aborted by decode {session}")
            writing = room in self._writing
            if writing:
                self._abort_waiters[room] = session
            unsettled = room in self._unsettled
        if unsettled:
            logger.warning("[prefill] abort of room %d not acknowledged: writes of it may still land", room)
        elif not writing:
            with self._peers_lock:
                peer = self.peers.get(session)
            # on the receive thread: never wait for a decode that is gone (it then relies on its timeout)
            self._send_frames(peer, control.encode_abort_ack(room, self.session), f"abort ack of room {room}",
                              block=False)

    def _send_frames(self, peer: Optional[Peer], frames: List[bytes], what: str, block: bool = True) -> None:
        if peer is None or peer.gone:   # nobody is listening: do not wait a send timeout for it
            return
        try:
            with peer.lock:
                if peer.closed:
                    return
                peer.sock.send_multipart(frames, flags=0 if block else zmq.NOBLOCK)
        except zmq.ZMQError as e:
            logger.warning("[prefill] could not send %s to decode %s: %s", what, peer.reg.session[:8], e)

    def _send_status(self, peer: Optional[Peer], msg: control.StatusMessage) -> None:
        self._send_frames(peer, msg.encode(), f"status of room {msg.room}")

    # ---------------------------------------------------------------- transfer workers
    def add_transfer_request(self, room: int, src_pages: Sequence[int]) -> None:
        # one destination stays on one worker queue, as in the reference (spreading requests of
        # one decode over several workers was measured slower on 2 cores: the threads contend)
        info = self.transfer_infos.get(room)
        key = sum(map(ord, info.session)) if info is not None else room
        self._queues[key % len(self._queues)].put(_Job(room, [int(p) for p in src_pages]))

    def _transfer_worker(self, q: "queue.Queue[_Job]") -> None:
        """Take jobs from ``q`` and keep up to ``max_transfers_in_flight`` of them in flight."""
        active: List[_Active] = []
        nap = _MIN_NAP
        while not self._stop.is_set():
            job = None
            if len(active) < self.max_transfers_in_flight:
                try:
                    job = q.get(timeout=nap if active else 0.1)
                except queue.Empty:
                    job = None
            else:
                time.sleep(nap)
            progressed = False
            while job is not None:
                progressed = True
                a = self._guarded(self._admit, job.room, None, job)
                if a is not None:
                    active.append(a)
                if len(active) >= self.max_transfers_in_flight:
                    break
                try:
                    job = q.get_nowait()
                except queue.Empty:
                    job = None
            for a in list(active):
                if self._guarded(self._step, a.job.room, a, a):
                    active.remove(a)
                    progressed = True
            nap = _MIN_NAP if progressed else min(nap * 2, _MAX_NAP)
        self._abandon(active)

    def _guarded(self, fn, room: int, active: Optional[_Active], *args):
        """Run one step of a job; a crash fails that room and keeps the worker alive."""
        try:
            return fn(*args)
        except Exception as e:
            logger.exception("[prefill] transfer of room %d crashed", room)
            if active is not None:
                self._finish(active, -1, f"transfer thread error: {e!r}", settled=active.handle is None)
                return True
            self.fail(room, f"transfer thread error: {e!r}")
            info = self.transfer_infos.get(room)
            self._send_status(self.peers.get(info.session) if info else None,
                              control.StatusMessage(room, KVPoll.Failed, f"prefill error: {e!r}"))
            return None

    def _admit(self, job: _Job) -> Optional[_Active]:
        room = job.room
        info = self.transfer_infos.get(room)
        peer = self.peers.get(info.session) if info else None
        if self._dead_room(room):   # aborted, or already given up and cleared by the scheduler
            self._send_status(peer, control.StatusMessage(room, KVPoll.Failed, self.failure_reasons.get(room, "failed")))
            return None
        if info is None or peer is None:
            self.fail(room, f"no destination known for room {room}")
            return None
        if peer.gone:   # an earlier room found this decode dead: do not wait a send timeout per room
            self.fail(room, f"decode {peer.reg.ip}:{peer.reg.port} is gone ({peer.gone})")
            return None
        if len(info.dst_pages) != len(job.src_pages):
            reason = (f"page count mismatch for room {room}: prefill sends {len(job.src_pages)}, "
                      f"decode expects {len(info.dst_pages)}")
            self.fail(room, reason)
            self._send_status(peer, control.StatusMessage(room, KVPoll.Failed, reason))
            return None
        digest = 0
        if self.checksum_enabled:
            digest = adler32_pages(self.args.tensors, self.args.kv_item_lens, job.src_pages)
            self.prefill_digests[room] = digest
        entries = build_entries_fast(self.args.kv_data_ptrs, peer.reg.kv_data_ptrs, self.args.kv_item_lens,
                                     job.src_pages, info.dst_pages)
        return _Active(job, info, peer, entries, digest)

    def _dead_room(self, room: int) -> bool:
        """Must nothing more be written for ``room``? Failed (aborted) rooms, and rooms the
        scheduler already cleared (``clear()`` drops the status: never read that as "go on")."""
        st = self.status.get(room)
        return st is None or st == KVPoll.Failed

    def _post(self, a: _Active) -> bool:
        """Register ``a`` as writing unless its room was aborted (then conclude it, nothing written)."""
        room = a.job.room
        with self._room_lock:
            aborted = self._dead_room(room)
            if not aborted:
                self._writing[room] = a
                a.posted = True
        if aborted:
            self._finish(a, -1, "aborted before any write was posted", settled=True)
            return False
        self.status.update(room, KVPoll.Transferring)
        return True

    def _step(self, a: _Active) -> bool:
        """Advance one job; True once it has been concluded."""
        room = a.job.room
        if a.handle is None:
            if a.peer.gone:   # found dead while this room waited: nothing was posted, nothing can land
                self.fail(room, f"decode {a.peer.reg.ip}:{a.peer.reg.port} is gone ({a.peer.gone})")
                self._finish(a, -1, f"decode is gone ({a.peer.gone})", settled=True)
                return True
            if not self._post(a):
                return True
            a.handle = self.start_transfer(a.peer, room, a.entries)
        res = self.progress_transfer(a.handle, self._dead_room(room))
        if res is None:
            return False
        rc, reason, settled = res
        self._finish(a, rc, reason, settled)
        return True

    @staticmethod
    def _decode_gone(peer: Peer) -> Optional[str]:
        """Why ``peer`` is provably dead (its control port refuses connections), or None.

        Checked after a failed transfer only: a decode killed mid-run otherwise costs every one
        of its queued rooms a full send timeout in turn (found by the fault matrix: 8 rooms x
        ``SGLANG_HYDRA_DISAGG_PREFILL_SEND_TIMEOUT``). A timeout is not proof (a slow or cut link).
        """
        try:
            with socket.create_connection((peer.reg.ip, int(peer.reg.port)), timeout=0.5):
                return None
        except ConnectionRefusedError:
            return "its control port refuses connections"
        except OSError:
            return None

    def _finish(self, a: _Active, rc: int, reason: str, settled: bool) -> None:
        room, peer = a.job.room, a.peer
        if rc != 0 and peer.gone is None:
            peer.gone = self._decode_gone(peer)
        if rc != 0:
            reason = f"Failed to send kv chunk of {room} to {peer.reg.ip}:{peer.reg.port}: {reason}"
            if self.status.get(room) != KVPoll.Failed:
                logger.warning("[prefill] %s", reason)
            self.fail(room, reason)
        else:
            self.status.update(room, KVPoll.Success)   # no-op when the room was aborted meanwhile
        with self._room_lock:
            self._writing.pop(room, None)
            waiter = self._abort_waiters.pop(room, None)
            if not settled:
                now = time.monotonic()
                self._unsettled[room] = now
                for r in [r for r, t in self._unsettled.items() if now - t > _UNSETTLED_MEMORY_S]:
                    del self._unsettled[r]
        if self.status.get(room) == KVPoll.Success:
            self._send_status(peer, control.StatusMessage(room, KVPoll.Success, "", a.digest,
                                                          self.signature if a.digest else 0))
        else:
            self._send_status(peer, control.StatusMessage(room, KVPoll.Failed,
                                                          self.failure_reasons.get(room, reason or "failed"),
                                                          settled=settled))
        if waiter is not None and settled:
            with self._peers_lock:
                wpeer = self.peers.get(waiter)
            self._send_frames(wpeer, control.encode_abort_ack(room, self.session), f"abort ack of room {room}")

    def _abandon(self, active: List[_Active]) -> None:
        """Shutdown: post nothing more and give posted writes a moment to settle."""
        deadline = time.monotonic() + 2.0
        pending = [a for a in active if a.handle is not None]
        while pending and time.monotonic() < deadline:
            still = []
            for a in pending:
                try:
                    if self.progress_transfer(a.handle, True) is None:
                        still.append(a)
                except Exception:
                    logger.debug("progress during shutdown failed", exc_info=True)
            pending = still
            if pending:
                time.sleep(0.005)
        for a in pending:
            try:
                self.abandon_transfer(a.handle)
            except Exception:
                logger.debug("abandon_transfer failed", exc_info=True)

    # ---------------------------------------------------------------- teardown
    def _close_role(self) -> None:
        self._keeper.join(timeout=self.env.bootstrap_http_timeout + 1)
        # a worker finishes its current job first; that is bounded by the send timeout
        for t in self._workers:
            t.join(timeout=self.env.prefill_send_timeout + 2)
        for p in list(self.peers.values()):
            with p.lock:
                p.closed = True
                p.sock.close(0)


class CommonKVSender(BaseKVSender):
    """One room on the prefill side, as the scheduler drives it (init, send, poll, clear)."""

    def __init__(self, mgr: PrefillKVManager, bootstrap_addr: str, bootstrap_room: int, **_):
        self.mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.room = int(bootstrap_room)
        self.init_time = time.monotonic()
        self.num_pages: Optional[int] = None
        self._sent_at: Optional[float] = None
        self._done_at: Optional[float] = None
        self._bytes = 0
        mgr.status.update(self.room, KVPoll.Bootstrapping)

    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None:
        self.num_pages = int(num_kv_indices)

    def send(self, kv_indices, state_indices=None, num_kv_tokens=None) -> None:
        pages = [int(p) for p in kv_indices]
        self._sent_at = time.monotonic()
        self._bytes = len(pages) * sum(self.mgr.args.kv_item_lens)
        self.mgr.add_transfer_request(self.room, pages)

    def poll(self) -> KVPoll:
        st = self.mgr.status.get(self.room)
        if st is None:
            return KVPoll.Failed
        if st == KVPoll.Bootstrapping and time.monotonic() - self.init_time > self.mgr.env.bootstrap_timeout:
            self.mgr.fail(self.room, f"Request {self.room} timed out after "
                                     f"{self.mgr.env.bootstrap_timeout}s in KVPoll.Bootstrapping")
            st = KVPoll.Failed
        if self.mgr.env.failure_prob > 0 and st not in TERMINAL and random.random() < self.mgr.env.failure_prob:
            self.mgr.fail(self.room, "injected failure (SGLANG_TEST_DISAGG_FAILURE_PROB)")
            st = KVPoll.Failed
        if st in TERMINAL and self._done_at is None:
            self._done_at = time.monotonic()
        return st

    def failure_exception(self):
        raise KVTransferError(self.room, self.mgr.failure_reasons.get(self.room, "unknown failure"))

    def get_transfer_metric(self) -> KVTransferMetric:
        lat = (self._done_at - self._sent_at) if (self._sent_at and self._done_at) else None
        return KVTransferMetric(transfer_latency_s=lat, transfer_total_bytes=self._bytes or None)

    def abort(self) -> None:
        self.mgr.fail(self.room, "aborted by prefill")

    def clear(self) -> None:
        self.mgr.status.pop(self.room)
        self.mgr.failure_reasons.pop(self.room, None)
        self.mgr.transfer_infos.pop(self.room, None)
        self.mgr.prefill_digests.pop(self.room, None)
