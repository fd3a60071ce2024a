"""``mooncake``: the Mooncake Transfer Engine (one-sided writes into decode's registered buffers).

On CPU machines this runs the TCP transport of ``mooncake-transfer-engine-non-cuda`` (Debian
``libibverbs1`` must be installed for the import to work). ``mooncake_tcp`` is resolved to this
backend with ``MC_FORCE_TCP=1`` by the registry.

The TCP transport refuses batches of more than about 2,050 entries per peer ("TCP lane
queue-full"), so we both raise ``MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER`` (unless the user set it)
and never have more than ``SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES`` entries (default 1,024)
posted to one peer at a time.

How writes are posted. The reference calls ``batch_transfer_sync_write`` once per request. In the
engine that call (like ``get_batch_transfer_status``) waits by spinning on the batch status with
the GIL released: one core stays busy for the whole transfer. On a 2-core host that core is
taken from the engine's own TCP threads and from the decode process, and the transfer slows
down 2-4x (measured, see docs/notes/disagg.md). So each entry is posted with
``transfer_submit_write`` (a one-entry batch) and completion is polled with
``transfer_check_status`` (which does not wait, and frees the batch once it is final) by the
common transfer worker, which sleeps between polls and keeps several requests in flight.
Semantics are unchanged: one-sided writes into decode's registered buffers, any entry that
fails (rc < 0) fails the request and blacklists the session until ``send_probe`` succeeds.
``SGLANG_HYDRA_MOONCAKE_SYNC_BATCH=1`` switches back to one ``batch_transfer_sync_write`` per
batch (the reference's call) for comparison.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from sglang_hydra.utils.envflags import env_flag, env_str

from ..addressing import split_batches
from ..base import BackendClasses, BackendUnavailableError
from ..bootstrap import BootstrapServer
from ..decode_side import CommonKVReceiver, DecodeKVManager
from ..manager import role_dispatch
from ..prefill_side import CommonKVSender, PrefillKVManager
from .native import has_rdma_devices, with_deadline

logger = logging.getLogger("sglang_hydra.disagg.mooncake")
DEFAULT_MAX_BATCH = 1024
INSTALL_HINT = ("the 'mooncake' transfer backend needs the Mooncake Transfer Engine: "
                "`pip install mooncake-transfer-engine-non-cuda` (CPU) or `mooncake-transfer-engine` "
                "(CUDA), plus the Debian package libibverbs1 (`apt-get install -y --no-install-recommends "
                "libibverbs1`)")


def import_engine():
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        raise BackendUnavailableError(f"{INSTALL_HINT}; import failed: {e}") from e
    return TransferEngine


def mooncake_available() -> bool:
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
        return True
    except Exception:
        return False


available = mooncake_available



_BAD_BATCH = 1 << 63   # transfer_submit_write returns 0 (or an unsigned -1) when nothing was posted


class _Posted:
    """Prefill-side state of one request's writes: what is posted, what is left, what failed."""
    __slots__ = ("session", "entries", "next", "pending", "failed", "reason", "unsettled", "deadline")

    def __init__(self, session: str, entries, deadline: float):
        self.session = session
        self.entries = entries
        self.next = 0
        self.pending: List[int] = []
        self.failed = False
        self.reason = ""
        self.unsettled = False
        self.deadline = deadline


