"""Metric helpers for replays: nearest-rank percentiles, depth buckets, tail statistics."""
from __future__ import annotations

from fractions import Fraction
from typing import Dict, List, Mapping, Optional, Sequence

__all__ = ["nearest_rank", "depth_bucket_labels", "hits_by_depth", "tail_stats", "TransferMeter",
           "format_rate", "cache_setup_label", "tier_shares_percent"]


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


def cache_setup_label(mode: str, write_policy: Optional[str], storage_backend: Optional[str], policy: str) -> str:
    """The cache set-up a replay ran, as its summary names it: ``mode (write policy[, storage], policy)``."""
    storage = f", {storage_backend}" if storage_backend else ""
    return f"{mode} ({write_policy or 'no hicache'}{storage}, {policy})"


def tier_shares_percent(shares: Mapping[str, float]) -> str:
    """Device / host / storage fractions as one ``a / b / c %`` cell (a missing tier reads 0)."""
    return " / ".join(f"{100 * shares.get(tier, 0):.2f}" for tier in ("device", "host", "storage")) + " %"


# transfer accounting lives in the memory layer; re-exported for existing callers
from ..memory.transfer_accounting import TransferMeter, format_rate  # noqa: E402
