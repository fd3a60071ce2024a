"""``mooncake``: the Mooncake Transfer Engine (one-sided writes into decode's registered buffers).

On CPU machines this runs the TCP transport of ``mooncake-transfer-engine-non-cuda`` (Debian
``libibverbs1`` must be installed for the import to work). ``mooncake_tcp`` is resolved to this
backend with ``MC_FORCE_TCP=1`` by the registry.

The TCP transport refuses batches of more than about 2,050 entries per peer ("TCP lane
queue-full"), so we both raise ``MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER`` (unless the user set it)
and cut every batch at ``SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES`` entries (default 1,024).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, List, Tuple

from ..addressing import split_batches
from ..common import CommonKVBootstrapServer, CommonKVManager, CommonKVReceiver, CommonKVSender

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
        from ..registry import BackendUnavailableError
        raise BackendUnavailableError(f"{INSTALL_HINT}; import failed: {e}") from e
    return TransferEngine


def mooncake_available() -> bool:
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
        return True
    except Exception:
        return False


def _has_rdma() -> bool:
    try:
        return bool(os.listdir("/sys/class/infiniband"))
    except OSError:
        return False


def _with_deadline(fn, timeout: float, what: str):
    box: List[Any] = []

    def run():
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # propagate to the caller
            box.append(("err", e))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if not box:
        raise TimeoutError(f"{what} did not finish within {timeout}s "
                           "(SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT)")
    kind, val = box[0]
    if kind == "err":
        raise val
    return val


class MooncakeKVManager(CommonKVManager):
    backend_name = "mooncake"

    def init_engine(self) -> None:
        os.environ.setdefault("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "8192")
        TransferEngine = import_engine()
        self.engine = TransferEngine()
        force_tcp = os.environ.get("MC_FORCE_TCP", "").lower() in ("1", "true", "yes")
        protocol = os.environ.get("MOONCAKE_PROTOCOL") or ("rdma" if _has_rdma() and not force_tcp else "tcp")
        device = "" if force_tcp else (self.args.ib_device or "")
        rc = _with_deadline(lambda: self.engine.initialize(self.host, "P2PHANDSHAKE", protocol, device),
                            self.env.engine_init_timeout, "Mooncake engine initialize")
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
        logger.info("mooncake engine up: protocol=%s session=%s, %d regions registered, batch cap %d",
                    protocol, self.mc_session, len(pairs), self.max_batch)

    def registration_extra(self):
        return {"mooncake_session": self.mc_session}

    def transfer(self, peer, room: int, entries) -> Tuple[int, str]:
        session = peer.reg.extra.get("mooncake_session")
        if not session:
            return -1, "decode registered without a mooncake session"
        if session in self.failed_sessions:
            if self.engine.send_probe(session) != 0:
                return -1, f"Decode instance could be dead, remote mooncake session {session} is not alive"
            self.failed_sessions.discard(session)
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

    def close_engine(self) -> None:
        try:
            if self._registered:
                self.engine.batch_unregister_memory(self._registered)
        except Exception:
            logger.debug("mooncake unregister failed", exc_info=True)


class MooncakeKVSender(CommonKVSender):
    pass


class MooncakeKVReceiver(CommonKVReceiver):
    pass


class MooncakeKVBootstrapServer(CommonKVBootstrapServer):
    pass
