"""``job=validate``: launch the deployment, serve a trace through a real client, predict the same
requests, and compare request by request.

1. The requests: the trace's first ``job.max_requests`` requests the engine can serve (prompt
   within ``job.max_input_tokens``, the context and the pool), outputs capped at
   ``job.max_output_tokens``; token ids from the block hashes (:mod:`..workload.token_ids`), so
   shared blocks share tokens.  Their send times: ``job.pacing=sequential`` one after another,
   ``trace`` the trace's arrival times x ``job.time_scale``, ``rate`` a Poisson process at
   ``job.rate`` requests/s.  They are written to ``sent_trace.jsonl``: the exact input of both
   sides, replayable with ``job=replay job.trace=... job.arrival=as_is``.
2. The engine: ``job=launch``'s own code starts the deployment (or ``job.url`` names one that
   runs), each server labelled through ``--weight-version`` so every answer says which server
   served it; a few warm-up prompts that share nothing with the trace run first, then the
   prefix cache is flushed.  The requests go through :mod:`.engine_client` (streaming; TTFT and
   every token's arrival on the client's clock); then everything is stopped.
3. The prediction: ``job=replay``'s own evaluation on the same record, deployment and hardware,
   over ``sent_trace.jsonl`` (``arrival=sequential`` for sequential pacing, each request when the
   one before it finished, else ``as_is``), with ``cache_semantics=sglang``: the prefix cache
   called as SGLang's scheduler calls it (the replay's rules with HiCache).  ``job.calibrate=true`` first fits this
   machine's pass-time model on the launched engine (:mod:`.engine_calibration`) and predicts
   with it.
4. The comparison (:mod:`..workload.validation`): ``validation.csv`` (one row per request,
   predicted and measured side by side), ``validation.json`` (errors per metric, both sides'
   figures, the checks), ``validation.png`` (predicted against measured, and both CDFs).  A
   check outside ``job.tolerance.*`` exits 1 after everything is written; requests the engine
   failed exit 1 too.
"""
from __future__ import annotations

import csv
import io
import json
import math
import random
import sys
import time
from dataclasses import fields as dc_fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..config.errors import ConfigError, Problem
from .context import JobContext

PACINGS = ("sequential", "trace", "rate")
#: sequential pacing: predicted arrivals this far apart, so each request runs alone in the replay too
SEQUENTIAL_GAP_MS = 1.0e7
#: warm-up prompt lengths (tokens): the first requests after start are slow (lazy initialisation)
WARMUP_LENGTHS = (16, 64, 256, 1024, 4096, 16, 64, 256, 1024, 4096)


# --------------------------------------------------------------------------- inputs
def _settings_problems(job: dict) -> List[Problem]:
    problems = []
    pacing = job.get("pacing")
    if pacing not in PACINGS:
        problems.append(Problem("job.pacing", None, f"must be one of {', '.join(PACINGS)}, got {pacing!r}", "validate"))
    if pacing == "rate" and not (job.get("rate") or 0) > 0:
        problems.append(Problem("job.rate", None, f"job.pacing=rate needs a rate > 0 requests/s, got "
                                f"{job.get('rate')!r}", "validate"))
    for key in ("max_requests", "max_output_tokens"):
        v = job.get(key)
        if v is not None and int(v) < 1:
            problems.append(Problem(f"job.{key}", None, f"must be >= 1, got {v}", "validate"))
    if not float(job.get("time_scale", 1.0) or 0) > 0:
        problems.append(Problem("job.time_scale", None, f"must be > 0, got {job.get('time_scale')}", "validate"))
    return problems


def select_requests(trace_requests: Sequence, *, limit_tokens: int, max_input_tokens: Optional[int],
                    max_output_tokens: Optional[int], max_requests: int) -> List[Any]:
    """The first ``max_requests`` requests that fit (prompt + output within ``limit_tokens``, the
    tighter of the context and the pool, and the prompt within ``max_input_tokens``), outputs
    capped; each a copy with those lengths."""
    import dataclasses
    out = []
    for r in trace_requests:
        if len(out) >= max_requests:
            break
        if max_input_tokens is not None and r.input_length > max_input_tokens:
            continue
        output = r.output_length if max_output_tokens is None else min(r.output_length, int(max_output_tokens))
        output = max(1, output)
        if r.input_length + output > limit_tokens:
            continue
        out.append(dataclasses.replace(r, output_length=output))
    return out


def send_times_ms(requests: Sequence, pacing: str, *, time_scale: float = 1.0, rate: Optional[float] = None,
                  seed: int = 0) -> List[float]:
    """When each request is sent (ms from the first): see the module doc."""
    n = len(requests)
    if pacing == "sequential":
        return [i * SEQUENTIAL_GAP_MS for i in range(n)]
    if pacing == "trace":
        t0 = min((r.timestamp for r in requests), default=0)
        return [(r.timestamp - t0) * time_scale for r in requests]
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(float(rate)) * 1000.0
    return out


