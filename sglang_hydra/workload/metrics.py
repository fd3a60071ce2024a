"""Metric helpers for replays: nearest-rank percentiles, depth buckets, tail statistics."""
from __future__ import annotations

from fractions import Fraction
from typing import Dict, List, Mapping, Optional, Sequence

__all__ = ["nearest_rank", "depth_bucket_labels", "hits_by_depth", "tail_stats", "TransferMeter", "SCHEMA_VERSION",
           "flatten_metrics", "weighted_quantile", "summarize_simulation",
           "format_rate", "cache_setup_label", "tier_shares_percent", "backlog_grows"]


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


# --------------------------------------------------------------------------- the metrics schema
#: version of the nested metrics.json layout (groups of unit-suffixed leaves, each quantity under
#: one name); what changed from one version to the next is in docs/outputs.md
SCHEMA_VERSION = 3


def flatten_metrics(d: Mapping, *, _out: Optional[dict] = None) -> dict:
    """Every scalar leaf of a nested metrics document under its own name (leaf names are unique
    across the document by design; a repeated one raises).  Lists (``not_modelled``,
    ``assumptions``) are kept whole under their key."""
    out = {} if _out is None else _out
    for k, v in d.items():
        if isinstance(v, Mapping):
            flatten_metrics(v, _out=out)
            continue
        if k in out:
            raise ValueError(f"metrics leaf {k!r} appears twice")
        out[k] = v
    return out


