"""Backend-neutral manager, sender, receiver and bootstrap server.

The control plane (bootstrap registry, registration / per-request / status messages, timeouts,
heartbeats, checksums) lives here. A backend subclasses :class:`CommonKVManager` and supplies
the data plane through a handful of hooks:

* ``init_engine()`` / ``close_engine()``          - bring the transport up and down;
* ``registration_extra()``                         - decode: what the prefill needs to reach it;
* ``on_peer_registered(peer)``                     - prefill: a decode registered its buffers;
* ``transfer(peer, room, entries) -> (rc, reason)``- prefill: move the bytes (rc 0 = success);
* ``recv_data(sock, room)``                        - decode: a ``KV_DATA`` message arrived.

A backend whose engine can post writes and report completion later overrides the pair
``start_transfer`` / ``progress_transfer`` instead of ``transfer``; the transfer worker then keeps
several requests in flight (``SGLANG_HYDRA_DISAGG_MAX_INFLIGHT_TRANSFERS`` per worker) and checks
for an abort before it posts more writes of a request.

Late writes (deferred decode KV release). With a one-sided engine, prefill can still be writing
into a request's destination pages after decode gave up on it (timeout, heartbeat loss, injected
failure, decode-side deadline). Decode therefore does not hand such pages back at once: the
receiver's :meth:`CommonKVReceiver.is_abort_release_safe` stays False until prefill confirmed that
no write of the room can land any more (``ABORT_ACK``, or a terminal ``KV_STATUS`` marked settled),
or the prefill is proven gone (heartbeat lost *and* the backend's data-plane probe fails), and the
caller keeps the pages quarantined until then or until
``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT`` (30 s) passes. Prefill, for its part,
never posts a write for a room it knows is aborted, and answers ``ABORT`` only once the room's
posted writes have settled. ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE=0`` restores the
immediate release.
"""
from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import zmq

try:  # numpy arrives with torch / matplotlib; the builder falls back to pure Python without it
    import numpy as np
except ImportError:  # pragma: no cover
    np = None

from . import control
from .addressing import Entry, build_entries, group_contiguous_runs
from .base import BaseKVBootstrapServer, BaseKVManager, BaseKVReceiver, BaseKVSender, KVTransferMetric
from .bootstrap import (BootstrapError, BootstrapServer, check_health, fetch_rank, fetch_server_info,
                        register_rank)
from .buffers import KVArgs
from .checksum import adler32_pages, layout_signature
from .envs import DisaggEnv
from .states import DEFAULT_PREFILL_FAILURE_REASON, TERMINAL, KVPoll, KVTransferError, StatusTable

logger = logging.getLogger("sglang_hydra.disagg")


class CommonKVBootstrapServer(BootstrapServer, BaseKVBootstrapServer):
    def __init__(self, host: str, port: int, **kwargs):
        BootstrapServer.__init__(self, host, port, **kwargs)


@dataclass
class _PrefillConn:
    """Decode's cached view of one prefill server."""
    addr: str
    info: Dict[str, Any]
    endpoint: str
    sock: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    misses: int = 0


@dataclass
class _Peer:
    """Prefill's view of one registered decode."""
    reg: control.Registration
    sock: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    closed: bool = False  # set under ``lock`` once the socket is closed; senders must check it


@dataclass
class _Job:
    room: int
    src_pages: List[int]


@dataclass
class _Active:
    """A job a transfer worker is working on (prefill side)."""
    job: _Job
    info: control.TransferInfo
    peer: _Peer
    entries: List[Entry]
    digest: int
    not_before: float = 0.0     # test delay: nothing is posted before this time
    posted: bool = False        # registered in ``_writing``: writes of the room may be in flight
    force: bool = False         # test hook: the writes count as already posted (an abort cannot recall them)
    handle: Any = None


