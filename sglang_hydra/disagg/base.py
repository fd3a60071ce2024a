"""Abstract manager / sender / receiver / bootstrap-server interfaces every backend implements,
and the two names a backend module hands to the registry (:class:`BackendClasses`,
:class:`BackendUnavailableError`). Backends import from here, never from the registry, so the
registry -> backend arrow runs one way.
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .states import KVPoll


class BackendUnavailableError(RuntimeError):
    """The backend is known but cannot run here (missing package, library or hardware)."""


class KVClassType(str, enum.Enum):
    KVARGS = "kvargs"
    MANAGER = "manager"
    SENDER = "sender"
    RECEIVER = "receiver"
    BOOTSTRAP_SERVER = "bootstrap_server"


@dataclass(frozen=True)
class BackendClasses:
    """What one transfer backend consists of (``bootstrap_server`` is None for ``fake``)."""
    manager: type
    sender: type
    receiver: type
    bootstrap_server: Optional[type] = None

    def get(self, kind: "KVClassType | str"):
        kind = KVClassType(kind)
        if kind == KVClassType.KVARGS:
            from .buffers import KVArgs
            return KVArgs
        return getattr(self, kind.value)


@dataclass
class KVTransferMetric:
    transfer_latency_s: Optional[float] = None
    alloc_latency_s: Optional[float] = None
    transfer_total_bytes: Optional[int] = None


class BaseKVManager(ABC):
    supports_host_destination = False
    supports_role_switch = False

    @abstractmethod
    def __init__(self, args, disaggregation_mode: str, record: Any, **kwargs): ...

    @abstractmethod
    def register_to_bootstrap(self) -> None: ...

    def should_verify_kv_checksum(self, bootstrap_addr: str) -> bool:
        return True

    def close(self) -> None:
        pass

    def teardown(self) -> None:
        raise NotImplementedError


class BaseKVSender(ABC):
    @abstractmethod
    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room: int, **kwargs): ...

    @abstractmethod
    def init(self, num_kv_indices: int, aux_index: Optional[int] = None) -> None: ...

    @abstractmethod
    def send(self, kv_indices: Sequence[int], state_indices=None, num_kv_tokens=None) -> None: ...

    @abstractmethod
    def poll(self) -> KVPoll: ...

    @abstractmethod
    def failure_exception(self): ...

    def get_transfer_metric(self) -> KVTransferMetric:
        return KVTransferMetric()

    def clear(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0


class BaseKVReceiver(ABC):
    @abstractmethod
    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room: Optional[int] = None, **kwargs): ...

    @abstractmethod
    def init(self, prefill_dp_rank: int = 0) -> None: ...

    @abstractmethod
    def send_metadata(self, kv_indices: Sequence[int], aux_index=None, state_indices=None,
                      decode_prefix_len=None) -> None: ...

    @abstractmethod
    def poll(self) -> KVPoll: ...

    @abstractmethod
    def failure_exception(self): ...

    def clear(self) -> None:
        pass

    def abort(self) -> None:
        pass


class BaseKVBootstrapServer(ABC):
    @abstractmethod
    def __init__(self, host: str, port: int, **kwargs): ...
