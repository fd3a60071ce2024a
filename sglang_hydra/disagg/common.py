"""Backend-neutral manager, sender, receiver and bootstrap server.

The control plane (bootstrap registry, registration / per-request / status messages, timeouts,
heartbeats, checksums) lives here. A backend subclasses :class:`CommonKVManager` and supplies
the data plane through a handful of hooks:

* ``init_engine()`` / ``close_engine()``          - bring the transport up and down;
* ``registration_extra()``                         - decode: what the prefill needs to reach it;
* ``on_peer_registered(peer)``                     - prefill: a decode registered its buffers;
* ``transfer(peer, room, entries) -> (rc, reason)``- prefill: move the bytes (rc 0 = success);
* ``recv_data(sock, room)``                        - decode: a ``KV_DATA`` message arrived.
"""
from __future__ import annotations

import logging
import queue
import random
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import zmq

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
        self.init_engine()
        logger.info("[%s] backend=%s control endpoint tcp://%s; registered %d KV buffers "
                    "(%d bytes total, item sizes %s)", self.mode, self.backend_name, self.endpoint,
                    len(args.kv_data_ptrs), sum(args.kv_data_lens), sorted(set(args.kv_item_lens)))
        if self.mode == "prefill":
            self.peers: Dict[str, _Peer] = {}
            self.transfer_infos: Dict[int, control.TransferInfo] = {}
            self.prefill_digests: Dict[int, int] = {}
            self._peers_lock = threading.Lock()
            self._queues = [queue.Queue() for _ in range(self.env.queue_size)]
            self._workers = [threading.Thread(target=self._transfer_worker, args=(q,), daemon=True,
                                              name=f"disagg-transfer-{i}")
                             for i, q in enumerate(self._queues)]
            for w in self._workers:
                w.start()
            self.bootstrap_addr = f"{host}:{self.bootstrap_port}"
        else:
            self._conns: Dict[str, _PrefillConn] = {}
            self._conn_lock = threading.Lock()
            self._room_addr: Dict[int, str] = {}
            self._room_pages: Dict[int, List[int]] = {}
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
                self.fail(room, f"request aborted by decode {session}")
            elif not self.handle_extra(frames):
                logger.warning("[prefill] unknown control message %r", kind[:32])
        else:
            if kind == control.KV_STATUS:
                self._on_status(control.StatusMessage.decode(frames))
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
        logger.info("[prefill] decode %s registered: endpoint tcp://%s:%d, %d buffers %s",
                    reg.session[:8], reg.ip, reg.port, len(reg.kv_data_ptrs), reg.extra or "")

    def add_transfer_request(self, room: int, src_pages: Sequence[int]) -> None:
        # one destination stays on one worker queue, as in the reference (spreading requests of
        # one decode over several workers was measured slower on 2 cores: the threads contend)
        info = self.transfer_infos.get(room)
        key = sum(map(ord, info.session)) if info is not None else room
        self._queues[key % len(self._queues)].put(_Job(room, [int(p) for p in src_pages]))

    def _send_status(self, peer: Optional[_Peer], msg: control.StatusMessage) -> None:
        if peer is None:
            return
        try:
            with peer.lock:
                if peer.closed:
                    return
                peer.sock.send_multipart(msg.encode())
        except zmq.ZMQError as e:
            logger.warning("[prefill] could not send status of room %d to decode: %s", msg.room, e)

    def _transfer_worker(self, q: "queue.Queue[_Job]") -> None:
        while not self._stop.is_set():
            try:
                job = q.get(timeout=0.1)
            except queue.Empty:
                continue
            room = job.room
            info = self.transfer_infos.get(room)
            peer = self.peers.get(info.session) if info else None
            try:
                if self.status.get(room) == KVPoll.Failed:
                    self._send_status(peer, control.StatusMessage(room, KVPoll.Failed,
                                                                  self.failure_reasons.get(room, "failed")))
                    continue
                if info is None or peer is None:
                    self.fail(room, f"no destination known for room {room}")
                    continue
                if len(info.dst_pages) != len(job.src_pages):
                    reason = (f"page count mismatch for room {room}: prefill sends {len(job.src_pages)}, "
                              f"decode expects {len(info.dst_pages)}")
                    self.fail(room, reason)
                    self._send_status(peer, control.StatusMessage(room, KVPoll.Failed, reason))
                    continue
                digest = 0
                if self.checksum_enabled:
                    digest = adler32_pages(self.args.tensors, self.args.kv_item_lens, job.src_pages)
                    self.prefill_digests[room] = digest
                runs = group_contiguous_runs(job.src_pages, info.dst_pages)
                entries = build_entries(self.args.kv_data_ptrs, peer.reg.kv_data_ptrs,
                                        self.args.kv_item_lens, runs)
                self.status.update(room, KVPoll.Transferring)
                if self.env.test_transfer_delay > 0:
                    time.sleep(self.env.test_transfer_delay)
                rc, reason = self.transfer(peer, room, entries)
                if rc != 0:
                    reason = f"Failed to send kv chunk of {room} to {peer.reg.ip}:{peer.reg.port}: {reason}"
                    logger.warning("[prefill] %s", reason)
                    self.fail(room, reason)
                    self._send_status(peer, control.StatusMessage(room, KVPoll.Failed, reason))
                    continue
                self.status.update(room, KVPoll.Success)
                self._send_status(peer, control.StatusMessage(room, KVPoll.Success, "", digest,
                                                              self.signature if digest else 0))
            except Exception as e:  # keep the worker alive for later requests
                logger.exception("[prefill] transfer of room %d crashed", room)
                self.fail(room, f"transfer thread error: {e!r}")
                self._send_status(peer, control.StatusMessage(room, KVPoll.Failed, f"prefill error: {e!r}"))

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
        mgr.failure_reasons.pop(self.room, None)
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
        try:
            self.mgr.send_to_prefill(self.bootstrap_addr, control.encode_abort(self.room, self.mgr.session), "abort")
        except RuntimeError:
            pass

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