# --------------------------------------------------------------------------- measured rows
def measured_rows(measured, worker_of_version: Dict[str, str]) -> List[Dict[str, Any]]:
    """:mod:`..workload.request_record` rows of what the client saw."""
    t0 = min((m.sent_s for m in measured if m.error != "not sent"), default=0.0)
    rows = []
    for m in measured:
        ok = m.ok
        n = m.completion_tokens or len(m.token_times_s)
        worker = worker_of_version.get(m.weight_version or "", m.weight_version)
        rows.append({
            "index": m.index,
            "arrival_ms": (m.sent_s - t0) * 1000.0,
            "input_tokens": m.prompt_tokens,
            "output_tokens": n,
            "cached_tokens": m.cached_tokens,
            "ttft_ms": (m.first_token_s - m.sent_s) * 1000.0 if ok else None,
            "tpot_ms": (m.finish_s - m.first_token_s) / (n - 1) * 1000.0 if ok and n > 1 else None,
            "e2e_ms": (m.finish_s - m.sent_s) * 1000.0 if ok else None,
            "worker": worker,
            "engine": f"{worker}.{m.dp_rank or 0}" if worker is not None else None,
            "finished": ok,
            "error": m.error,
        })
    return rows


# --------------------------------------------------------------------------- outputs
CSV_METRICS = ("cached_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "worker", "engine")


def comparison_csv(predicted: Sequence[Dict], measured: Sequence[Dict]) -> str:
    """One row per request: its sizes, then each metric predicted and measured side by side."""
    meas = {r["index"]: r for r in measured}
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    head = ["index", "arrival_ms", "input_tokens", "output_tokens"]
    for k in CSV_METRICS:
        head += [f"{k}_predicted", f"{k}_measured"]
    w.writerow(head + ["error"])
    for p in predicted:
        m = meas.get(p["index"], {})
        row = [p["index"], _num(m.get("arrival_ms")), p["input_tokens"], p["output_tokens"]]
        for k in CSV_METRICS:
            row += [_num(p.get(k)), _num(m.get(k))]
        w.writerow(row + [m.get("error") or ""])
    return buf.getvalue()


def _num(v):
    if isinstance(v, float):
        return "" if math.isnan(v) else f"{v:.3f}"
    return "" if v is None else v


def _tolerances(job: dict):
    from ..workload.validation import Tolerances
    given = job.get("tolerance") or {}
    get = given.get if hasattr(given, "get") else (lambda k, d=None: getattr(given, k, d))
    return Tolerances(**{f.name: get(f.name, f.default) for f in dc_fields(Tolerances)})


# --------------------------------------------------------------------------- the job
def _replay_job(job: dict, trace_path: str, hicache: bool = False) -> Dict[str, Any]:
    from .specs import ReplayJob
    rj = {f.name: f.default for f in dc_fields(ReplayJob)}
    rj["sla"] = {"ttft_ms": 2000.0, "tpot_ms": 50.0}
    rj.update(trace=trace_path, time_scale=1.0, progress=False, format="json", seed=int(job.get("seed", 0) or 0),
              # one at a time: each request when the one before it finished, as the client sent them
              arrival="sequential" if job.get("pacing") == "sequential" else "as_is",
              # the prefix cache as SGLang's scheduler calls it (docs/whatif.md, "Follows the engine");
              # the engine's semantics cover one tier, so HiCache keeps the replay's rules
              cache_semantics="rules" if hicache else "sglang")
    return rj


def _replay_target(target, ctx: JobContext) -> Tuple[Any, JobContext]:
    """What ``job=replay`` evaluates for this deployment: its record with the deploy keys in the
    context (aggregated), or the PD deployment itself."""
    servers = getattr(target, "servers", None)
    if servers is None:
        return target, ctx
    if getattr(target, "name", "single") == "pd":
        return target, ctx
    sub = JobContext(output_dir=ctx.output_dir, multirun=ctx.multirun, overrides=ctx.overrides,
                     config=ctx.config, hardware=ctx.hardware, deploy=ctx.deploy or getattr(target, "settings", None))
    sub._made = True
    return servers[0].record, sub


def _front_record(target):
    servers = getattr(target, "servers", None)
    return target if servers is None else servers[0].record


def run(target, job: dict, ctx: JobContext) -> int:
    """The job (module doc).  Returns the exit status: 0 within the tolerances, 1 otherwise."""
    from ..workload.request_record import write_jsonl
    from ..workload.token_ids import TokenMaker
    from ..workload.trace import write_trace
    from ..workload.validation import judge, rows_saturated, summarize
    from .replay import load_requests, evaluate_requests
    from ..workload.assemble import context_limit

    problems = _settings_problems(job)
    record = _front_record(target)
    requests = None
    try:
        requests = load_requests(job)
    except ConfigError as err:
        problems.extend(err.problems)
    if problems:
        raise ConfigError(problems)
    limit = context_limit(record)
    pool = getattr(record, "max_total_tokens", None)
    if pool:
        limit = min(limit, int(pool) - 1)
    chosen = select_requests(list(getattr(requests, "requests", requests)), limit_tokens=limit,
                             max_input_tokens=job.get("max_input_tokens"),
                             max_output_tokens=job.get("max_output_tokens"),
                             max_requests=int(job.get("max_requests") or 100))
    if not chosen:
        raise ConfigError([Problem("job.trace", None, f"no request fits: every prompt is over "
                                   f"job.max_input_tokens={job.get('max_input_tokens')} or the context/pool "
                                   f"({limit} tokens)", "validate")])
    pacing = job["pacing"]
    send_ms = send_times_ms(chosen, pacing, time_scale=float(job.get("time_scale", 1.0)), rate=job.get("rate"),
                            seed=int(job.get("seed", 0) or 0))
    import dataclasses
    chosen = [dataclasses.replace(r, timestamp=int(round(t))) for r, t in zip(chosen, send_ms)]
    out = ctx.out_dir()
    write_trace(chosen, out / "sent_trace.jsonl")
    vocab = int(getattr(record, "vocab_size", 0) or 32000)
    maker = TokenMaker(vocab, block_size=int(job.get("block_size") or 512))
    from .engine_client import Planned
    plan = [Planned(i, maker.prompt(r.hash_ids, r.input_length), r.output_length, send_ms[i] / 1000.0)
            for i, r in enumerate(chosen)]

    # ---- the engine
    say = (lambda text: print(f"validate: {text}", file=sys.stderr, flush=True))
    calibration = None
    try:
        measured, router_counts = _serve(target, job, ctx, plan, maker, say)
    except (OSError, RuntimeError) as exc:
        print(f"sglang-hydra: validate: the engine failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    measured, calibration, sim_names = measured
    meas_rows = measured_rows(measured, sim_names)
    ctx.write_text("measured.jsonl", write_jsonl(meas_rows))

    # ---- the prediction, on the same record, deployment and hardware
    rtarget, rctx = _replay_target(target, ctx)
    if calibration is not None:
        rctx.hardware = calibration
    say("predicting the same requests with job=replay ...")
    records = [s.record for s in getattr(target, "servers", ())] or [target]
    hicache = any(getattr(r, "enable_hierarchical_cache", False) for r in records)
    doc, pred_rows = evaluate_requests(rtarget, _replay_job(job, str(out / "sent_trace.jsonl"), hicache), rctx)
    ctx.write_text("predicted.jsonl", write_jsonl(pred_rows))

    # ---- the comparison
    concurrent = pacing != "sequential"
    summary = summarize(pred_rows, meas_rows, predicted_saturated=concurrent and rows_saturated(pred_rows),
                        measured_saturated=concurrent and rows_saturated(meas_rows))
    if router_counts:
        summary["router_worker_counts"] = router_counts
    failed = judge(summary, _tolerances(job))
    errors = [r for r in meas_rows if r.get("error")]
    if errors:
        failed.append(f"{len(errors)} of {len(meas_rows)} requests failed on the engine; first: {errors[0]['error']}")
    summary.update(pacing=pacing, requests=len(plan), checks_failed=failed, ok=not failed,
                   tolerance=_tolerances(job).__dict__, replay_status=doc.get("status"))
    ctx.write_text("validation.json", json.dumps(summary, indent=2, default=str))
    ctx.write_text("validation.csv", comparison_csv(pred_rows, meas_rows))
    from .validate_plot import plot_validation
    plot_validation(pred_rows, meas_rows, out / "validation.png", title=_title(record, job, ctx))
    _print(summary, job, out)
    return 0 if not failed else 1


def _title(record, job, ctx) -> str:
    hw = getattr(getattr(ctx, "hardware", None), "name", "local")
    return f"{getattr(record, 'model_path', 'model')} on {hw}: {job['pacing']} pacing"


class _Running:
    """A deployment that already runs at ``job.url`` (nothing launched, nothing stopped): one
    server as far as the client knows."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.worker_urls = [self.url]
        self.worker_names: List[str] = []
        self.router_metrics_url = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _deployment(target, job, ctx, say):
    if job.get("url"):
        return _Running(job["url"])
    from .launch import running_deployment
    return running_deployment(target, job, ctx, label_servers=True, say=say)


def simulation_names(target, launched_names: Sequence[str]) -> Dict[str, str]:
    """Each launched server's name -> the name the replay gives the same server (``agg0``,
    ``agg1``, ...; ``prefill0``... in PD), by their order in the deployment."""
    pd = getattr(target, "name", None) == "pd"
    out, count = {}, {}
    for name in launched_names:
        role = ("prefill" if name.startswith("prefill") else "decode") if pd else "agg"
        out[name] = f"{role}{count.get(role, 0)}"
        count[role] = count.get(role, 0) + 1
    return out


def _write_calibration(ctx, fit) -> None:
    """The profile the prediction used, and every pass it was fitted on (``calibrate.json``)."""
    from .engine_calibration import calibration_report, preset_from
    preset = preset_from(fit, "local_engine", "job=validate job.calibrate=true: fitted on the launched engine")
    ctx.write_text("calibrate.json", json.dumps(calibration_report(fit, preset), indent=2))


def _serve(target, job, ctx, plan, maker, say):
    """Launch (or reach), warm up, flush, send, stop.  Returns ((measured, calibration or None,
    launched server name -> replay name), router counts by replay name)."""
    from .engine_client import Planned, flush_cache, run_requests
    from .engine_client import get_json
    with _deployment(target, job, ctx, say) as dep:
        for url in dict.fromkeys([dep.url] + list(dep.worker_urls)):
            try:
                get_json(url, "/health", timeout=10)
            except (OSError, RuntimeError) as exc:
                raise RuntimeError(f"no server answers at {url}/health ({exc})") from None
        say(f"warming up {dep.url} ...")
        warm = [Planned(-1 - i, maker.unique(n, tag=i), 2) for i, n in enumerate(WARMUP_LENGTHS)]
        for url in dep.worker_urls:
            run_requests(url, warm, pacing="sequential")
            flush_cache(url)
        calibration = None
        if job.get("calibrate"):
            from .engine_calibration import calibrate_on
            say("calibrating this machine's pass-time model on the engine ...")
            calibration, fit = calibrate_on(dep.worker_urls[0], _front_record(target), ctx.hardware, maker, say=say)
            _write_calibration(ctx, fit)
            for url in dep.worker_urls:
                flush_cache(url)
        before = dep.worker_counts() if dep.router_metrics_url else None
        say(f"sending {len(plan)} requests ({job['pacing']} pacing) ...")
        t0 = time.monotonic()
        measured = run_requests(dep.url, plan, pacing="sequential" if job["pacing"] == "sequential" else "scheduled",
                                timeout=float(job.get("request_timeout", 600.0)))
        say(f"served in {time.monotonic() - t0:.1f} s")
        names = simulation_names(target, dep.worker_names)
        if not names:      # a running server reached by URL: whatever it calls itself is the one server
            names = {v: "agg0" for v in {m.weight_version for m in measured if m.weight_version}}
        counts = None
        if before is not None:
            after = dep.worker_counts()
            counts = {names.get(k, k): after.get(k, 0) - before.get(k, 0) for k in after}
    return (measured, calibration, names), counts


def _print(summary: Dict[str, Any], job: dict, out) -> None:
    if job.get("format") == "json":
        print(json.dumps(summary, indent=2, default=str))
        return
    p, m, e = summary["predicted"], summary["measured"], summary["errors"]
    lines = [f"{summary['paired_requests']} requests compared ({summary['pacing']} pacing)",
             f"{'':22}{'predicted':>12}{'measured':>12}",
             f"{'token hit rate':22}{p['token_hit_rate']:>12.2%}{m['token_hit_rate']:>12.2%}"]
    for key, name in (("ttft_p50_ms", "TTFT P50 ms"), ("ttft_p90_ms", "TTFT P90 ms"), ("tpot_p50_ms", "TPOT P50 ms"),
                      ("e2e_p50_ms", "E2E P50 ms")):
        a, b = p.get(key), m.get(key)
        lines.append(f"{name:22}{_fmt(a):>12}{_fmt(b):>12}")
    lines.append(f"{'saturated':22}{str(p['saturated']):>12}{str(m['saturated']):>12}")
    lines.append("relative error per request: median / P90")
    for metric in ("cached_tokens", "ttft_ms", "tpot_ms", "e2e_ms"):
        st = e[metric]
        lines.append(f"  {metric:20}{_fmt(st['median_rel_error'], pct=True):>12}{_fmt(st['p90_rel_error'], pct=True):>12}")
    lines.append(f"  cached tokens differ on {e['cached_tokens']['mismatches']} requests")
    if summary.get("router_worker_counts"):
        lines.append(f"router's own counts per worker: {summary['router_worker_counts']}")
    for f in summary["checks_failed"]:
        lines.append(f"FAILED: {f}")
    lines.append("ok: every check within its tolerance" if summary["ok"] else "validation failed")
    lines.append(f"wrote {out}/validation.csv, validation.json, validation.png")
    print("\n".join(lines))


def _fmt(v, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:.1%}" if pct else f"{v:,.1f}"
