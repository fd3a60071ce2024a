"""Transfer states of one request (``KVPoll``) and the per-manager status table.

The integer order is meaningful: a status only ever moves upward, ``Failed`` (the lowest
value) is terminal, and taking the minimum over several ranks gives the state of the whole
request.
"""
from __future__ import annotations

import enum
import threading
import time
from typing import Dict, Iterable, Optional


class KVPoll(enum.IntEnum):
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


TERMINAL = frozenset({KVPoll.Failed, KVPoll.Success})
DEFAULT_PREFILL_FAILURE_REASON = "Failed to get kvcache from prefill instance, it might be dead"


class KVTransferError(Exception):
    """Raised by ``failure_exception()`` of a sender or receiver whose room failed."""

    def __init__(self, bootstrap_room: int, failure_reason: str, is_from_another_rank: bool = False):
        super().__init__(failure_reason)
        self.bootstrap_room = bootstrap_room
        self.failure_reason = failure_reason
        self.is_from_another_rank = is_from_another_rank

    def __str__(self) -> str:
        return f"KVTransferError(bootstrap_room={self.bootstrap_room}): {self.failure_reason}"


def merge_polls(polls: Iterable[int]) -> KVPoll:
    """State of a request spread over several ranks: the least advanced one wins."""
    polls = list(polls)
    if not polls:
        raise ValueError("merge_polls needs at least one state")
    return KVPoll(min(int(p) for p in polls))


class StatusTable:
    """Room -> KVPoll with the monotone update rules, plus the first failure reason per room.

    * a room that is not known yet can only be created by ``Bootstrapping`` or
      ``WaitingForInput`` (so a cleared room is never brought back by a late message);
    * ``Failed`` always wins and never changes again;
    * otherwise the stored state becomes ``max(old, new)``.

    Every change notifies waiters of :meth:`wait_for_change`.
    """

    def __init__(self) -> None:
        self._status: Dict[int, KVPoll] = {}
        self._reasons: Dict[int, str] = {}
        self._cond = threading.Condition()
        self._version = 0

    def update(self, room: int, status: int) -> Optional[KVPoll]:
        status = KVPoll(status)
        with self._cond:
            cur = self._status.get(room)
            if cur is None:
                if status not in (KVPoll.Bootstrapping, KVPoll.WaitingForInput):
                    return None
                new = status
            elif cur == KVPoll.Failed:
                return cur
            elif status == KVPoll.Failed:
                new = KVPoll.Failed
            else:
                new = KVPoll(max(cur, status))
            if new != cur:
                self._status[room] = new
                self._version += 1
                self._cond.notify_all()
            return new

    def fail(self, room: int, reason: str) -> None:
        """Record the first reason and mark the room Failed (only if the room is known)."""
        with self._cond:
            if room in self._status and room not in self._reasons:
                self._reasons[room] = reason
        self.update(room, KVPoll.Failed)

    def get(self, room: int) -> Optional[KVPoll]:
        with self._cond:
            return self._status.get(room)

    def reason(self, room: int) -> Optional[str]:
        with self._cond:
            return self._reasons.get(room)

    def pop(self, room: int) -> None:
        with self._cond:
            self._status.pop(room, None)
            self._reasons.pop(room, None)

    def rooms(self) -> Dict[int, KVPoll]:
        with self._cond:
            return dict(self._status)

    def version(self) -> int:
        with self._cond:
            return self._version

    def wait_for_change(self, since: int, timeout: float) -> int:
        """Block until the table changed after version ``since`` or ``timeout`` passed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._version == since:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._version
