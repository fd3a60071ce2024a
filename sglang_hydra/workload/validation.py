"""Predicted against measured, request by request: the errors ``job=validate`` reports and judges.

Both sides are rows of :mod:`.request_record` (the replay's prediction, and what a real client
measured of a real engine, in the same fields and units).  Rows are paired by ``index``.  For
each metric the summary gives the median and P90 of the relative error ``|pred - meas| / meas``
over the paired requests; tokens also get the count of requests that differ at all.  The
deployment-level figures an operator reads (token hit rate, TTFT P50/P90, TPOT P50, each
worker's share of the requests, saturation) are compared as such, and each check of
:class:`Tolerances` that fails is named with its numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .metrics import backlog_grows, nearest_rank

__all__ = ["Tolerances", "pair_rows", "relative_errors", "summarize", "judge", "rows_saturated", "TIME_METRICS"]

TIME_METRICS = ("ttft_ms", "tpot_ms", "e2e_ms")


@dataclass
class Tolerances:
    """The bounds a validation must hold (``None``: not checked)."""

    cached_token_mismatches: Optional[int] = None     # requests whose cached tokens differ
    hit_rate_points: Optional[float] = 1.0            # |token hit rate difference|, percentage points
    ttft_p50: Optional[float] = 0.25                  # relative error of the run's TTFT P50
    ttft_p90: Optional[float] = 0.25
    tpot_p50: Optional[float] = 0.25
    worker_share_points: Optional[float] = 5.0        # |share of requests per worker difference|, points
    saturation: bool = True                           # predicted saturated iff measured saturated


def pair_rows(predicted: Sequence[Mapping], measured: Sequence[Mapping]) -> List[Tuple[Mapping, Mapping]]:
    """(predicted, measured) pairs of the requests both sides finished, by ``index``."""
    meas = {r["index"]: r for r in measured if r.get("finished")}
    return [(p, meas[p["index"]]) for p in predicted if p.get("finished") and p["index"] in meas]


def relative_errors(pairs: Sequence[Tuple[Mapping, Mapping]], metric: str) -> List[float]:
    """``|pred - meas| / meas`` of one metric over the pairs where both have a positive value."""
    out = []
    for p, m in pairs:
        a, b = p.get(metric), m.get(metric)
        if a is None or b is None or not b > 0:
            continue
        out.append(abs(a - b) / b)
    return out


def _pct(values: Sequence[float], q: float) -> Optional[float]:
    s = sorted(values)
    return float(nearest_rank(s, q)) if s else None


def _hit_rate(rows: Sequence[Mapping]) -> float:
    inp = sum(r["input_tokens"] for r in rows)
    return sum(r["cached_tokens"] or 0 for r in rows) / inp if inp else 0.0


def _shares(rows: Sequence[Mapping]) -> Dict[str, float]:
    counts: Dict[str, int] = {}
    for r in rows:
        counts[str(r.get("worker"))] = counts.get(str(r.get("worker")), 0) + 1
    n = sum(counts.values())
    return {k: v / n for k, v in sorted(counts.items())} if n else {}


def _side(rows: Sequence[Mapping]) -> Dict[str, Any]:
    """The deployment-level figures of one side's rows."""
    done = [r for r in rows if r.get("finished")]
    out: Dict[str, Any] = {"requests": len(rows), "finished": len(done), "token_hit_rate": _hit_rate(done)}
    for metric in TIME_METRICS:
        vals = [r[metric] for r in done if r.get(metric) is not None]
        name = metric[:-3]
        out[f"{name}_p50_ms"] = _pct(vals, 0.5)
        out[f"{name}_p90_ms"] = _pct(vals, 0.9)
    out["worker_shares"] = _shares(done)
    return out


def summarize(predicted: Sequence[Mapping], measured: Sequence[Mapping], *,
              predicted_saturated: bool = False, measured_saturated: bool = False) -> Dict[str, Any]:
    """Per-metric error statistics and both sides' deployment-level figures."""
    pairs = pair_rows(predicted, measured)
    errors: Dict[str, Any] = {}
    for metric in TIME_METRICS + ("cached_tokens",):
        rel = relative_errors(pairs, metric)
        errors[metric] = {"median_rel_error": _pct(rel, 0.5), "p90_rel_error": _pct(rel, 0.9),
                          "max_rel_error": max(rel) if rel else None, "compared": len(rel)}
    diffs = [(p["index"], p["cached_tokens"], m["cached_tokens"]) for p, m in pairs
             if p["cached_tokens"] != m["cached_tokens"]]
    errors["cached_tokens"].update(mismatches=len(diffs), first_mismatches=[
        {"index": i, "predicted": a, "measured": b} for i, a, b in diffs[:10]])
    pred, meas = _side([p for p, _ in pairs]), _side([m for _, m in pairs])
    pred["saturated"], meas["saturated"] = bool(predicted_saturated), bool(measured_saturated)
    pred["finished"], meas["finished"] = (sum(1 for r in predicted if r.get("finished")),
                                          sum(1 for r in measured if r.get("finished")))
    return {"paired_requests": len(pairs), "errors": errors, "predicted": pred, "measured": meas}


