"""Byte and busy-time accounting of KV transfers (device<->host, host<->storage).

A bottom module: the cache's real-bytes mover books its transfers here and the replay
reports read them, so neither layer imports the other for it.  Pure Python.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional

__all__ = ["TransferMeter", "format_rate"]


class TransferMeter:
    """Bytes and busy time per transfer direction (``d2h``, ``h2d``, ``storage_write`` ...).

    The achieved rate of a direction is bytes / busy seconds, where busy time is the *union*
    of the intervals in which at least one transfer of that direction was running: idle
    time between transfers is not counted, and transfers that overlap (an IO thread and the
    scheduler, or several IO threads) are not counted twice.  Bytes are whatever the caller
    says it moved, which should be the bytes the tier really received (not pages it was
    merely offered).  Thread-safe.
    """

    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self._lock = threading.Lock()
        self._bytes: Dict[str, int] = {}
        self._busy: Dict[str, float] = {}
        self._calls: Dict[str, int] = {}
        self._active: Dict[str, int] = {}
        self._since: Dict[str, float] = {}

    def start(self, direction: str) -> None:
        with self._lock:
            n = self._active.get(direction, 0)
            if n == 0:
                self._since[direction] = self._clock()
            self._active[direction] = n + 1

    def stop(self, direction: str, nbytes: int = 0) -> None:
        with self._lock:
            n = self._active.get(direction, 0)
            if n <= 0:
                raise RuntimeError(f"TransferMeter.stop({direction!r}) without a matching start")
            self._active[direction] = n - 1
            if n == 1:
                self._busy[direction] = self._busy.get(direction, 0.0) + self._clock() - self._since.pop(direction)
            self._bytes[direction] = self._bytes.get(direction, 0) + int(nbytes)
            self._calls[direction] = self._calls.get(direction, 0) + 1

    def add_bytes(self, direction: str, nbytes: int) -> None:
        """Book bytes of a transfer whose time was measured separately (known only afterwards)."""
        with self._lock:
            self._bytes[direction] = self._bytes.get(direction, 0) + int(nbytes)

    @contextmanager
    def timing(self, direction: str) -> Iterator[List[int]]:
        """``with meter.timing("d2h") as moved: moved.append(nbytes)``: the body's bytes
        (sum of what it appends) are booked when it ends, also when it raises."""
        moved: List[int] = []
        self.start(direction)
        try:
            yield moved
        finally:
            self.stop(direction, sum(moved))

    def bytes(self, direction: str) -> int:
        with self._lock:
            return self._bytes.get(direction, 0)

    def seconds(self, direction: str) -> float:
        with self._lock:
            return self._busy.get(direction, 0.0)

    def calls(self, direction: str) -> int:
        with self._lock:
            return self._calls.get(direction, 0)

    def rate_gbps(self, direction: str) -> Optional[float]:
        """Achieved GB/s (1e9 bytes), or None when nothing was moved or no time was measured."""
        with self._lock:
            b, t = self._bytes.get(direction, 0), self._busy.get(direction, 0.0)
        if b <= 0 or t <= 0:
            return None
        return b / t / 1e9

    def directions(self) -> List[str]:
        with self._lock:
            return sorted(set(self._bytes) | set(self._busy))


def format_rate(gbps: Optional[float]) -> str:
    """GB/s with three significant digits (so 0.0021 does not print as 0.00); '-' if unknown."""
    if gbps is None:
        return "-"
    return f"{gbps:.3g}"
