"""What both roles of a KV manager share: the room table, the control socket, the session.

A transfer backend is two managers, one per role, built on this core:

* :mod:`.prefill_side` - the sender: accepts decode registrations and per-room metadata, and
  moves the bytes on its transfer workers;
* :mod:`.decode_side`  - the receiver: looks the prefill up, registers its buffers, sends each
  room's destination pages and waits for the terminal status.

The core owns what both need: the :class:`~.states.StatusTable` of rooms, the first failure
reason of each room, the ZMQ PULL socket every control message arrives on (and the thread that
reads it), this process's session id, the checksum settings and the bootstrap secret. A backend
adds its engine through :meth:`init_engine` / :meth:`close_engine` (shared by both roles) and
the role hooks documented on each side.

:func:`role_dispatch` builds the one class the registry hands out per backend: calling it with
``disaggregation_mode="prefill"`` or ``"decode"`` constructs that role's manager.
"""
from __future__ import annotations

import logging
import threading
import uuid
from typing import Any, Dict, List, Optional

import zmq

from . import control
from .base import BaseKVManager
from .buffers import KVArgs
from .checksum import layout_signature
from .envs import DisaggEnv
from .states import KVPoll, StatusTable

logger = logging.getLogger("sglang_hydra.disagg")


def bootstrap_secret_of(record: Any, env: DisaggEnv) -> Optional[str]:
    """The shared bootstrap secret: the record's field, else the environment variable, else None."""
    value = getattr(record, "disaggregation_bootstrap_secret", None)
    return value or env.bootstrap_secret or None


class KVManagerCore(BaseKVManager):
    """Shared state and the control-socket loop; subclasses implement one role."""

    backend_name = "common"
    mode = "?"

    def __init__(self, args: KVArgs, disaggregation_mode: str, record: Any, *, host: str = "127.0.0.1",
                 bootstrap_port: Optional[int] = None, env: Optional[DisaggEnv] = None, **_):
        if disaggregation_mode != self.mode:
            raise ValueError(f"{type(self).__name__} is the {self.mode} manager, not {disaggregation_mode!r}")
        self.args = args
        self.record = record
        self.host = host
        self.env = env or DisaggEnv.from_env()
        self.status = StatusTable()
        self.checksum_enabled = bool(getattr(record, "disaggregation_enable_kv_checksum", False))
        self.bootstrap_secret = bootstrap_secret_of(record, self.env)
        self.signature = layout_signature(args.page_size, args.kv_cache_dtype, args.kv_item_lens)
        self.bootstrap_port = int(bootstrap_port if bootstrap_port is not None
                                  else getattr(record, "disaggregation_bootstrap_port", 8998))
        self.failure_reasons: Dict[int, str] = {}
        self.session = uuid.uuid4().hex
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self.rank_port = self._pull.bind_to_random_port(f"tcp://{host}")
        self.endpoint = f"{host}:{self.rank_port}"
        # every attribute exists before init_engine() runs, so threads a backend starts there may
        # use them; our own threads start only once the engine is up
        self._init_role()
        self.init_engine()
        logger.info("[%s] backend=%s control endpoint tcp://%s; registered %d KV buffers "
                    "(%d bytes total, item sizes %s, memory %s)", self.mode, self.backend_name, self.endpoint,
                    len(args.kv_data_ptrs), sum(args.kv_data_lens), sorted(set(args.kv_item_lens)),
                    args.memory_kind)
        self._start_role_threads()
        self._loop = threading.Thread(target=self._recv_loop, daemon=True, name=f"disagg-{self.mode}-recv")
        self._loop.start()

    # ---------------------------------------------------------------- role interface
    def _init_role(self) -> None:
        """Create the role's own state (before the engine comes up)."""

    def _start_role_threads(self) -> None:
        """Start the role's threads (after the engine came up)."""

    def _handle(self, frames: List[bytes]) -> None:
        raise NotImplementedError

    def _close_role(self) -> None:
        """Stop the role's threads and close its sockets (the receive loop has stopped)."""

    # ---------------------------------------------------------------- backend hooks (both roles)
    def init_engine(self) -> None:
        pass

    def close_engine(self) -> None:
        pass

    def registration_extra(self) -> Dict[str, Any]:
        """What this side tells its peer about its engine (decode: REGISTER, prefill: REG_ACK)."""
        return {}

    def handle_extra(self, frames: List[bytes]) -> bool:
        """Backend hook for message kinds the common control plane does not know."""
        return False

    def recv_data(self, sock, room: int) -> None:
        """A ``KV_DATA`` message arrived (only the zmq backend sends them): drop it by default."""
        while sock.getsockopt(zmq.RCVMORE):
            sock.recv()

    # ---------------------------------------------------------------- shared
    def fail(self, room: int, reason: str) -> None:
        """Mark ``room`` Failed, keeping the first reason (unknown or cleared rooms stay unknown)."""
        if room not in self.failure_reasons and self.status.get(room) not in (None, KVPoll.Failed):
            self.failure_reasons[room] = reason
        self.status.fail(room, reason)

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

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._loop.join(timeout=2)
        self._close_role()
        self._pull.close(0)
        try:
            self.close_engine()
        finally:
            self._ctx.term()


def role_dispatch(name: str, prefill: type, decode: type) -> type:
    """The class a backend registers: ``cls(args, mode, record, ...)`` builds ``prefill`` or ``decode``.

    ``cls.prefill_cls`` / ``cls.decode_cls`` name the two role classes (tests subclass them).
    """
    def __new__(cls, args, disaggregation_mode, record=None, **kw):
        role = {"prefill": cls.prefill_cls, "decode": cls.decode_cls}.get(disaggregation_mode)
        if role is None:
            raise ValueError(f"a KV manager needs mode 'prefill' or 'decode', got {disaggregation_mode!r}")
        return role(args, disaggregation_mode, record, **kw)

    return type(name, (), {"__new__": __new__, "prefill_cls": prefill, "decode_cls": decode,
                           "__module__": prefill.__module__,
                           "backend_name": getattr(prefill, "backend_name", name),
                           "__doc__": f"{name}: {prefill.__name__} on prefill, {decode.__name__} on decode."})
