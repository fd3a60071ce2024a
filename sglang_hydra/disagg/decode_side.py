"""The decode (receiver) side: finding the prefill, registering buffers, waiting for each room.

Flow of one room: :class:`CommonKVReceiver.init` looks the prefill up through its bootstrap
server (once per prefill; the layout, backend and checksum setting must match ours) and
registers this side's buffers with it; ``send_metadata`` sends the room's destination pages;
the terminal ``KV_STATUS`` from prefill ends the room (its digest is checked when checksums are
on). A heartbeat on the prefill's bootstrap server fails the rooms of a prefill that went away.

Backend hooks: ``registration_extra()`` (what prefill needs to reach us, shared with the core),
``recv_data`` (zmq only) and ``prefill_writes_impossible(endpoint)`` (a heartbeat miss on a
prefill whose engine is provably gone declares it lost at once); ``late_writes_possible`` says
whether a peer can write into our buffers without this process taking part.

Late writes (deferred release). With a one-sided engine, prefill may still be writing into a
failed room's pages. :meth:`CommonKVReceiver.is_abort_release_safe` says when they can go back
to the allocator: prefill never learned them, prefill confirmed it stopped (``ABORT_ACK`` or a
settled terminal status), the backend cannot be written to behind our back, or the prefill is
provably dead (the heartbeat declared it lost *and* the backend proved its engine gone:
``prefill_writes_impossible``), so the pages come back at once instead of pinning the pool for
the release timeout. A prefill that is only unreachable (a cut link, a dead bootstrap server)
may still write when the link returns: its rooms' pages wait for the release timeout.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set

import torch
import zmq

from . import control
from .base import BaseKVReceiver
from .bootstrap import BootstrapError, check_health, fetch_rank, fetch_server_info
from .checksum import adler32_pages
from .manager import KVManagerCore
from .states import DEFAULT_PREFILL_FAILURE_REASON, TERMINAL, KVPoll, KVTransferError

logger = logging.getLogger("sglang_hydra.disagg")


class PeerConfigError(RuntimeError):
    """Prefill and decode were configured inconsistently (not a transfer failure).

    ``key`` names the setting both sides must agree on.
    """

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass
class PrefillConn:
    """Decode's cached view of one prefill server."""
    addr: str
    info: Dict[str, Any]
    endpoint: str
    sock: Any
    lock: threading.Lock = field(default_factory=threading.Lock)
    misses: int = 0