class MooncakeEngine:
    """The engine both roles bring up: initialised, buffers registered, torn down at close."""
    backend_name = "mooncake"
    # the non-CUDA engine build registers host memory only: GPU KV goes through pinned staging
    device_memory = False

    def init_engine(self) -> None:
        os.environ.setdefault("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "8192")
        TransferEngine = import_engine()
        self.engine = TransferEngine()
        force_tcp = env_flag("MC_FORCE_TCP", False)
        protocol = env_str("MOONCAKE_PROTOCOL") or ("rdma" if has_rdma_devices() and not force_tcp else "tcp")
        device = "" if force_tcp else (self.args.ib_device or "")
        rc = with_deadline(lambda: self.engine.initialize(self.host, "P2PHANDSHAKE", protocol, device),
                           self.env.engine_init_timeout, "Mooncake engine initialize", thread_name="mooncake-init")
        if rc != 0:
            raise RuntimeError(f"Mooncake Transfer Engine initialization failed (rc={rc}).")
        self.mc_session = f"{self.host}:{self.engine.get_rpc_port()}"
        pairs = sorted({(p, n) for p, n in zip(self.args.kv_data_ptrs, self.args.kv_data_lens) if n > 0})
        self._registered = [p for p, _ in pairs]
        rc = self.engine.batch_register_memory([p for p, _ in pairs], [n for _, n in pairs])
        if rc != 0:
            raise RuntimeError(f"Mooncake batch_register_memory failed (rc={rc})")
        self.failed_sessions: set = set()
        self.max_batch = self.env.mooncake_max_batch if self.env.mooncake_max_batch > 0 else DEFAULT_MAX_BATCH
        self.sync_batches = env_flag("SGLANG_HYDRA_MOONCAKE_SYNC_BATCH", False)
        self._posted: Dict[str, int] = {}          # session -> entries posted and not final yet
        self._probe_cache: Dict[str, Tuple[float, bool]] = {}
        logger.info("mooncake engine up: protocol=%s session=%s, %d regions registered, batch cap %d, %s",
                    protocol, self.mc_session, len(pairs), self.max_batch,
                    "sync batches" if self.sync_batches else "posted writes + status polling")

    def registration_extra(self):
        return {"mooncake_session": self.mc_session}

    def close_engine(self) -> None:
        try:
            if self._registered:
                self.engine.batch_unregister_memory(self._registered)
        except Exception:
            logger.debug("mooncake unregister failed", exc_info=True)


class MooncakePrefillManager(MooncakeEngine, PrefillKVManager):
    """Posts one ``transfer_submit_write`` per entry and polls for completion (module docstring)."""

    def _session_for(self, peer) -> Tuple[Optional[str], str]:
        session = peer.reg.extra.get("mooncake_session")
        if not session:
            return None, "decode registered without a mooncake session"
        if session in self.failed_sessions:
            if self.engine.send_probe(session) != 0:
                return None, f"Decode instance could be dead, remote mooncake session {session} is not alive"
            self.failed_sessions.discard(session)
        return session, ""

    # -------------------------------------------------------------- posted writes (default)
    def start_transfer(self, peer, room: int, entries) -> Any:
        if self.sync_batches:
            return super().start_transfer(peer, room, entries)
        session, why = self._session_for(peer)
        if session is None:
            return (-1, why, True)
        total = sum(e[2] for e in entries)
        # the engine's own timeout is MC_TRANSFER_TIMEOUT (30 s) + 1 ns per byte; ours is a backstop
        budget = max(self.env.prefill_send_timeout, 1.0) + total / 1e8
        return _Posted(session, entries, time.monotonic() + budget)

    def progress_transfer(self, h, stop_submitting: bool):
        if not isinstance(h, _Posted):
            return h
        eng = self.engine
        if h.pending:
            # writes complete roughly in posting order: reap from the head and stop at the first
            # one still in flight, so a poll costs what completed since the last one, not O(posted)
            check = eng.transfer_check_status
            done = 0
            for bid in h.pending:
                st = check(bid)   # 1 done, 0 in flight, -1 failed (1 and -1 are final: the engine frees them)
                if st == 0:
                    break
                done += 1
                if st != 1:
                    h.failed = True
                    if st == -1:
                        h.reason = h.reason or "a posted write failed (transfer_check_status -1)"
                    else:   # -2: the engine timed it out but has not released it: it may still land
                        h.unsettled = True
                        h.reason = f"a posted write timed out in the engine (transfer_check_status {st})"
            if done:
                self._posted[h.session] -= done
                del h.pending[:done]
        if not h.failed and not stop_submitting and h.next < len(h.entries):
            room = self.max_batch - self._posted.get(h.session, 0)
            end = min(len(h.entries), h.next + max(0, room))
            submit = eng.transfer_submit_write
            i = h.next
            while i < end:
                src, dst, n = h.entries[i]
                try:
                    bid = submit(h.session, src, dst, n)
                except Exception as e:  # the reference's wrapper maps exceptions to -1 too
                    h.failed, h.reason = True, f"transfer_submit_write raised {e!r}"
                    break
                if bid <= 0 or bid >= _BAD_BATCH:
                    h.failed, h.reason = True, f"transfer_submit_write could not post a write (returned {bid})"
                    break
                h.pending.append(bid)
                i += 1
            self._posted[h.session] = self._posted.get(h.session, 0) + (i - h.next)
            h.next = i
        if h.pending:
            if time.monotonic() > h.deadline:
                # give up waiting; the posted writes are not recalled and may still land
                self.abandon_transfer(h)
                return (-1, "posted writes did not complete in time", False)
            return None
        if h.failed:
            self.failed_sessions.add(h.session)
            return (-1, h.reason, not h.unsettled)
        if h.next < len(h.entries):
            if stop_submitting:
                return (-1, "aborted before all writes were posted", True)
            return None   # waiting for room under the per-peer cap
        return (0, "", True)

    def abandon_transfer(self, h) -> None:
        if isinstance(h, _Posted) and h.pending:
            self._posted[h.session] = self._posted.get(h.session, 0) - len(h.pending)
            h.pending = []
            h.unsettled = True

    # -------------------------------------------------------------- the reference's synchronous call
    def transfer(self, peer, room: int, entries) -> Tuple[int, str]:
        session, why = self._session_for(peer)
        if session is None:
            return -1, why
        for batch in split_batches(entries, self.max_batch):
            try:
                rc = self.engine.batch_transfer_sync_write(session, [e[0] for e in batch],
                                                           [e[1] for e in batch], [e[2] for e in batch])
            except Exception as e:  # the wrapper in the reference maps exceptions to -1 too
                rc, err = -1, repr(e)
            else:
                err = f"batch_transfer_sync_write returned {rc}"
            if rc < 0:
                self.failed_sessions.add(session)
                return rc, err
        return 0, ""



class MooncakeDecodeManager(MooncakeEngine, DecodeKVManager):
    def prefill_writes_impossible(self, endpoint: str) -> bool:
        """Is the prefill's engine gone? (its session no longer answers ``send_probe``)"""
        session = (self._peer_extras.get(endpoint) or {}).get("mooncake_session")
        if not session:
            return False
        now = time.monotonic()
        t, dead = self._probe_cache.get(session, (0.0, False))
        if dead or now - t < 0.5:
            return dead
        dead = self.engine.send_probe(session) != 0
        self._probe_cache[session] = (now, dead)
        return dead


MooncakeKVManager = role_dispatch("MooncakeKVManager", MooncakePrefillManager, MooncakeDecodeManager)


class MooncakeKVSender(CommonKVSender):
    pass


class MooncakeKVReceiver(CommonKVReceiver):
    pass


class MooncakeKVBootstrapServer(BootstrapServer):
    pass


def backend_classes() -> BackendClasses:
    return BackendClasses(MooncakeKVManager, MooncakeKVSender, MooncakeKVReceiver, MooncakeKVBootstrapServer)
