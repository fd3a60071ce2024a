"""One candidate deployment of the search, run through the project's one simulation.

The search does not simulate anything itself: :func:`evaluate` builds the candidate with
:func:`sglang_hydra.workload.assemble.build_deployment` (the same engines, router, cache and KV
links as ``job=replay``), runs the trace through :func:`sglang_hydra.workload.deployment.simulate`
and reads the figures from :func:`sglang_hydra.workload.metrics.summarize_simulation`.  What is
left here is the search's own vocabulary: the SLA, whether a result meets it and how far off it is.

A run that can no longer meet the SLA's TTFT percentile and holds a request that has waited ten
times the TTFT bound is stopped there (:class:`~sglang_hydra.workload.deployment.GiveUp`; status
``saturated``): simulating the rest of a growing backlog would only cost time.  A run that could
still meet the SLA always runs to the end of the trace.

Only infeasibility makes a ``rejected`` row: a trace request that no KV pool of the candidate can
hold (:class:`~sglang_hydra.workload.deployment.RequestsDoNotFit`).  Any other error of the
simulation (a setting it does not model, a bug) propagates, so the job exits 1 with its message
instead of ranking a row of zeros.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

GIVE_UP_WAIT_X_TTFT = 10.0         # a request that waited this many TTFT bounds: the run is saturated


@dataclass(frozen=True)
class Plan:
    """A candidate deployment, ready to build: :class:`~sglang_hydra.workload.assemble.DeploymentInputs`."""

    mode: str                          # agg | disagg
    gpus: int
    inputs: Any                        # DeploymentInputs (records with the candidate's TP, memory and chunk)


@dataclass(frozen=True)
class Sla:
    """Bounds on TTFT and TPOT, held by the ``percentile``-th request (nearest rank)."""

    ttft_ms: float
    tpot_ms: float
    percentile: int = 90


def evaluate(plan: Plan, requests: Sequence, sla: Sla, *, arrival: str = "spread",
             time_scale: float = 1.0, outrank_ttft_ms: Optional[float] = None) -> Dict[str, Any]:
    """The figures of one deployment on one trace (workload :class:`~sglang_hydra.workload.trace.Request`
    objects; ``arrival`` and ``time_scale`` as ``job=replay``'s), keys with units as the replay's metrics.

    ``outrank_ttft_ms`` (below the SLA's bound): the search already holds a deployment whose
    service this one can only beat with its TTFT percentile under that value, so the run stops as
    soon as that is certainly not so (status ``outranked``: its figures are lower bounds)."""
    from ..workload.arrivals import arrival_times
    from ..workload.assemble import build_deployment
    from ..workload.deployment import GiveUp, RequestsDoNotFit, simulate
    from ..workload.metrics import backlog_grows, nearest_rank, summarize_simulation

    n = len(requests)
    k = max(1, math.ceil(sla.percentile / 100.0 * n))      # the nearest-rank position the SLA bounds
    outrank = outrank_ttft_ms is not None and outrank_ttft_ms < sla.ttft_ms
    give_up = (GiveUp(ttft_s=outrank_ttft_ms / 1e3, late_allowed=n - k, wait_s=0.0) if outrank else
               GiveUp(ttft_s=sla.ttft_ms / 1e3, late_allowed=n - k, wait_s=GIVE_UP_WAIT_X_TTFT * sla.ttft_ms / 1e3))
    built = build_deployment(plan.inputs)
    try:
        try:
            res = simulate(built.model, requests, arrival=arrival, time_scale=time_scale, give_up=give_up)
        except RequestsDoNotFit:                            # a request no pool of this deployment holds
            return _rejected(plan, n)
    finally:
        built.close()
    doc = summarize_simulation(res, sla_ttft_ms=sla.ttft_ms, sla_tpot_ms=sla.tpot_ms)
    lat, thr = doc["latency"], doc["throughput"]
    times = arrival_times([r.timestamp for r in requests], how=arrival, time_scale=time_scale)
    span = (max(times) - min(times)) if times else 0.0
    done = doc["requests"]["requests_completed"]
    good = thr["sla_met_share"] * done
    saturated = res.stopped_at_s is not None or backlog_grows(doc["load"], span)
    status = "outranked" if outrank and res.stopped_at_s is not None else "saturated" if saturated else "ok"
    out = {"status": status, "requests": n, "rejected_requests": 0,
           "e2e_p90_ms": lat["e2e_p90_ms"], "tokens_per_s_per_gpu": thr["tokens_per_s_per_gpu"],
           "tokens_per_s_per_user": thr["tokens_per_s_per_user"], "goodput_rps_per_gpu": thr["goodput_rps_per_gpu"],
           "goodput_share": good / n if n else 0.0, "gpus": plan.gpus,
           "token_hit_rate": doc["cache"]["token_hit_rate"], "busy_share": doc["load"]["engine_busy_share_max"]}
    for q in (50, 90, 99):
        out[f"ttft_p{q}_ms"] = lat[f"ttft_p{q}_ms"]
        out[f"tpot_p{q}_ms"] = lat[f"tpot_p{q}_ms"]
    if res.stopped_at_s is not None:
        # stopped: over the requests that had arrived, a missing first token counts as the wait so far
        # (a lower bound of its TTFT), so the percentiles are lower bounds, not the finished few's
        stop = res.stopped_at_s
        ttft = sorted(((s.first_token_s if s.first_token_s is not None else stop) - s.arrival_s) * 1e3
                      for s in res.requests if s.arrival_s <= stop)
        for q in (50, 90, 99):
            out[f"ttft_p{q}_ms"] = max(out[f"ttft_p{q}_ms"], float(nearest_rank(ttft, q / 100)))
    return out


def _rejected(plan: Plan, n: int) -> Dict[str, Any]:
    out = {"status": "rejected", "requests": n, "rejected_requests": n, "e2e_p90_ms": 0.0, "tokens_per_s_per_gpu": 0.0,
           "tokens_per_s_per_user": 0.0, "goodput_rps_per_gpu": 0.0, "goodput_share": 0.0, "gpus": plan.gpus,
           "token_hit_rate": 0.0, "busy_share": 0.0}
    out.update({f"{m}_p{q}_ms": 0.0 for m in ("ttft", "tpot") for q in (50, 90, 99)})
    return out


def meets(metrics: Dict[str, Any], sla: Sla) -> bool:
    """The SLA holds: TTFT and TPOT at the SLA's percentile within it, nothing rejected, not saturated."""
    p = sla.percentile
    return (metrics["status"] == "ok" and not metrics["rejected_requests"]
            and metrics[f"ttft_p{p}_ms"] <= sla.ttft_ms and metrics[f"tpot_p{p}_ms"] <= sla.tpot_ms)


def shortfall(metrics: Dict[str, Any], sla: Sla) -> float:
    """How far a deployment is from the SLA: the larger of its two ratios to the bounds (<= 1: met)."""
    p = sla.percentile
    worst = max(metrics[f"ttft_p{p}_ms"] / sla.ttft_ms, metrics[f"tpot_p{p}_ms"] / sla.tpot_ms)
    return worst if metrics["status"] == "ok" else max(worst, 10.0)
