"""When each request of a trace arrives at the deployment (``job.arrival``).

The Mooncake traces store timestamps in ~3 s ticks: dozens of requests share one value.
Replaying them as they are lands a whole tick's prompts on the engines at one instant, which
is queueing no real client produces.  ``spread`` (the default) places each request uniformly
at random inside its tick (from its timestamp up to the next distinct timestamp, at most the
trace's usual tick), seeded, order kept within the trace's ticks.  ``as_is`` keeps the stored
values.  ``sequential`` sends one request at a time, in trace order: each arrives when the one
before it has finished (a client that waits for every answer; the deployment loop releases
them, here they keep their trace order only).  ``poisson`` keeps the request count and the trace's span but draws exponential gaps
(a memoryless client population at the trace's mean rate).  Every time is then multiplied by
``time_scale`` (2: the trace at half its request rate).
"""
from __future__ import annotations

import random
from collections import Counter
from typing import List, Sequence

__all__ = ["ARRIVALS", "arrival_times", "trace_tick_ms"]

ARRIVALS = ("spread", "as_is", "poisson", "sequential")


def trace_tick_ms(timestamps_ms: Sequence[float]) -> float:
    """The trace's usual gap between distinct timestamps (its quantisation step), in ms; 0
    when every request has the same timestamp."""
    distinct = sorted(set(timestamps_ms))
    gaps = [b - a for a, b in zip(distinct, distinct[1:]) if b > a]
    if not gaps:
        return 0.0
    return float(Counter(gaps).most_common(1)[0][0])


def arrival_times(timestamps_ms: Sequence[float], *, how: str = "spread", time_scale: float = 1.0,
                  seed: int = 0) -> List[float]:
    """Arrival time in seconds of each request (same order as ``timestamps_ms``)."""
    if how not in ARRIVALS:
        raise ValueError(f"job.arrival={how!r} is not one of {', '.join(ARRIVALS)}")
    if not time_scale > 0:
        raise ValueError(f"job.time_scale must be > 0, got {time_scale!r}")
    n = len(timestamps_ms)
    scale = time_scale / 1000.0
    if how in ("as_is", "sequential") or n == 0:
        return [t * scale for t in timestamps_ms]
    rng = random.Random(seed)
    if how == "poisson":
        first, last = min(timestamps_ms), max(timestamps_ms)
        span = (last - first) or trace_tick_ms(timestamps_ms) or 1000.0
        mean_gap = span / n
        order = sorted(range(n), key=lambda i: timestamps_ms[i])
        out = [0.0] * n
        t = float(first)
        for i in order:
            out[i] = t * scale
            t += rng.expovariate(1.0 / mean_gap)
        return out
    tick = trace_tick_ms(timestamps_ms)
    distinct = sorted(set(timestamps_ms))
    nxt = {a: min(b - a, tick) if tick else 0.0 for a, b in zip(distinct, distinct[1:])}
    nxt[distinct[-1]] = tick
    return [(t + rng.random() * nxt[t]) * scale for t in timestamps_ms]