def _env_flag(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _env_num(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from e


def _room_delays(raw: Optional[str]) -> Dict[int, float]:
    """``"3:2.5,7:1"`` -> ``{3: 2.5, 7: 1.0}`` (test hook SGLANG_HYDRA_TEST_DISAGG_SLOW_WRITE_ROOMS)."""
    out: Dict[int, float] = {}
    for part in (raw or "").split(","):
        part = part.strip()
        if part:
            room, _, sec = part.partition(":")
            out[int(room)] = float(sec or 0)
    return out


def build_entries_fast(src_ptrs: Sequence[int], dst_ptrs: Sequence[int], item_lens: Sequence[int],
                       src_pages: Sequence[int], dst_pages: Sequence[int]) -> List[Entry]:
    """``build_entries(..., group_contiguous_runs(src_pages, dst_pages))`` with numpy.

    Same entries in the same order (buffers in registration order, then runs); a request of
    64 layer buffers x 64 scattered pages (4,096 entries) takes ~2 ms instead of ~4.6 ms
    (most of what is left is making the Python tuples the backends expect).
    """
    if not (len(src_ptrs) == len(dst_ptrs) == len(item_lens)):
        raise ValueError(f"buffer lists differ: {len(src_ptrs)} source pointers, "
                         f"{len(dst_ptrs)} destination pointers, {len(item_lens)} item sizes")
    n = len(src_pages)
    if n != len(dst_pages):
        raise ValueError(f"page lists differ in length: {n} source vs {len(dst_pages)} destination")
    if n == 0 or not len(src_ptrs):
        return []
    if np is None:  # pragma: no cover
        return build_entries(src_ptrs, dst_ptrs, item_lens, group_contiguous_runs(src_pages, dst_pages))
    sp = np.asarray(src_pages, dtype=np.int64)
    dp = np.asarray(dst_pages, dtype=np.int64)
    cut = np.flatnonzero((np.diff(sp) != 1) | (np.diff(dp) != 1)) + 1
    starts = np.concatenate(([0], cut))
    counts = np.diff(np.concatenate((starts, [n])))
    il = np.asarray(item_lens, dtype=np.int64)[:, None]
    src = np.asarray(src_ptrs, dtype=np.int64)[:, None] + sp[starts][None, :] * il
    dst = np.asarray(dst_ptrs, dtype=np.int64)[:, None] + dp[starts][None, :] * il
    size = counts[None, :] * il
    return list(zip(src.ravel().tolist(), dst.ravel().tolist(), size.ravel().tolist()))


_MIN_NAP = 5e-5     # transfer worker poll back-off while writes are in flight (s)
_MAX_NAP = 1e-3
_UNSETTLED_MEMORY_S = 600.0


class CommonKVManager(BaseKVManager):
    backend_name = "common"

    def __init__(self, args: KVArgs, disaggregation_mode: str, record: Any, *, host: str = "127.0.0.1",
                 bootstrap_port: Optional[int] = None, env: Optional[DisaggEnv] = None, **_):
        if disaggregation_mode not in ("prefill", "decode"):
            raise ValueError(f"a KV manager needs mode 'prefill' or 'decode', got {disaggregation_mode!r}")
        self.args = args
        self.mode = disaggregation_mode
        self.record = record
        self.host = host
        self.env = env or DisaggEnv.from_env()
        self.status = StatusTable()
        self.checksum_enabled = bool(getattr(record, "disaggregation_enable_kv_checksum", False))
        self.signature = layout_signature(args.page_size, args.kv_cache_dtype, args.kv_item_lens)
        self.bootstrap_port = int(bootstrap_port if bootstrap_port is not None
                                  else getattr(record, "disaggregation_bootstrap_port", 8998))
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self.rank_port = self._pull.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"{host}:{self.rank_port}"
        self.session = uuid.uuid4().hex
        self.failure_reasons: Dict[int, str] = {}
        self.checksum_results: Dict[int, Optional[bool]] = {}
        self._rng = random.Random()
        # deferred decode KV release (reference names and defaults)
        self.deferred_release = _env_flag("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", True)
        self.deferred_release_timeout = _env_num("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0)
        # every attribute exists before init_engine() runs, so threads a backend starts there
        # may use them; our own threads start only once the engine is up
        if self.mode == "prefill":
            self.peers: Dict[str, _Peer] = {}
            self.transfer_infos: Dict[int, control.TransferInfo] = {}
            self.prefill_digests: Dict[int, int] = {}
            self._peers_lock = threading.Lock()
            # rooms with posted writes, and who asked to abort them (answered once they settle)
            self._room_lock = threading.Lock()
            self._writing: Dict[int, _Active] = {}
            self._abort_waiters: Dict[int, str] = {}
            self._unsettled: Dict[int, float] = {}   # room -> when: writes may still land, never ACK
            self.max_transfers_in_flight = max(1, int(_env_num("SGLANG_HYDRA_DISAGG_MAX_INFLIGHT_TRANSFERS", 16)))
            self._slow_rooms = _room_delays(os.environ.get("SGLANG_HYDRA_TEST_DISAGG_SLOW_WRITE_ROOMS"))
            self._queues = [queue.Queue() for _ in range(self.env.queue_size)]
            self.bootstrap_addr = f"{host}:{self.bootstrap_port}"
        else:
            self._conns: Dict[str, _PrefillConn] = {}
            self._conn_lock = threading.Lock()
            self._room_addr: Dict[int, str] = {}
            self._room_pages: Dict[int, List[int]] = {}
            self._prefill_done: Set[int] = set()         # prefill will not write these rooms again
            self._peer_extras: Dict[str, Dict[str, Any]] = {}   # prefill control endpoint -> REG_ACK body
            self._lost_endpoints: Set[str] = set()       # prefills the heartbeat declared lost
        self.init_engine()
        logger.info("[%s] backend=%s control endpoint tcp://%s; registered %d KV buffers "
                    "(%d bytes total, item sizes %s)", self.mode, self.backend_name, self.endpoint,
                    len(args.kv_data_ptrs), sum(args.kv_data_lens), sorted(set(args.kv_item_lens)))
        if self.mode == "prefill":
            self._workers = [threading.Thread(target=self._transfer_worker, args=(q,), daemon=True,
                                              name=f"disagg-transfer-{i}")
                             for i, q in enumerate(self._queues)]
            for w in self._workers:
                w.start()
        else:
            self._hb = threading.Thread(target=self._heartbeat_loop, daemon=True, name="disagg-heartbeat")
            self._hb.start()
        self._loop = threading.Thread(target=self._recv_loop, daemon=True, name=f"disagg-{self.mode}-recv")
        self._loop.start()

    # ---------------------------------------------------------------- backend hooks
    def init_engine(self) -> None:
        pass

    def close_engine(self) -> None:
        pass

    def registration_extra(self) -> Dict[str, Any]:
        return {}

    def on_peer_registered(self, peer: _Peer) -> None:
        pass

    def transfer(self, peer: _Peer, room: int, entries: List[Entry]) -> Tuple[int, str]:
        raise NotImplementedError

    # a backend whose failed ``transfer`` never leaves writes behind may set this to True
    sync_failure_settled = False
    # decode: can a peer write into our registered buffers without this process taking part
    # (one-sided engines)? If not (the zmq backend's own receive thread does every write and
    # drops data of rooms that are no longer live), failed requests release their pages at once.
    late_writes_possible = True

    def start_transfer(self, peer: _Peer, room: int, entries: List[Entry]) -> Any:
        """Post the writes of one request; returns a handle for :meth:`progress_transfer`.

        The default runs the synchronous :meth:`transfer` (backends written for the old hook work
        unchanged, one request at a time per worker).
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

    def prefill_writes_impossible(self, endpoint: str) -> bool:
        """Decode: can the prefill behind ``endpoint`` be proven unable to write (its engine gone)?"""
        return False

    def recv_data(self, sock, room: int) -> None:
        while sock.getsockopt(zmq.RCVMORE):
            sock.recv()

    # ---------------------------------------------------------------- shared
    def fail(self, room: int, reason: str) -> None:
        if room not in self.failure_reasons and self.status.get(room) not in (None, KVPoll.Failed):
            self.failure_reasons[room] = reason
        self.status.fail(room, reason)

    def handle_extra(self, frames: List[bytes]) -> bool:
        """Backend hook for message kinds the common control plane does not know."""
        return False

    def register_to_bootstrap(self) -> None:
        if self.mode != "prefill":
            return
        a = self.args
        payload = {
            "attn_tp_size": 1, "attn_tp_rank": a.engine_rank, "attn_cp_size": 1, "attn_cp_rank": 0,
            "attn_dp_size": 1, "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0,
            "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": self.host, "rank_port": self.rank_port,
            "page_size": a.page_size, "kv_cache_dtype": a.kv_cache_dtype, "kv_item_lens": a.kv_item_lens,
            "transfer_backend": self.backend_name,
            "prefill_http_port": getattr(self.record, "port", None),
            "decode_allocation_policy": getattr(self.record, "disaggregation_decode_allocation_policy", "early"),
        }
        register_rank(self.bootstrap_addr, payload, retries=self.env.bootstrap_retries,
                      timeout=self.env.bootstrap_http_timeout, backoff=self.env.bootstrap_backoff)
        logger.info("[prefill] rank registered at bootstrap %s as tcp://%s", self.bootstrap_addr, self.endpoint)

    def _recv_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pull, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(100):
                    continue
                head = self._pull.recv()
                if head == control.KV_DATA:
                    room = int(self._pull.recv())
                    self.recv_data(self._pull, room)
                    continue
                frames = [head]
                while self._pull.getsockopt(zmq.RCVMORE):
                    frames.append(self._pull.recv())
                self._handle(frames)
            except zmq.ZMQError:
                if self._stop.is_set():
                    return
                logger.exception("[%s] control socket error", self.mode)
            except Exception:  # a malformed message must not kill the loop
                logger.exception("[%s] failed to handle a control message", self.mode)

    def _handle(self, frames: List[bytes]) -> None:
        kind = frames[0]
        if self.mode == "prefill":
            if kind == control.REGISTER:
                self._on_register(control.Registration.decode(frames))
            elif kind == control.META:
                info = control.TransferInfo.decode(frames)
                if info.session not in self.peers:
                    logger.warning("[prefill] metadata for room %d from unregistered decode %s",
                                   info.room, info.session)
                    return
                self.transfer_infos[info.room] = info
                self.status.update(info.room, KVPoll.WaitingForInput)
            elif kind == control.ABORT:
                room, session = control.decode_abort(frames)
                self._on_abort(room, session)
            elif not self.handle_extra(frames):
                logger.warning("[prefill] unknown control message %r", kind[:32])
        else:
            if kind == control.KV_STATUS:
                self._on_status(control.StatusMessage.decode(frames))
            elif kind == control.ABORT_ACK:
                room, _ = control.decode_abort_ack(frames)
                if self.status.get(room) is not None:
                    self._prefill_done.add(room)
                    logger.debug("[decode] prefill acknowledged the abort of room %d", room)
            elif kind == control.REG_ACK:
                _, body = control.decode_reg_ack(frames)
                if body.get("endpoint"):
                    self._peer_extras[str(body["endpoint"])] = body
            elif not self.handle_extra(frames):
                logger.warning("[decode] unknown control message %r", kind[:32])

    # ---------------------------------------------------------------- prefill side
    def _on_register(self, reg: control.Registration) -> None:
        if reg.page_size != self.args.page_size or list(reg.kv_item_lens) != list(self.args.kv_item_lens):
            logger.error("[prefill] decode %s has an incompatible layout (page_size %d, item sizes %s); "
                         "ignoring it", reg.session, reg.page_size, sorted(set(reg.kv_item_lens)))
            return
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.SNDTIMEO, int(self.env.prefill_send_timeout * 1000))
        sock.connect(f"tcp://{reg.ip}:{reg.port}")
        peer = _Peer(reg=reg, sock=sock)
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

    def add_transfer_request(self, room: int, src_pages: Sequence[int]) -> None:
        # one destination stays on one worker queue, as in the reference (spreading requests of
        # one decode over several workers was measured slower on 2 cores: the threads contend)
        info = self.transfer_infos.get(room)
        key = sum(map(ord, info.session)) if info is not None else room
        self._queues[key % len(self._queues)].put(_Job(room, [int(p) for p in src_pages]))

    def _send_frames(self, peer: Optional[_Peer], frames: List[bytes], what: str, block: bool = True) -> None:
        if peer is None:
            return
        try:
            with peer.lock:
                if peer.closed:
                    return
                peer.sock.send_multipart(frames, flags=0 if block else zmq.NOBLOCK)
        except zmq.ZMQError as e:
            logger.warning("[prefill] could not send %s to decode %s: %s", what, peer.reg.session[:8], e)

    def _send_status(self, peer: Optional[_Peer], msg: control.StatusMessage) -> None:
        self._send_frames(peer, msg.encode(), f"status of room {msg.room}")

    def _on_abort(self, room: int, session: str) -> None:
        """Decode gave up on ``room``: post nothing more; acknowledge once nothing can land."""
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

    def _transfer_worker(self, q: "queue.Queue[_Job]") -> None:
        """Take jobs from ``q`` and keep up to ``max_transfers_in_flight`` of them in flight."""
        active: List[_Active] = []
        nap = _MIN_NAP
        while not self._stop.is_set():
            job = None
            if len(active) < self.max_transfers_in_flight:
                try:
                    job = q.get(timeout=self._wait_time(active, nap))
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

    @staticmethod
    def _wait_time(active: List[_Active], nap: float) -> float:
        if not active:
            return 0.1
        if all(a.handle is None for a in active):   # only delayed jobs: sleep until the first is due
            return max(0.0, min(0.1, min(a.not_before for a in active) - time.monotonic()))
        return nap

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
        a = _Active(job, info, peer, entries, digest)
        slow = self._slow_rooms.get(room)
        if slow is not None:
            # test hook: the room's writes are posted now (past the abort check) and land `slow` s later
            a.not_before = time.monotonic() + slow
            a.force = True
            if not self._post(a):
                return None
        elif self.env.test_transfer_delay > 0:
            a.not_before = time.monotonic() + self.env.test_transfer_delay
        return a

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
            if time.monotonic() < a.not_before:
                return False
            if not a.posted and not self._post(a):
                return True
            a.handle = self.start_transfer(a.peer, room, a.entries)
        stop = not a.force and self._dead_room(room)
        res = self.progress_transfer(a.handle, stop)
        if res is None:
            return False
        rc, reason, settled = res
        self._finish(a, rc, reason, settled)
        return True

    def _finish(self, a: _Active, rc: int, reason: str, settled: bool) -> None:
        room, peer = a.job.room, a.peer
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

    # ---------------------------------------------------------------- decode side
    def ensure_prefill(self, addr: str) -> _PrefillConn:
        with self._conn_lock:
            conn = self._conns.get(addr)
            if conn is not None:
                return conn
            kw = dict(retries=self.env.bootstrap_retries, timeout=self.env.bootstrap_http_timeout,
                      backoff=self.env.bootstrap_backoff)
            info = fetch_server_info(addr, **kw)
            if int(info["page_size"]) != self.args.page_size:
                raise RuntimeError(f"Page size mismatch: prefill {addr} uses {info['page_size']}, this decode "
                                   f"{self.args.page_size}. Both servers must use the same --page-size value.")
            if str(info["kv_cache_dtype"]) != self.args.kv_cache_dtype:
                raise RuntimeError(f"KV cache dtype mismatch: prefill {info['kv_cache_dtype']}, decode "
                                   f"{self.args.kv_cache_dtype}")
            if info.get("kv_item_lens") and list(info["kv_item_lens"]) != list(self.args.kv_item_lens):
                raise RuntimeError("KV layout mismatch: per-page buffer sizes differ between prefill and decode")
            if info.get("transfer_backend") and info["transfer_backend"] != self.backend_name:
                raise RuntimeError(f"transfer backend mismatch: prefill uses {info['transfer_backend']!r}, "
                                   f"decode {self.backend_name!r}")
            rank = fetch_rank(addr, 0, 0, self.args.engine_rank, 0, **kw)
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, int(self.env.zmq_send_timeout * 1000))
            endpoint = f"{rank['rank_ip']}:{rank['rank_port']}"
            sock.connect(f"tcp://{endpoint}")
            a = self.args
            reg = control.Registration(session=self.session, ip=self.host, port=self.rank_port,
                                       kv_data_ptrs=a.kv_data_ptrs, kv_data_lens=a.kv_data_lens,
                                       kv_item_lens=a.kv_item_lens, page_size=a.page_size,
                                       kv_cache_dtype=a.kv_cache_dtype, engine_rank=a.engine_rank,
                                       extra=self.registration_extra())
            try:
                sock.send_multipart(reg.encode())
            except zmq.ZMQError as e:
                sock.close(0)
                raise RuntimeError(f"registration to prefill {endpoint} failed: {e}") from e
            conn = _PrefillConn(addr=addr, info=info, endpoint=endpoint, sock=sock)
            self._conns[addr] = conn
            self._lost_endpoints.discard(endpoint)
            logger.info("[decode] bootstrap %s -> prefill rank tcp://%s; registered %d buffers as %s",
                        addr, endpoint, len(a.kv_data_ptrs), self.session[:8])
            return conn

    def drop_prefill(self, addr: str) -> None:
        with self._conn_lock:
            conn = self._conns.pop(addr, None)
        if conn is not None:
            with conn.lock:
                conn.sock.close(0)

    def send_to_prefill(self, addr: str, frames: List[bytes], what: str) -> None:
        with self._conn_lock:
            conn = self._conns.get(addr)
        if conn is None:
            raise RuntimeError(f"{what} to prefill {addr} failed: not connected")
        try:
            with conn.lock:
                conn.sock.send_multipart(frames)
        except zmq.ZMQError as e:
            raise RuntimeError(f"{what} to prefill {conn.endpoint} failed: {e}") from e

    def _on_status(self, msg: control.StatusMessage) -> None:
        room = msg.room
        if self.status.get(room) is None:
            return
        if msg.status in TERMINAL and msg.settled:
            # before the status changes: whoever sees the room terminal must also see this
            self._prefill_done.add(room)
        if msg.status == KVPoll.Success:
            ok = self._verify_checksum(room, msg)
            if ok is False:
                self.fail(room, f"KV checksum mismatch for room {room}")
            else:
                self.status.update(room, KVPoll.Success)
        elif msg.status == KVPoll.Failed:
            self.fail(room, msg.reason or DEFAULT_PREFILL_FAILURE_REASON)
        else:
            self.status.update(room, msg.status)

    def _verify_checksum(self, room: int, msg: control.StatusMessage) -> Optional[bool]:
        if not self.checksum_enabled or msg.digest == 0:
            self.checksum_results[room] = None
            return None
        if msg.signature != self.signature:
            logger.warning("[decode] KV checksum skipped for room %d: prefill layout signature %x differs "
                           "from ours %x", room, msg.signature, self.signature)
            self.checksum_results[room] = None
            return None
        pages = self._room_pages.get(room, [])
        p = self.env.checksum_mismatch_prob
        if pages and p > 0 and self._rng.random() < p:
            # fault injection: really flip one received byte so the digest (and the data) differ
            t = self.args.tensors[0].reshape(-1).view(__import__("torch").uint8)
            off = pages[0] * self.args.kv_item_lens[0]
            t[off] ^= 0xFF
        local = adler32_pages(self.args.tensors, self.args.kv_item_lens, pages)
        ok = local == msg.digest
        self.checksum_results[room] = ok
        if not ok:
            logger.warning("[decode] KV checksum mismatch for room %d: prefill %08x, decode %08x",
                           room, msg.digest, local)
        return ok

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.env.heartbeat_interval):
            live: Dict[str, List[int]] = {}
            for room, st in self.status.rooms().items():
                if st not in TERMINAL and room in self._room_addr:
                    live.setdefault(self._room_addr[room], []).append(room)
            for addr, rooms in live.items():
                with self._conn_lock:
                    conn = self._conns.get(addr)
                if conn is None:
                    continue
                if check_health(addr, timeout=min(2.0, self.env.heartbeat_interval * 2)):
                    conn.misses = 0
                    continue
                conn.misses += 1
                if conn.misses >= self.env.heartbeat_max_failure:
                    reason = f"Lost connection with prefill instance (bootstrap_addr: {addr})"
                    logger.warning("[decode] %s; failing %d request(s)", reason, len(rooms))
                    self._lost_endpoints.add(conn.endpoint)
                    self.drop_prefill(addr)
                    for room in rooms:
                        self.fail(room, reason)

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._loop.join(timeout=2)
        # a worker finishes its current job first; that is bounded by the send timeout
        limit = self.env.prefill_send_timeout + self.env.test_transfer_delay + 2
        for t in getattr(self, "_workers", []):
            t.join(timeout=limit)
        for p in list(getattr(self, "peers", {}).values()):
            with p.lock:
                p.closed = True
                p.sock.close(0)
        for c in list(getattr(self, "_conns", {}).values()):
            c.sock.close(0)
        self._pull.close(0)
        try:
            self.close_engine()
        finally:
            self._ctx.term()


class CommonKVSender(BaseKVSender):
    def __init__(self, mgr: CommonKVManager, bootstrap_addr: str, bootstrap_room: int, **_):
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


class CommonKVReceiver(BaseKVReceiver):
    def __init__(self, mgr: CommonKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None, **_):
        self.mgr = mgr
        self.bootstrap_addr = bootstrap_addr
        self.room = int(bootstrap_room)
        self.init_time: Optional[float] = None
        self.pages: List[int] = []
        self.metadata_sent = False       # prefill knows our destination pages (it may write them)
        self.abort_notified = False
        self.prefill_endpoint: Optional[str] = None
        mgr.failure_reasons.pop(self.room, None)
        mgr._prefill_done.discard(self.room)
        mgr.status.update(self.room, KVPoll.Bootstrapping)
        mgr._room_addr[self.room] = bootstrap_addr

    def init(self, prefill_dp_rank: int = 0) -> None:
        try:
            self.mgr.ensure_prefill(self.bootstrap_addr)
        except (BootstrapError, RuntimeError) as e:
            self.mgr.fail(self.room, str(e))
            return
        self.mgr.status.update(self.room, KVPoll.WaitingForInput)

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None) -> None:
        if self.mgr.status.get(self.room) != KVPoll.WaitingForInput:
            return
        self.pages = [int(p) for p in kv_indices]
        self.mgr._room_pages[self.room] = self.pages
        self.init_time = time.monotonic()
        info = control.TransferInfo(self.room, self.mgr.session, self.pages)
        try:
            self.mgr.send_to_prefill(self.bootstrap_addr, info.encode(), "send metadata")
        except RuntimeError as e:
            self.mgr.fail(self.room, str(e))
            return
        self.metadata_sent = True
        conn = self.mgr._conns.get(self.bootstrap_addr)
        self.prefill_endpoint = conn.endpoint if conn is not None else None

    def poll(self) -> KVPoll:
        st = self.mgr.status.get(self.room)
        if st is None:
            return KVPoll.Failed
        if (st in (KVPoll.WaitingForInput, KVPoll.Transferring) and self.init_time is not None
                and time.monotonic() - self.init_time > self.mgr.env.waiting_timeout):
            self.mgr.fail(self.room, f"Request {self.room} timed out after {self.mgr.env.waiting_timeout}s "
                                     f"in KVPoll.{st.name}")
            self._notify_abort()
            st = KVPoll.Failed
        if self.mgr.env.failure_prob > 0 and st not in TERMINAL and random.random() < self.mgr.env.failure_prob:
            self.mgr.fail(self.room, "injected failure (SGLANG_TEST_DISAGG_FAILURE_PROB)")
            st = KVPoll.Failed
        return st

    def _notify_abort(self) -> None:
        if not self.metadata_sent or self.abort_notified:
            return
        try:
            self.mgr.send_to_prefill(self.bootstrap_addr, control.encode_abort(self.room, self.mgr.session), "abort")
        except RuntimeError:
            return
        self.abort_notified = True

    def ensure_abort_notified(self) -> None:
        """A failed room whose pages prefill knows: make sure prefill was told to stop writing."""
        if self.metadata_sent and self.room not in self.mgr._prefill_done:
            self._notify_abort()

    def is_abort_release_safe(self) -> bool:
        """Can the pages of this (failed) room go back to the allocator now?

        Yes if prefill never learned them, if this backend cannot be written to behind our back,
        if deferred release is off, if prefill confirmed it will not write them again (ABORT_ACK
        or a settled terminal status), or if the prefill was declared lost by the heartbeat and
        the backend proves its data plane gone. Otherwise the caller keeps them quarantined
        (until this turns True or ``mgr.deferred_release_timeout`` passes).
        """
        mgr = self.mgr
        if not self.metadata_sent or not mgr.late_writes_possible or not mgr.deferred_release:
            return True
        if self.room in mgr._prefill_done:
            return True
        ep = self.prefill_endpoint
        return ep is not None and ep in mgr._lost_endpoints and mgr.prefill_writes_impossible(ep)

    def failure_exception(self):
        raise KVTransferError(self.room, self.mgr.failure_reasons.get(self.room, DEFAULT_PREFILL_FAILURE_REASON))

    def abort(self) -> None:
        self.mgr.fail(self.room, "aborted by decode")
        self._notify_abort()

    def clear(self) -> None:
        self.mgr.status.pop(self.room)
        self.mgr.failure_reasons.pop(self.room, None)
        self.mgr._room_addr.pop(self.room, None)
        self.mgr._room_pages.pop(self.room, None)
        self.mgr.checksum_results.pop(self.room, None)
        self.mgr._prefill_done.discard(self.room)
