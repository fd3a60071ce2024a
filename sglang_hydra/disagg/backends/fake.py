"""``fake``: no bytes move and nothing is contacted (warm-up requests, synthetic decode runs).

As a configured backend it is decode-only; the sender exists for prefill warm-up requests
routed to the fake bootstrap host and is paired with a real prefill manager.
"""
from __future__ import annotations

import time
from typing import Optional

from ..base import BaseKVManager, BaseKVReceiver, BaseKVSender
from ..envs import DisaggEnv
from ..states import KVPoll

FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class FakeKVManager(BaseKVManager):
    backend_name = "fake"

    def __init__(self, args, disaggregation_mode: str, record=None, *, env: Optional[DisaggEnv] = None, **_):
        if disaggregation_mode == "prefill":
            raise AssertionError("Prefill server does not support 'fake' as the transfer backend")
        self.args = args
        self.mode = disaggregation_mode
        self.env = env or DisaggEnv.from_env()
        self.req_to_decode_prefix_len = {}

    def register_to_bootstrap(self) -> None:
        pass

    def close(self) -> None:
        pass


class FakeKVSender(BaseKVSender):
    def __init__(self, mgr, bootstrap_addr: str, bootstrap_room: int, **_):
        self.mgr = mgr
        self.room = bootstrap_room
        self.inited = False
        self.has_sent = False
        self.conclude_state: Optional[KVPoll] = None
        self._wait_start: Optional[float] = None

    def init(self, num_kv_indices: int, aux_index=None) -> None:
        self.inited = True

    def send(self, kv_indices, state_indices=None, num_kv_tokens=None) -> None:
        self.has_sent = True

    def should_send_kv_chunk(self, num_pages: int, last_chunk: bool) -> bool:
        return num_pages > 0 or last_chunk

    def poll(self) -> KVPoll:
        if self.conclude_state is not None:
            return self.conclude_state
        if self.has_sent:
            self.conclude_state = KVPoll.Success
            return self.conclude_state
        if self.inited:
            if self._wait_start is None:
                self._wait_start = time.monotonic()
            env = getattr(self.mgr, "env", None) or DisaggEnv.from_env()
            if time.monotonic() - self._wait_start > env.waiting_timeout:
                self.conclude_state = KVPoll.Failed
                return self.conclude_state
        return KVPoll.WaitingForInput

    def failure_exception(self):
        raise Exception("Fake KVSender Exception")

    def abort(self) -> None:
        self.conclude_state = KVPoll.Failed

    def mark_prefill_complete(self) -> None:
        pass


class FakeKVReceiver(BaseKVReceiver):
    def __init__(self, mgr, bootstrap_addr: str = FAKE_BOOTSTRAP_HOST, bootstrap_room: Optional[int] = None, **_):
        self.mgr = mgr
        self.room = bootstrap_room
        self.has_init = False
        self.has_sent_metadata = False
        self.conclude_state: Optional[KVPoll] = None
        self.pages = []

    def init(self, prefill_dp_rank: int = 0) -> None:
        self.has_init = True

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None) -> None:
        self.pages = list(kv_indices)
        self.has_sent_metadata = True

    def poll(self) -> KVPoll:
        if self.conclude_state is not None:
            return self.conclude_state
        if not self.has_init:
            return KVPoll.Bootstrapping
        if not self.has_sent_metadata:
            return KVPoll.WaitingForInput
        self.conclude_state = KVPoll.Success
        return self.conclude_state

    def failure_exception(self):
        raise Exception("Fake KVReceiver Exception")

    def abort(self) -> None:
        self.conclude_state = KVPoll.Failed

    def ensure_abort_notified(self) -> None:
        pass

    def is_abort_release_safe(self) -> bool:
        return True   # nothing is ever written


def backend_classes():
    from ..base import BackendClasses
    return BackendClasses(FakeKVManager, FakeKVSender, FakeKVReceiver, None)


def available() -> bool:
    return True