def _rel(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or not b > 0:
        return None
    return abs(a - b) / b


def judge(summary: Mapping[str, Any], tol: Tolerances) -> List[str]:
    """The checks that fail, one sentence each with both numbers (empty: the validation holds)."""
    pred, meas, errs = summary["predicted"], summary["measured"], summary["errors"]
    failed: List[str] = []
    if tol.cached_token_mismatches is not None:
        n = errs["cached_tokens"]["mismatches"]
        if n > tol.cached_token_mismatches:
            first = errs["cached_tokens"]["first_mismatches"][:3]
            failed.append(f"cached tokens differ on {n} of {summary['paired_requests']} requests "
                          f"(allowed {tol.cached_token_mismatches}); first: "
                          + ", ".join(f"#{d['index']} predicted {d['predicted']} measured {d['measured']}"
                                      for d in first))
    if tol.hit_rate_points is not None:
        d = abs(pred["token_hit_rate"] - meas["token_hit_rate"]) * 100
        if d > tol.hit_rate_points:
            failed.append(f"token hit rate {pred['token_hit_rate']:.2%} predicted vs {meas['token_hit_rate']:.2%} "
                          f"measured: {d:.2f} points apart (allowed {tol.hit_rate_points:g})")
    for name, key, bound in (("TTFT P50", "ttft_p50_ms", tol.ttft_p50), ("TTFT P90", "ttft_p90_ms", tol.ttft_p90),
                             ("TPOT P50", "tpot_p50_ms", tol.tpot_p50)):
        if bound is None:
            continue
        r = _rel(pred.get(key), meas.get(key))
        if r is not None and r > bound:
            failed.append(f"{name} {pred[key]:.1f} ms predicted vs {meas[key]:.1f} ms measured: "
                          f"{r:.0%} off (allowed {bound:.0%})")
    if tol.worker_share_points is not None and len(meas["worker_shares"]) > 1:
        for w in sorted(set(pred["worker_shares"]) | set(meas["worker_shares"])):
            a, b = pred["worker_shares"].get(w, 0.0), meas["worker_shares"].get(w, 0.0)
            if abs(a - b) * 100 > tol.worker_share_points:
                failed.append(f"worker {w}: {a:.1%} of the requests predicted vs {b:.1%} measured "
                              f"(allowed {tol.worker_share_points:g} points)")
    if tol.saturation and pred["saturated"] != meas["saturated"]:
        failed.append(f"predicted {'saturated' if pred['saturated'] else 'keeping up'}, measured "
                      f"{'saturated' if meas['saturated'] else 'keeping up'}")
    if summary["paired_requests"] == 0:
        failed.append("no request finished on both sides")
    return failed


def rows_saturated(rows: Sequence[Mapping]) -> bool:
    """Whether a run's rows show a server that cannot keep up, by the replay's own rule
    (:func:`~.metrics.backlog_grows`: the last quarter of the arrivals waits far longer for its
    first token than the first quarter, or the queue drains long after the last arrival), so a
    measurement and a prediction are judged the same way.  Requests that never finished count
    as saturation."""
    if any(not r.get("finished") for r in rows):
        return True
    done = sorted(rows, key=lambda r: r["arrival_ms"])
    if not done:
        return False
    quarter = max(1, len(done) // 4)
    mean = (lambda g: sum(r["ttft_ms"] for r in g) / len(g))
    last_arrival = done[-1]["arrival_ms"]
    last_finish = max(r["arrival_ms"] + r["e2e_ms"] for r in done)
    load = {"ttft_mean_first_quarter_ms": mean(done[:quarter]), "ttft_mean_last_quarter_ms": mean(done[-quarter:]),
            "drain_after_last_arrival_s": (last_finish - last_arrival) / 1000.0}
    return backlog_grows(load, (last_arrival - done[0]["arrival_ms"]) / 1000.0)