class DecodeKVManager(KVManagerCore):
    mode = "decode"
    # can a peer write into our registered buffers without this process taking part (one-sided
    # engines)? If not (the zmq backend's own receive thread does every write and drops data of
    # rooms that are no longer live), failed requests release their pages at once.
    late_writes_possible = True

    def _init_role(self) -> None:
        self.checksum_results: Dict[int, Optional[bool]] = {}
        self._rng = random.Random()
        self._conns: Dict[str, PrefillConn] = {}
        self._conn_lock = threading.Lock()
        self._room_addr: Dict[int, str] = {}
        self._room_pages: Dict[int, List[int]] = {}
        self._prefill_done: Set[int] = set()         # prefill will not write these rooms again
        self._peer_extras: Dict[str, Dict[str, Any]] = {}   # prefill control endpoint -> REG_ACK body
        self._lost_endpoints: Set[str] = set()       # prefills the heartbeat declared lost
        self._dead_endpoints: Set[str] = set()       # ... of those, the ones provably unable to write
        self.lost_prefills: Dict[str, str] = {}      # bootstrap addr -> why it is gone
        self.config_mismatch: Dict[str, PeerConfigError] = {}
        self.deferred_release = self.env.deferred_release
        self.deferred_release_timeout = self.env.deferred_release_timeout

    def _start_role_threads(self) -> None:
        self._hb = threading.Thread(target=self._heartbeat_loop, daemon=True, name="disagg-heartbeat")
        self._hb.start()

    # ---------------------------------------------------------------- backend hooks
    def prefill_writes_impossible(self, endpoint: str) -> bool:
        """Can the prefill behind ``endpoint`` be proven unable to write (its engine gone)?"""
        return False

    def register_to_bootstrap(self) -> None:
        """Only prefill ranks register with the bootstrap server."""

    # ---------------------------------------------------------------- connection to a prefill
    def _bootstrap_kw(self) -> Dict[str, Any]:
        return dict(retries=self._bootstrap_retries(), timeout=self.env.bootstrap_http_timeout,
                    backoff=self.env.bootstrap_backoff, secret=self.bootstrap_secret)

    def _bootstrap_retries(self) -> int:
        """The configured retries, raised so the retries' backoff spans two heartbeat intervals.

        A bootstrap server that restarted answers 503 until the prefill re-registers, which it
        does on its next heartbeat tick (``SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL``); giving up
        sooner would declare a live prefill unreachable (found by the fault matrix).
        """
        retries, waited, delay = self.env.bootstrap_retries, 0.0, max(self.env.bootstrap_backoff, 0.01)
        for _ in range(retries - 1):
            waited += delay
            delay = min(delay * 2, 2.0)
        while waited < 2 * self.env.heartbeat_interval and retries < 64:
            retries += 1
            waited += delay
            delay = min(delay * 2, 2.0)
        return retries

    def _check_compatible(self, addr: str, info: Dict[str, Any]) -> None:
        if int(info["page_size"]) != self.args.page_size:
            raise PeerConfigError("page_size", f"Page size mismatch: prefill {addr} uses {info['page_size']}, "
                                  f"this decode {self.args.page_size}. Both servers must use the same --page-size.")
        if str(info["kv_cache_dtype"]) != self.args.kv_cache_dtype:
            raise PeerConfigError("kv_cache_dtype", f"KV cache dtype mismatch: prefill {info['kv_cache_dtype']}, "
                                  f"decode {self.args.kv_cache_dtype}")
        if info.get("kv_item_lens") and list(info["kv_item_lens"]) != list(self.args.kv_item_lens):
            raise PeerConfigError("kv_item_lens", "KV layout mismatch: per-page buffer sizes differ between "
                                  "prefill and decode")
        if info.get("transfer_backend") and info["transfer_backend"] != self.backend_name:
            raise PeerConfigError("disaggregation_transfer_backend", f"transfer backend mismatch: prefill uses "
                                  f"{info['transfer_backend']!r}, decode {self.backend_name!r}")
        theirs = info.get("kv_checksum")
        if theirs is not None and bool(theirs) != self.checksum_enabled:
            raise PeerConfigError("disaggregation_enable_kv_checksum", "KV checksums are "
                                  f"{'on' if theirs else 'off'} on prefill {addr} but "
                                  f"{'on' if self.checksum_enabled else 'off'} on this decode; set "
                                  "disagg.disaggregation_enable_kv_checksum (--disaggregation-enable-kv-checksum) "
                                  "the same on both sides")

    def ensure_prefill(self, addr: str) -> PrefillConn:
        with self._conn_lock:
            conn = self._conns.get(addr)
            if conn is not None:
                return conn
            kw = self._bootstrap_kw()
            try:
                info = fetch_server_info(addr, **kw)
                self._check_compatible(addr, info)
                rank = fetch_rank(addr, 0, 0, self.args.engine_rank, 0, **kw)
            except PeerConfigError as e:
                self.config_mismatch[addr] = e
                raise
            except BootstrapError as e:   # retried already: this prefill is gone for now
                self.lost_prefills[addr] = f"prefill unreachable: {e}"
                raise
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
                                       extra=dict(self.registration_extra(), kv_checksum=self.checksum_enabled))
            try:
                sock.send_multipart(reg.encode())
            except zmq.ZMQError as e:
                sock.close(0)
                raise RuntimeError(f"registration to prefill {endpoint} failed: {e}") from e
            conn = PrefillConn(addr=addr, info=info, endpoint=endpoint, sock=sock)
            self._conns[addr] = conn
            self._lost_endpoints.discard(endpoint)
            self._dead_endpoints.discard(endpoint)
            self.lost_prefills.pop(addr, None)
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

    def forget_lost(self, addr: str) -> None:
        """A new run against ``addr``: try it again even if it was lost before."""
        self.lost_prefills.pop(addr, None)
        self.config_mismatch.pop(addr, None)

    # ---------------------------------------------------------------- control messages
    def _handle(self, frames: List[bytes]) -> None:
        kind = frames[0]
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

    def _on_status(self, msg: control.StatusMessage) -> None:
        room = msg.room
        if self.status.get(room) is None:
            return
        if msg.status in TERMINAL and msg.settled:
            # before the status changes: whoever sees the room terminal must also see this
            self._prefill_done.add(room)
        if msg.status == KVPoll.Success:
            ok, why = self._verify_checksum(room, msg)
            if ok is False:
                self.fail(room, why)
            else:
                self.status.update(room, KVPoll.Success)
        elif msg.status == KVPoll.Failed:
            self.fail(room, msg.reason or DEFAULT_PREFILL_FAILURE_REASON)
        else:
            self.status.update(room, msg.status)

    def _verify_checksum(self, room: int, msg: control.StatusMessage):
        """``(True | False | None, reason)``: with checksums on, every Success is checked or failed."""
        if not self.checksum_enabled:
            self.checksum_results[room] = None
            return None, ""
        if msg.digest == 0:
            self.checksum_results[room] = False
            return False, (f"KV checksum missing for room {room}: prefill sent none although checksums are on here "
                           "(both sides must set disaggregation_enable_kv_checksum)")
        if msg.signature != self.signature:
            self.checksum_results[room] = False
            return False, (f"KV checksum of room {room} cannot be compared: prefill layout signature "
                           f"{msg.signature:x} differs from ours {self.signature:x}")
        pages = self._room_pages.get(room, [])
        p = self.env.checksum_mismatch_prob
        if pages and p > 0 and self._rng.random() < p:
            # the reference's fault injection: really flip one received byte so digest and data differ
            t = self.args.tensors[0].reshape(-1).view(torch.uint8)
            t[pages[0] * self.args.kv_item_lens[0]] ^= 0xFF
        local = adler32_pages(self.args.tensors, self.args.kv_item_lens, pages)
        ok = local == msg.digest
        self.checksum_results[room] = ok
        if not ok:
            logger.warning("[decode] KV checksum mismatch for room %d: prefill %08x, decode %08x",
                           room, msg.digest, local)
            return False, f"KV checksum mismatch for room {room}"
        return True, ""

    # ---------------------------------------------------------------- heartbeat
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
                if check_health(addr, timeout=min(2.0, self.env.heartbeat_interval * 2),
                                secret=self.bootstrap_secret):
                    conn.misses = 0
                    continue
                conn.misses += 1
                # a prefill whose engine is provably gone needs no second miss
                dead = self.prefill_writes_impossible(conn.endpoint)
                if conn.misses >= self.env.heartbeat_max_failure or dead:
                    reason = f"Lost connection with prefill instance (bootstrap_addr: {addr})"
                    logger.warning("[decode] %s; failing %d request(s)%s", reason, len(rooms),
                                   "" if dead else "; its engine may still be alive (only the bootstrap server "
                                   "or the link may be gone), so pages it may write stay held")
                    self._lost_endpoints.add(conn.endpoint)
                    if dead:
                        self._dead_endpoints.add(conn.endpoint)
                    self.lost_prefills[addr] = reason
                    self.drop_prefill(addr)
                    for room in rooms:
                        self.fail(room, reason)

    # ---------------------------------------------------------------- teardown
    def _close_role(self) -> None:
        self._hb.join(timeout=2)
        for c in list(self._conns.values()):
            c.sock.close(0)


class CommonKVReceiver(BaseKVReceiver):
    """One room on the decode side (init, send_metadata, poll, clear)."""

    def __init__(self, mgr: DecodeKVManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None, **_):
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
        """Can the pages of this (failed) room go back to the allocator now? (module docstring)"""
        mgr = self.mgr
        if not self.metadata_sent or not mgr.late_writes_possible or not mgr.deferred_release:
            return True
        if self.room in mgr._prefill_done:
            return True
        # lost is not enough: a live prefill behind a cut link or a dead bootstrap server can still
        # write once the link returns (found by the fault matrix), so only a prefill whose engine
        # is provably gone frees the pages early; otherwise the deferred-release timeout does
        return self.prefill_endpoint is not None and self.prefill_endpoint in mgr._dead_endpoints

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