def weighted_quantile(values: Sequence[float], weights: Sequence[int], q: float) -> float:
    """Nearest-rank quantile of ``values`` each counted ``weights`` times (0 when empty)."""
    total = sum(weights)
    if not total:
        return 0.0
    pairs = sorted(zip(values, weights))
    fq = Fraction(q).limit_denominator(1_000_000)
    rank = max(1, -(-(fq.numerator * total) // fq.denominator))
    acc = 0
    for v, w in pairs:
        acc += w
        if acc >= rank:
            return float(v)
    return float(pairs[-1][0])


def _pcts(values: Sequence[float], name: str, scale: float = 1000.0) -> dict:
    s = sorted(values)
    out = {f"{name}_p{int(q * 100)}_ms": float(nearest_rank(s, q)) * scale for q in (0.5, 0.9, 0.99)}
    out[f"{name}_mean_ms"] = (sum(s) / len(s) * scale) if s else 0.0
    return out


def summarize_simulation(result, *, sla_ttft_ms: float, sla_tpot_ms: float) -> dict:
    """The measured groups (``requests``, ``latency``, ``throughput``, ``load``, ``cache``) of
    one :class:`~sglang_hydra.workload.deployment.SimResult`."""
    reqs = result.requests
    done = [s for s in reqs if s.finish_s is not None]
    ttft = [s.first_token_s - s.arrival_s for s in done]
    queue = [(s.prefill_start_s or s.arrival_s) - s.arrival_s for s in done]
    tpot = [(s.finish_s - s.first_token_s) / (s.output_len - 1) for s in done if s.output_len > 1]
    e2e = [s.finish_s - s.arrival_s for s in done]
    transfer = [s.transfer_s for s in done]
    gpus = result.model.gpus
    first = min((s.arrival_s for s in reqs), default=0.0)
    last_arrival = max((s.arrival_s for s in reqs), default=0.0)
    last = max((s.finish_s for s in done), default=first)
    span = last - first
    out_tokens = sum(s.output_len for s in done)
    in_tokens = sum(s.input_len for s in done)
    ok = sum(1 for s in done
             if (s.first_token_s - s.arrival_s) * 1000 <= sla_ttft_ms
             and (s.output_len <= 1 or (s.finish_s - s.first_token_s) / (s.output_len - 1) * 1000 <= sla_tpot_ms))
    per_user = [(s.output_len - 1) / (s.finish_s - s.first_token_s) for s in done
                if s.output_len > 1 and s.finish_s > s.first_token_s]
    engines = [e for group in result.engines.values() for e in group]
    from .engine import ITL_BIN_S
    hist: Dict[int, int] = {}
    for e in engines:
        for b, w in e.itl_hist.items():
            hist[b] = hist.get(b, 0) + w
    itl_v = [b * ITL_BIN_S for b in hist]
    itl_w = list(hist.values())
    latency = {}
    latency.update(_pcts(ttft, "ttft"))
    latency.update({k.replace("ttft_", "ttft_unloaded_"): v for k, v in _pcts(result.unloaded_ttft_s, "ttft").items()})
    latency.update(_pcts(queue, "queue_wait"))
    latency.update(_pcts(tpot, "tpot"))
    latency.update({f"itl_p{int(q * 100)}_ms": weighted_quantile(itl_v, itl_w, q) * 1000 for q in (0.5, 0.9, 0.99)})
    latency.update(_pcts(e2e, "e2e"))
    if result.model.mode == "disagg":
        latency.update(_pcts(transfer, "transfer"))
    busy = [e.busy_s / span if span > 0 else 0.0 for e in engines]
    # a backlog that still grows at the end: the last quarter of the trace waits far longer than the first
    by_arrival = sorted(done, key=lambda s: s.arrival_s)
    quarter = max(1, len(by_arrival) // 4)

    def mean_wait(group):
        return sum((s.first_token_s - s.arrival_s) for s in group) / len(group) if group else 0.0

    early, late = mean_wait(by_arrival[:quarter]), mean_wait(by_arrival[-quarter:])
    drain = last - last_arrival
    load = {
        "engine_busy_share": sum(busy) / len(busy) if busy else 0.0,
        "engine_busy_share_max": max(busy) if busy else 0.0,
        "decode_batch_mean": (sum(e.batch_seq_sum for e in engines) / sum(e.passes for e in engines))
        if any(e.passes for e in engines) else 0.0,
        "forward_passes": sum(e.passes for e in engines),
        "queue_peak_requests": max((e.queue_peak for e in engines), default=0),
        "ttft_mean_first_quarter_ms": early * 1000,
        "ttft_mean_last_quarter_ms": late * 1000,
        "drain_after_last_arrival_s": drain,
        "exposed_load_s": sum(e.exposed_load_s for e in engines),
    }
    throughput = {
        "tokens_per_s": out_tokens / span if span > 0 else 0.0,
        "tokens_per_s_per_gpu": out_tokens / span / gpus if span > 0 and gpus else 0.0,
        "tokens_per_s_per_user": (sum(per_user) / len(per_user)) if per_user else 0.0,
        "prompt_tokens_per_s": in_tokens / span if span > 0 else 0.0,
        "requests_per_s": len(done) / span if span > 0 else 0.0,
        "goodput_rps_per_gpu": ok / span / gpus if span > 0 and gpus else 0.0,
        "sla_met_share": ok / len(done) if done else 0.0,
        "sla_ttft_ms": float(sla_ttft_ms),
        "sla_tpot_ms": float(sla_tpot_ms),
    }
    requests = {
        "requests_completed": len(done),
        "retracted_requests": sum(1 for s in reqs if s.retractions),
        "input_tokens": in_tokens,
        "output_tokens": out_tokens,
    }
    return {"requests": requests, "latency": latency, "throughput": throughput, "load": load,
            "cache": _cache_group(result)}


def backlog_grows(load: Mapping, arrival_span_s: float) -> bool:
    """A saturated run: the last quarter of the trace waits far longer for its first token than
    the first quarter (4x and 10 s more), or draining the queue after the last arrival takes over
    a minute and a tenth of the trace's span.  ``load`` is :func:`summarize_simulation`'s group."""
    early, late = load["ttft_mean_first_quarter_ms"], load["ttft_mean_last_quarter_ms"]
    drain = load["drain_after_last_arrival_s"]
    return late > 4 * early + 10_000 or (arrival_span_s > 0 and drain > max(60.0, 0.1 * arrival_span_s))


def _cache_group(result) -> dict:
    reqs = result.requests
    inp = sum(s.input_len for s in reqs)
    dev = sum(s.device_hit for s in reqs)
    host = sum(s.host_hit for s in reqs)
    sto = sum(s.storage_hit for s in reqs)
    counts: Dict[str, int] = {}
    for group in result.engines.values():
        for e in group:
            if e.cache is None:
                continue
            for k, v in e.cache.counts.items():
                counts[k] = counts.get(k, 0) + v
    rate = (lambda x: x / inp if inp else 0.0)
    out = {
        "token_hit_rate": rate(dev + host + sto),
        "device_hit_rate": rate(dev), "host_hit_rate": rate(host), "storage_hit_rate": rate(sto),
        "device_hit_tokens": dev, "host_hit_tokens": host, "storage_hit_tokens": sto,
        "prefill_computed_tokens": sum(s.computed_tokens for s in reqs),
    }
    out["tier_counts"] = {k: counts[k] for k in sorted(counts)}
    return out
