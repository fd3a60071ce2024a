"""Metric helpers for replays: nearest-rank percentiles, depth buckets, tail statistics."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from fractions import Fraction
from typing import Dict, Iterator, List, Optional, Sequence

__all__ = ["nearest_rank", "depth_bucket_labels", "hits_by_depth", "tail_stats", "TransferMeter",
           "format_rate"]


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """Value at sorted index ``ceil(q * N) - 1`` (``replay_rules.md`` §3.10).

    ``q`` is converted to an exact fraction first so that e.g. ``0.9 * 10`` does not round
    up to the next rank.  Returns 0 for an empty sequence.
    """
    n = len(sorted_values)
    if n == 0:
        return 0
    if not 0 < q <= 1:
        raise ValueError(f"quantile must be in (0, 1], got {q}")
    fq = Fraction(q).limit_denominator(1_000_000)
    rank = -(-(fq.numerator * n) // fq.denominator)  # ceil
    return sorted_values[max(rank, 1) - 1]


def _bucket_edges(max_depth: int) -> List[int]:
    edges = [0, 1]
    while edges[-1] <= max_depth:
        edges.append(edges[-1] * 2)
    return edges


def depth_bucket_labels(max_depth: int) -> List[str]:
    """Labels ``"0"``, ``"1"``, ``"2-3"``, ``"4-7"``, ... covering depths up to ``max_depth``."""
    edges = _bucket_edges(max_depth)
    labels = []
    for lo, hi in zip(edges, edges[1:]):
        labels.append(str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}")
    return labels


def hits_by_depth(hit_lengths: Sequence[int]) -> Dict[str, int]:
    """Hit pages per power-of-two bucket of 0-based page depth.

    A request that hit ``k`` pages contributes one hit at each depth ``0..k-1``.
    """
    if not hit_lengths:
        return {}
    kmax = max(hit_lengths)
    if kmax == 0:
        return {}
    per_k = [0] * (kmax + 1)
    for k in hit_lengths:
        per_k[k] += 1
    # at_depth[d] = number of requests with k > d
    at_depth = [0] * kmax
    running = 0
    for d in range(kmax - 1, -1, -1):
        running += per_k[d + 1]
        at_depth[d] = running
    out: Dict[str, int] = {}
    edges = _bucket_edges(kmax - 1)
    for (lo, hi), label in zip(zip(edges, edges[1:]), depth_bucket_labels(kmax - 1)):
        out[label] = sum(at_depth[lo:min(hi, kmax)])
    return out


def tail_stats(values: Sequence[int], threshold: float) -> Dict[str, float]:
    """Share of values strictly above ``threshold`` and mean excess over it (all values)."""
    n = len(values)
    if n == 0:
        return {"frac_gt": 0.0, "mean_excess": 0.0}
    above = 0
    excess = 0
    for v in values:
        if v > threshold:
            above += 1
            excess += v - threshold
    return {"frac_gt": above / n, "mean_excess": excess / n}


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
