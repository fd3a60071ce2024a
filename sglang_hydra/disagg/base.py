"""Abstract manager / sender / receiver / bootstrap-server interfaces every backend implements."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .states import KVPoll


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
