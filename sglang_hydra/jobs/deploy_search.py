"""``job=deploy_search``: which deployment of ``deploy.total_gpus`` GPUs serves a trace best under an SLA.

It enumerates every deployment that fits the GPUs: aggregated (N replicas x TP, behind
sglang-router) and disaggregated (x prefill servers x TP + y decode servers x TP), each with
the memory choices of ``job.search.*`` (HiCache ratio, eviction policy) and router policies;
runs the trace through each in the project's one simulation (:mod:`sglang_hydra.workload`, as
``job=replay`` does; :mod:`.deploy_eval` builds each candidate for it), ranks them by SLA
goodput per GPU (requests per second meeting both bounds, per GPU), prints the table and writes ``summary.csv``,
``pareto.png`` (tokens/s/user against tokens/s/GPU), ``best_deploy.yaml`` (which ``--config``
accepts for ``job=launch``) and ``deploy_search.json``.

``job.rate_search=true`` asks the peer tools' question instead: for each deployment, the
highest request rate (the trace's arrival times scaled through ``time_scale``, re-simulated) at
which the SLA still holds, ranked by output tokens/s per GPU at that rate.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import math
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..config.deploy import ROUTER_POLICIES, Deployment
from ..config.errors import ConfigError, Problem
from ..workload.metrics import SCHEMA_VERSION     # the outputs' schema, shared with job=replay's metrics.json
from .context import JobContext, atomic_write
from .deploy_eval import Plan, Sla, evaluate, meets, shortfall

# SGLang 0.5.23's own --radix-eviction-policy choices; other names (ghost_lru) are this project's
# and need its plugin on the engine (see docs/deploy_search.md)
ENGINE_EVICTION_POLICIES = ("lru", "lfu", "slru", "priority", "tlru")
MODES = ("agg", "disagg")
PERCENTILES = (50, 90, 99)
# router policies the evaluator models: manual routes by a request header a trace does not carry
MODELLED_ROUTER_POLICIES = tuple(p for p in ROUTER_POLICIES if p != "manual")
_RATE_STEPS = 14                   # bisection steps of the rate search (2^-14 relative precision at most)
_RATE_TOLERANCE = 0.02             # stop once the bracket is this tight (relative)


# --------------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Candidate:
    """One deployment of the search, as the table and best_deploy.yaml name it."""

    mode: str                       # agg | disagg
    workers: int                    # agg: replicas; disagg: prefill servers
    tp: int                         # agg: each replica's; disagg: each prefill server's
    decode_workers: int = 0
    decode_tp: int = 0
    hicache_ratio: float = 0.0
    policy: str = "lru"
    router_policy: str = "cache_aware"
    chunk: Optional[int] = None     # agg: chunked_prefill_size (None: the record's)

    @property
    def gpus(self) -> int:
        return self.workers * self.tp + self.decode_workers * self.decode_tp

    @property
    def layout(self) -> str:
        if self.mode == "agg":
            return f"{self.workers} x TP{self.tp}"
        return f"{self.workers}P TP{self.tp} + {self.decode_workers}D TP{self.decode_tp}"

    @property
    def runnable(self) -> bool:
        """Whether plain SGLang 0.5.23 runs it (its eviction policy is the engine's own)."""
        return self.policy in ENGINE_EVICTION_POLICIES


def enumerate_candidates(total_gpus: int, node_gpus: Optional[int], space: Dict[str, Any],
                         router_policy: Optional[str] = None) -> List[Candidate]:
    """Every deployment of at most ``total_gpus`` GPUs with TP sizes from ``space['tp']`` (a
    server never spans nodes: TP <= ``node_gpus``), crossed with the memory and router choices.
    The router policy only varies where a pool has more than one server."""
    tps = sorted({t for t in space["tp"] if t <= total_gpus and (not node_gpus or t <= node_gpus)})
    routers = [router_policy] if router_policy else list(dict.fromkeys(space["router_policies"]))
    layouts: List[Tuple] = []
    if "agg" in space["modes"]:
        for tp in tps:
            for n in range(1, total_gpus // tp + 1):
                layouts.append(("agg", n, tp, 0, 0))
    if "disagg" in space["modes"]:
        for ptp in tps:
            for dtp in tps:
                for p in range(1, total_gpus // ptp + 1):
                    for d in range(1, (total_gpus - p * ptp) // dtp + 1):
                        layouts.append(("disagg", p, ptp, d, dtp))
    if space.get("all_gpus"):
        layouts = [l for l in layouts if l[1] * l[2] + l[3] * l[4] == total_gpus]
    chunks = list(dict.fromkeys(space.get("chunked_prefill_size") or [None]))
    out = []
    for mode, n, tp, d, dtp in layouts:
        several = n > 1 or d > 1
        for ratio in dict.fromkeys(float(r) for r in space["hicache_ratio"]):
            for policy in dict.fromkeys(space["policies"]):
                for rp in (routers if several else routers[:1]):
                    for chunk in (chunks if mode == "agg" else [None]):
                        out.append(Candidate(mode, n, tp, d, dtp, ratio, policy, rp, chunk))
    return out


# --------------------------------------------------------------------------- settings
def _group(job: dict, name: str) -> Dict[str, Any]:
    from .specs import DeploySearchJob
    default = dataclasses.asdict(getattr(DeploySearchJob(), name))
    value = job.get(name) or {}
    value = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else dict(value)
    return {**default, **value}


def _settings_problems(job: dict, sla: Dict[str, Any], space: Dict[str, Any]) -> List[Problem]:
    from ..cache.policies import available_policies
    out = []
    for key in ("ttft_ms", "tpot_ms"):
        v = sla.get(key)
        if v is None:
            out.append(Problem(f"job.sla.{key}", None, "is required: the search ranks deployments by the requests "
                               f"that meet the SLA (e.g. job.sla.ttft_ms=2000 job.sla.tpot_ms=50)", "deploy_search"))
        elif not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            out.append(Problem(f"job.sla.{key}", None, f"{v!r} is not a positive number of milliseconds", "deploy_search"))
    if sla.get("percentile") not in PERCENTILES:
        out.append(Problem("job.sla.percentile", None, f"{sla.get('percentile')!r} is not one of: "
                           f"{', '.join(map(str, PERCENTILES))}", "deploy_search"))
    lists = {"modes": MODES, "router_policies": MODELLED_ROUTER_POLICIES, "policies": None, "tp": None,
             "hicache_ratio": None}
    for key in lists:
        v = space.get(key)
        if not isinstance(v, (list, tuple)) or not v:
            out.append(Problem(f"job.search.{key}", None, f"{v!r} must be a non-empty list, e.g. "
                               f"job.search.{key}=[{_example(key)}]", "deploy_search"))
            space[key] = []
    for m in space["modes"]:
        if m not in MODES:
            out.append(Problem("job.search.modes", None, f"{m!r} is not one of: {', '.join(MODES)}", "deploy_search"))
    for rp in space["router_policies"]:
        if rp not in MODELLED_ROUTER_POLICIES:
            lacks = rp not in ROUTER_POLICIES
            out.append(Problem("job.search.router_policies", None,
                               f"{rp!r} is not a policy sglang-router 0.3.2 offers (one of: {', '.join(ROUTER_POLICIES)})"
                               if lacks else f"{rp!r} routes by a request header a trace does not carry; the search "
                               f"models: {', '.join(MODELLED_ROUTER_POLICIES)}", "deploy_search"))
    known = available_policies()
    for p in space["policies"]:
        if p not in known:
            out.append(Problem("job.search.policies", None, f"{p!r} is not an eviction policy; available: "
                               f"{', '.join(sorted(known))}", "deploy_search"))
    for t in space["tp"]:
        if not (isinstance(t, int) and t >= 1):
            out.append(Problem("job.search.tp", None, f"{t!r} is not a positive whole number", "deploy_search"))
    for c in space.get("chunked_prefill_size") or []:
        if c is not None and not (isinstance(c, int) and c >= 1):
            out.append(Problem("job.search.chunked_prefill_size", None, f"{c!r} is not a positive number of tokens "
                               f"(or null for the record's)", "deploy_search"))
    if not isinstance(space.get("all_gpus"), bool):
        out.append(Problem("job.search.all_gpus", None, f"{space.get('all_gpus')!r} is not true or false",
                           "deploy_search"))
    for r in space["hicache_ratio"]:
        if not (isinstance(r, (int, float)) and (r == 0 or r > 1) and math.isfinite(r)):
            out.append(Problem("job.search.hicache_ratio", None, f"{r!r}: a HiCache host tier is more than 1 x the "
                               f"device pool (SGLang's rule); 0 means none", "deploy_search"))
    for key in ("processes", "top"):
        v = job.get(key)
        if not (isinstance(v, int) and v >= 1):
            out.append(Problem(f"job.{key}", None, f"{v!r} is not a positive whole number", "deploy_search"))
    ts = job.get("time_scale")
    if not (isinstance(ts, (int, float)) and ts > 0 and math.isfinite(ts)):
        out.append(Problem("job.time_scale", None, f"{ts!r} is not a positive number", "deploy_search"))
    return out


def _example(key: str) -> str:
    return {"modes": "agg,disagg", "router_policies": "cache_aware", "policies": "lru", "tp": "1,2,4,8",
            "hicache_ratio": "0,2"}[key]


# --------------------------------------------------------------------------- engines
class _Engines:
    """Each candidate as the simulation's inputs: the record with the candidate's TP, memory and
    chunk per side, and the pool sizes the search checks the trace against."""

    def __init__(self, record, hardware):
        self.record = record
        self.hardware = hardware
        self._checked: set = set()
        self._pool: Dict[Tuple[int, float], Tuple[int, int, float]] = {}

    def pass_model(self, tp: int):
        from ..perf.pass_time import PassModel, PassModelError
        if tp not in self._checked:
            try:
                PassModel.from_record(dataclasses.replace(self.record, tp_size=tp), self.hardware)
            except PassModelError as exc:
                raise ConfigError([Problem("model", None, str(exc), "deploy_search")]) from None
            self._checked.add(tp)

    def pool(self, tp: int, ratio: float) -> Tuple[int, int, float]:
        """(device KV tokens, host KV tokens, KV bytes per token per rank) of one server."""
        from ..memory.plan import pool_pages
        key = (tp, ratio)
        if key not in self._pool:
            rec = dataclasses.replace(self.record, tp_size=tp, enable_hierarchical_cache=ratio > 0,
                                      hicache_ratio=ratio if ratio > 0 else self.record.hicache_ratio)
            p = pool_pages(rec, self.hardware)
            self._pool[key] = (p.device_pages * p.page_size, p.host_pages * p.page_size, p.bytes_per_page / p.page_size)
        return self._pool[key]

    def server(self, tp: int, ratio: float, policy: str, *, role: str, chunk: Optional[int] = None):
        """One server's record: TP, HiCache (host tier ``ratio`` x the device pool) and eviction policy."""
        self.pass_model(tp)
        rec = dataclasses.replace(self.record, tp_size=tp, radix_eviction_policy=policy,
                                  enable_hierarchical_cache=ratio > 0,
                                  hicache_ratio=ratio if ratio > 0 else self.record.hicache_ratio)
        if chunk:
            rec = dataclasses.replace(rec, chunked_prefill_size=int(chunk))
        if role != "agg":
            rec = dataclasses.replace(rec, disaggregation_mode=role)
        return rec

    def plan(self, c: Candidate) -> Plan:
        from ..workload.assemble import DeploymentInputs
        if c.mode == "agg":
            inputs = DeploymentInputs(self.hardware, record=self.server(c.tp, c.hicache_ratio, c.policy, role="agg",
                                                                        chunk=c.chunk),
                                      workers=c.workers, router_policy=c.router_policy)
        else:
            # decode servers keep no radix cache in PD (SGLang's rule D-PD), so no HiCache either
            inputs = DeploymentInputs(self.hardware, prefill=self.server(c.tp, c.hicache_ratio, c.policy, role="prefill"),
                                      decode=self.server(c.decode_tp, 0.0, c.policy, role="decode"),
                                      prefill_workers=c.workers, decode_workers=c.decode_workers,
                                      router_policy=c.router_policy)
        return Plan(c.mode, c.gpus, inputs)


# --------------------------------------------------------------------------- evaluation
_WORK: Dict[str, Any] = {}


def _init_worker(requests: Sequence, sla: Sla, rate_search: bool, arrival: str = "spread",
                 time_scale: float = 1.0) -> None:
    _WORK.update(requests=requests, sla=sla, rate_search=rate_search, arrival=arrival, time_scale=time_scale)


def _evaluate_one(plan: Plan) -> Dict[str, Any]:
    requests, sla = _WORK["requests"], _WORK["sla"]
    how = dict(arrival=_WORK["arrival"], time_scale=_WORK["time_scale"])
    if not _WORK["rate_search"]:
        return evaluate(plan, requests, sla, **how)
    return rate_search(plan, requests, sla, **how)


def base_rate(requests: Sequence, arrival: str = "spread", time_scale: float = 1.0) -> float:
    """The trace's own request rate as simulated: requests after the first over the time they span."""
    from ..workload.arrivals import arrival_times
    if len(requests) < 2:
        return 0.0
    times = arrival_times([r.timestamp for r in requests], how=arrival, time_scale=time_scale)
    span = max(times) - min(times)
    return (len(requests) - 1) / span if span > 0 else math.inf


def rate_search(plan: Plan, requests: Sequence, sla: Sla, *, arrival: str = "spread",
                time_scale: float = 1.0) -> Dict[str, Any]:
    """The highest multiple of the trace's request rate at which ``plan`` meets the SLA (bisection
    on the factor; the SLA is taken to hold on the whole interval below the highest passing
    rate), with the figures at that rate.  ``rate_rps`` 0 when even the slowest rate tried fails."""
    base = base_rate(requests, arrival, time_scale)
    if not math.isfinite(base) or base <= 0:
        raise ValueError("the rate search needs a trace whose arrivals span some time")
    tried: Dict[float, Dict[str, Any]] = {}

    def at(f: float) -> Dict[str, Any]:
        if f not in tried:
            # f x the rate: every arrival time (spread within its tick as at f = 1) divided by f
            tried[f] = evaluate(plan, requests, sla, arrival=arrival, time_scale=time_scale / f)
        return tried[f]

    lo, hi = 0.0, 1.0
    while meets(at(hi), sla) and hi < 2 ** 12:          # up until it fails
        lo, hi = hi, hi * 2
    if lo == 0.0:                                        # down until it holds
        f = 0.5
        while f > 2 ** -10 and not meets(at(f), sla):
            hi, f = f, f / 2
        if not meets(at(f), sla):
            out = dict(at(f))
            out.update(rate_rps=0.0, rate_factor=0.0, tokens_per_s_per_gpu=0.0, closest=shortfall(at(f), sla))
            return out
        lo = f
    for _ in range(_RATE_STEPS):
        if (hi - lo) / hi <= _RATE_TOLERANCE:
            break
        mid = (lo + hi) / 2
        if meets(at(mid), sla):
            lo = mid
        else:
            hi = mid
    out = dict(at(lo))
    mean_osl = sum(r.output_length for r in requests) / len(requests)
    out.update(rate_rps=base * lo, rate_factor=lo,
               # at a rate it keeps up with, a deployment serves what arrives
               tokens_per_s_per_gpu=base * lo * mean_osl / plan.gpus, closest=shortfall(at(lo), sla))
    return out


def evaluate_all(plans: Sequence[Plan], requests: Sequence, sla: Sla, *, rate: bool,
                 processes: int, arrival: str = "spread", time_scale: float = 1.0) -> List[Dict[str, Any]]:
    """Every plan's figures, in order (a process pool when it has more than one process)."""
    if processes <= 1 or len(plans) <= 1:
        _init_worker(requests, sla, rate, arrival, time_scale)
        return [_evaluate_one(p) for p in plans]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    # the costliest first, so no process is left alone with one at the end (each plan's figures
    # depend on it alone; the results are put back in the plans' order)
    order = sorted(range(len(plans)), key=lambda i: -_cost_hint(plans[i]))
    out: List[Dict[str, Any]] = [{} for _ in plans]
    with ProcessPoolExecutor(max_workers=min(processes, len(plans)), mp_context=ctx, initializer=_init_worker,
                             initargs=(requests, sla, rate, arrival, time_scale)) as pool:
        for i, res in zip(order, pool.map(_evaluate_one, [plans[i] for i in order], chunksize=1)):
            out[i] = res
    return out


def _cost_hint(plan: Plan) -> int:
    """How many engines decode pass by pass: a disaggregated deployment's decode engines step one
    pass per event (their neighbours' events cut their runs), which is what makes a plan slow to simulate."""
    inputs = plan.inputs
    if plan.mode != "disagg":
        return 1
    return 1 + int(getattr(inputs, "decode_workers", 1) or 1) * int(getattr(inputs.decode, "dp_size", 1) or 1)


# --------------------------------------------------------------------------- the job
def _trace(job: dict) -> Tuple[List[Any], str]:
    from ..workload.trace import TraceError, load_trace
    try:
        trace = load_trace(job.get("trace"), max_requests=job.get("max_requests"))
    except (TraceError, OSError) as exc:
        raise ConfigError([Problem("job.trace", None, str(exc), "deploy_search")]) from None
    # the simulation places the arrivals (job.arrival, job.time_scale) as job=replay does
    return list(trace.requests), str(trace.path)


def _deploy_key(settings, key: str):
    """A deploy key from DeploySettings or a plain mapping (a job context's ``deploy``)."""
    return settings.get(key) if isinstance(settings, dict) else getattr(settings, key, None)


def _budget(settings, hardware) -> Tuple[int, Optional[int], List[Problem]]:
    node = getattr(hardware, "gpus_per_node", None)
    total = _deploy_key(settings, "total_gpus") or node
    if not total:
        return 0, node, [Problem("deploy.total_gpus", None, f"is not set and hardware={getattr(hardware, 'name', 'local')} "
                                 f"does not say how many GPUs a node has; set deploy.total_gpus=N or choose a hardware "
                                 f"preset (hardware=h100_80gb)", "deploy_search")]
    return int(total), node, []


def run(target, job: dict, ctx: JobContext) -> Dict[str, Any]:
    record = target.servers[0].record if isinstance(target, Deployment) else target
    hardware = getattr(target, "hardware", None) or ctx.hardware
    sla_cfg, space = _group(job, "sla"), _group(job, "search")
    problems = _settings_problems(job, sla_cfg, space)
    settings = getattr(target, "settings", None) or getattr(ctx, "deploy", None)
    total, node, budget_problems = _budget(settings, hardware)
    problems += budget_problems
    fixed_policy = _deploy_key(settings, "router_policy")
    if fixed_policy is not None and fixed_policy not in MODELLED_ROUTER_POLICIES:
        problems.append(Problem("deploy.router_policy", None, f"{fixed_policy!r} routes by a request header a trace "
                                f"does not carry; the search models: {', '.join(MODELLED_ROUTER_POLICIES)}",
                                "deploy_search"))
    if hardware is None or not getattr(hardware, "bf16_tflops", None):
        problems.append(Problem("hardware", None, "the search times every pass on a GPU model: choose a hardware "
                                "preset (hardware=h100_80gb, h200_141gb, a100_80gb, l40s_48gb)", "deploy_search"))
    out_dir = job.get("output_dir")
    if out_dir:
        from pathlib import Path
        target_dir = Path(str(out_dir)).expanduser()
        if (target_dir / "deploy_search.json").exists() or (target_dir.exists() and not target_dir.is_dir()):
            problems.append(Problem("job.output_dir", None, f"{out_dir!r} already holds a deploy search (or is a "
                                    f"file); choose another directory or remove it", "deploy_search"))
        elif not ctx.multirun:
            ctx.output_dir = target_dir
    if problems:
        raise ConfigError(problems)
    too_wide = [t for t in space["tp"] if t > total or (node and t > node)]
    if len(too_wide) == len(space["tp"]):
        raise ConfigError([Problem("job.search.tp", None, f"every TP size ({', '.join(map(str, too_wide))}) is over "
                                   f"deploy.total_gpus {total}" + (f" or one node of {node} GPUs" if node else "")
                                   + ": one server of workers x TP does not fit", "deploy_search")])
    requests, trace_name = _trace(job)
    sla = Sla(float(sla_cfg["ttft_ms"]), float(sla_cfg["tpot_ms"]), int(sla_cfg["percentile"]))
    engines = _Engines(record, hardware)
    candidates = enumerate_candidates(total, node, space, _deploy_key(settings, "router_policy"))
    longest = max(requests, key=lambda r: r.input_length + r.output_length)
    need = longest.input_length + longest.output_length
    fit, unfit = [], []
    for c in candidates:
        pool_tp = c.tp if c.mode == "agg" else c.decode_tp
        (fit if engines.pool(pool_tp, 0.0)[0] >= need else unfit).append(c)
    if not fit:
        largest = max(engines.pool(t, 0.0)[0] for t in {c.tp if c.mode == "agg" else c.decode_tp for c in candidates})
        raise ConfigError([Problem("job.trace", None, f"no decode pool can hold the trace's longest request "
                                   f"({need:,} tokens of prompt and output); the largest, at TP "
                                   f"{max(space['tp'])}, holds {largest:,} tokens: allow larger TP (job.search.tp) "
                                   f"or cut the trace (job.max_requests)", "deploy_search")])
    rate = bool(job.get("rate_search"))
    plans = [engines.plan(c) for c in fit]
    results = evaluate_all(plans, requests, sla, rate=rate, processes=int(job.get("processes", 2)),
                           arrival=str(job.get("arrival") or "spread"), time_scale=float(job.get("time_scale", 1.0)))
    rows = [_row(c, m, sla, rate) for c, m in zip(fit, results)]
    rows += [_unfit_row(c, engines, need) for c in unfit]
    rows.sort(key=lambda r: _rank_key(r, rate))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    passing = [r for r in rows if r["meets_sla"]]
    if not passing:
        close = min((r for r in rows if r["status"] != "rejected"), key=lambda r: r["closest"], default=rows[0])
        p = sla.percentile
        raise ConfigError([Problem("job.sla", None, f"no deployment meets P{p} TTFT <= {sla.ttft_ms:g} ms and P{p} "
                                   f"TPOT <= {sla.tpot_ms:g} ms on this trace; the closest, {close['mode']} "
                                   f"{close['layout']}, has P{p} TTFT {close[f'ttft_p{p}_ms']:,.0f} ms and P{p} TPOT "
                                   f"{close[f'tpot_p{p}_ms']:,.1f} ms ({close['status']}; {_over(close, sla)})",
                                   "deploy_search")])
    best = passing[0]
    best_runnable = next((r for r in passing if r["runnable"]), None)
    out_dir = ctx.out_dir()
    summary = {"schema_version": SCHEMA_VERSION, "best": output_row(_best(best, best_runnable)),
               "sla": dataclasses.asdict(sla), "rate_search": rate,
               "trace": trace_name, "requests": len(requests), "total_gpus": total,
               "hardware": getattr(hardware, "name", None), "model": record.model_path,
               "deployments_evaluated": len(rows), "meeting_sla": len(passing), "out_dir": str(out_dir),
               "deployments": [output_row(r) for r in rows]}
    _write_outputs(out_dir, rows, summary, best, best_runnable, record, hardware, total, rate, sla, trace_name)
    if job.get("format") == "json":
        import json
        print(json.dumps(summary, indent=2))
    else:
        print(_table(rows[: int(job.get("top", 20))], rate, sla, len(rows)))
        print(f"best: {best['mode']} {best['layout']} ({best['gpus']} GPUs, {_memory_text(best)}, router "
              f"{best['router_policy']}): {best['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU"
              + (f" at {best['rate_rps']:.2f} requests/s" if rate else
                 f", {best['goodput_rps_per_gpu']:.3f} good requests/s/GPU"))
        print(f"wrote {out_dir}/summary.csv, pareto.png, best_deploy.yaml, deploy_search.json")
        print(f"launch it: sglang-hydra --config {out_dir}/best_deploy.yaml job=launch job.dry_run=true")
    if not best["runnable"]:
        alt = (f"; the best that plain SGLang runs is {best_runnable['mode']} {best_runnable['layout']} with "
               f"{best_runnable['policy']}" if best_runnable else "")
        print(f"sglang-hydra: note: the best deployment uses eviction policy {best['policy']!r}, which SGLang 0.5.23 "
              f"does not have; it needs this project's SGLang plugin on every server (best_deploy.yaml says so){alt}",
              file=sys.stderr)
    return summary


def _over(row: Dict[str, Any], sla: Sla) -> str:
    p = sla.percentile
    parts = []
    for key, bound in ((f"ttft_p{p}_ms", sla.ttft_ms), (f"tpot_p{p}_ms", sla.tpot_ms)):
        if row[key] > bound:
            parts.append(f"{key.split('_')[0].upper()} {100 * (row[key] / bound - 1):,.0f} % over")
    return ", ".join(parts) or "within the bounds but not keeping up with the arrivals"


def _row(c: Candidate, m: Dict[str, Any], sla: Sla, rate: bool) -> Dict[str, Any]:
    row = {"rank": 0, "mode": c.mode, "layout": c.layout, "gpus": c.gpus, "workers": c.workers, "tp": c.tp,
           "decode_workers": c.decode_workers, "decode_tp": c.decode_tp, "hicache_ratio": c.hicache_ratio,
           "policy": c.policy, "router_policy": c.router_policy, "chunked_prefill_size": c.chunk,
           "runnable": c.runnable}
    row.update(m)
    row["meets_sla"] = (m.get("rate_rps", 0) > 0) if rate else meets(m, sla)
    row.setdefault("closest", shortfall(m, sla))
    return row


def _unfit_row(c: Candidate, engines: _Engines, need: int) -> Dict[str, Any]:
    pool = engines.pool(c.tp if c.mode == "agg" else c.decode_tp, 0.0)[0]
    return {"rank": 0, "mode": c.mode, "layout": c.layout, "gpus": c.gpus, "workers": c.workers, "tp": c.tp,
            "decode_workers": c.decode_workers, "decode_tp": c.decode_tp, "hicache_ratio": c.hicache_ratio,
            "policy": c.policy, "router_policy": c.router_policy, "chunked_prefill_size": c.chunk,
            "runnable": c.runnable, "status": "rejected",
            "note": f"its pool of {pool:,} tokens cannot hold the longest request ({need:,})", "meets_sla": False,
            "closest": math.inf, "tokens_per_s_per_gpu": 0.0, "tokens_per_s_per_user": 0.0,
            "goodput_rps_per_gpu": 0.0, **{f"{k}_p{p}_ms": 0.0 for k in ("ttft", "tpot") for p in PERCENTILES}}


def _rank_key(r: Dict[str, Any], rate: bool):
    """Meeting the SLA first; then goodput per GPU (rate search: tokens/s per GPU at the highest rate);
    ties: fewer GPUs, then the layout's name (so the order never depends on timing)."""
    score = r["tokens_per_s_per_gpu"] if rate else r["goodput_rps_per_gpu"]
    return (not r["meets_sla"], -round(score, 9), r["gpus"], r["mode"], r["layout"], r["hicache_ratio"],
            r["policy"], r["router_policy"], r["chunked_prefill_size"] or 0)


def _best(best: Dict[str, Any], runnable: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    keep = ("mode", "layout", "gpus", "workers", "tp", "decode_workers", "decode_tp", "hicache_ratio", "policy",
            "router_policy", "chunked_prefill_size", "runnable", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "goodput_rps_per_gpu",
            "ttft_p90_ms", "tpot_p90_ms", "rate_rps")
    out = {k: best[k] for k in keep if k in best}
    if not best["runnable"]:
        out["engine_note"] = (f"eviction policy {best['policy']!r} is not in SGLang 0.5.23; it needs this project's "
                              f"SGLang plugin on every server")
        out["best_runnable_layout"] = f"{runnable['mode']} {runnable['layout']} ({runnable['policy']})" if runnable else None
    return out


def _memory_text(r: Dict[str, Any]) -> str:
    return (f"HiCache x{r['hicache_ratio']:g}" if r["hicache_ratio"] else "no HiCache") + f", {r['policy']}"


# --------------------------------------------------------------------------- output
_COLUMNS = [("rank", "#", "{}"), ("mode", "mode", "{}"), ("layout", "layout", "{}"), ("gpus", "GPUs", "{}"),
            ("hicache_ratio", "hicache", "{:g}"), ("policy", "policy", "{}"), ("router_policy", "router", "{}"),
            ("chunked_prefill_size", "chunk", "{}"),
            ("status", "status", "{}"), ("ttft_p90_ms", "TTFT p90 ms", "{:,.0f}"), ("tpot_p90_ms", "TPOT p90 ms", "{:,.1f}"),
            ("tokens_per_s_per_gpu", "tok/s/GPU", "{:,.0f}"), ("tokens_per_s_per_user", "tok/s/user", "{:,.1f}")]


def _table(rows: List[Dict[str, Any]], rate: bool, sla: Sla, total_rows: int) -> str:
    cols = list(_COLUMNS)
    cols += [("rate_rps", "max req/s", "{:.2f}")] if rate else [("goodput_rps_per_gpu", "good req/s/GPU", "{:.3f}")]
    cols += [("meets_sla", "SLA", "{}")]
    cells = [[h for _k, h, _f in cols]]
    for r in rows:
        line = []
        for k, _h, f in cols:
            v = r.get(k)
            if k == "meets_sla":
                v = "yes" if v else "no"
            elif k == "policy" and not r["runnable"]:
                v = f"{v}*"
            line.append(f.format(v) if v is not None else "-")
        cells.append(line)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    text = "\n".join("  ".join(c.rjust(w) if i in (0, 3) or i >= 9 else c.ljust(w) for i, (c, w) in
                               enumerate(zip(row, widths))) for row in cells)
    p = sla.percentile
    head = (f"deployments ranked by {'output tokens/s per GPU at the highest request rate' if rate else 'SLA goodput per GPU'}"
            f" (SLA: P{p} TTFT <= {sla.ttft_ms:g} ms, P{p} TPOT <= {sla.tpot_ms:g} ms); {len(rows)} of {total_rows} shown")
    foot = "\n* not in SGLang 0.5.23 (needs this project's plugin)" if any(not r["runnable"] for r in rows) else ""
    return f"{head}\n{text}{foot}"


#: the searched layout's keys as the outputs name them (docs/outputs.md): an aggregated row has
#: ``workers`` x ``tp``; a disaggregated one names each side (the rows' own ``workers``/``tp`` are
#: the prefill side there); the other mode's keys are null
_LAYOUT_KEYS = ("workers", "tp", "prefill_workers", "prefill_tp", "decode_workers", "decode_tp")
#: internal ranking figures that are not outputs (``closest``: how far from the SLA, floored at 10
#: for a point that is not ok, only to name the nearest miss when none meets the SLA)
_INTERNAL_KEYS = ("closest",)
#: row keys named as job=replay's metrics.json names the same quantity (one name per quantity)
_OUTPUT_NAMES = {"policy": "eviction_policy", "goodput_share": "sla_met_share", "requests": "requests_total"}


def output_row(row: Dict[str, Any]) -> Dict[str, Any]:
    """One deployment as ``summary.csv`` and ``deploy_search.json`` write it: side-explicit layout
    keys, in a fixed place after ``gpus``, each quantity under job=replay's name for it
    (``eviction_policy``, ``sla_met_share``, ``requests_total``), and no internal figure."""
    agg = row.get("mode") == "agg"
    layout = {"workers": row.get("workers") if agg else None, "tp": row.get("tp") if agg else None,
              "prefill_workers": None if agg else row.get("workers"), "prefill_tp": None if agg else row.get("tp"),
              "decode_workers": None if agg else row.get("decode_workers"),
              "decode_tp": None if agg else row.get("decode_tp")}
    out: Dict[str, Any] = {}
    for k, v in row.items():
        if k in _LAYOUT_KEYS or k in _INTERNAL_KEYS:
            continue
        out[_OUTPUT_NAMES.get(k, k)] = v
        if k == "gpus":
            out.update(layout)
    if "gpus" not in row:
        out.update(layout)
    return out


def _csv(rows: List[Dict[str, Any]]) -> str:
    rows = [output_row(r) for r in rows]
    keys: List[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in keys})
    return buf.getvalue()


def _model_entry(record) -> Any:
    """The model as ``--config`` takes it back: the preset's name when the record is a preset's
    model (its KV geometry then comes along, so job=replay and job=plan accept the file), else
    the model path (a checkpoint directory carries its own config.json)."""
    from ..config.rules.model_facts import presets_named_by
    from ..memory.geometry import GEOMETRY_FIELDS
    for name, data in presets_named_by(str(record.model_path or "")):
        if all(getattr(record, f, None) == data[f] for f in GEOMETRY_FIELDS if f in data):
            return name
    return {"model_path": record.model_path}


def best_deploy_yaml(best: Dict[str, Any], record, hardware, total: int, header: List[str]) -> str:
    """The best deployment as a --config file for job=launch, job=resolve, job=replay and job=plan."""
    import yaml
    memory: Dict[str, Any] = {"radix_eviction_policy": best["policy"]}
    if best["hicache_ratio"]:
        memory.update(enable_hierarchical_cache=True, hicache_ratio=float(best["hicache_ratio"]))
    data: Dict[str, Any] = {}
    if best["mode"] == "agg":
        data["deploy"] = {"name": "single", "workers": best["workers"], "total_gpus": total}
        if best["workers"] > 1:
            data["deploy"]["router_policy"] = best["router_policy"]
        data["model"] = _model_entry(record)
        data["parallel"] = {"tp_size": best["tp"]}
        data["memory"] = memory
        if best.get("chunked_prefill_size"):
            data["schedule"] = {"chunked_prefill_size": best["chunked_prefill_size"]}
    else:
        data["deploy"] = {"name": "pd", "prefill_workers": best["workers"], "decode_workers": best["decode_workers"],
                          "total_gpus": total}
        if best["workers"] > 1 or best["decode_workers"] > 1:
            data["deploy"]["router_policy"] = best["router_policy"]
        data["model"] = _model_entry(record)
        data["prefill"] = {"parallel": {"tp_size": best["tp"]}, "memory": dict(memory)}
        data["decode"] = {"parallel": {"tp_size": best["decode_tp"]}}
    if record.enable_mixed_chunk:
        data["schedule"] = {**data.get("schedule", {}), "enable_mixed_chunk": True}
    if getattr(hardware, "name", None) and hardware.name != "local":
        data["hardware"] = hardware.name
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=110)
    return "".join(f"# {line}\n" for line in header) + body


def _write_outputs(out_dir, rows, summary, best, best_runnable, record, hardware, total, rate, sla, trace) -> None:
    import json
    p = sla.percentile
    header = [f"sglang-hydra job=deploy_search: the best of {len(rows)} deployments of {total} GPUs "
              f"({getattr(hardware, 'name', '?')}) for {record.model_path} on {trace}",
              f"SLA: P{p} TTFT <= {sla.ttft_ms:g} ms and P{p} TPOT <= {sla.tpot_ms:g} ms; "
              + (f"{best['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU at {best['rate_rps']:.2f} requests/s" if rate else
                 f"{best['goodput_rps_per_gpu']:.3f} good requests/s per GPU, {best['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU"),
              "start it: sglang-hydra --config <this file> job=launch   (job.dry_run=true prints the commands)"]
    if not best["runnable"]:
        header.insert(0, f"NOT RUNNABLE ON PLAIN SGLang 0.5.23: eviction policy {best['policy']!r} needs this "
                         f"project's SGLang plugin on every server"
                         + (f"; best runnable: {best_runnable['mode']} {best_runnable['layout']} "
                            f"({best_runnable['policy']})" if best_runnable else ""))
    atomic_write(out_dir / "summary.csv", _csv(rows))
    atomic_write(out_dir / "deploy_search.json", json.dumps(summary, indent=2, default=str))
    atomic_write(out_dir / "best_deploy.yaml", best_deploy_yaml(best, record, hardware, total, header))
    _pareto(out_dir / "pareto.png", rows, best, rate, sla)


def _pareto(path, rows, best, rate, sla) -> None:
    """tokens/s/user against tokens/s/GPU per deployment, each mode's frontier drawn, the best starred."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:               # pragma: no cover - matplotlib is a dependency
        return
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    colors = {"agg": "tab:blue", "disagg": "tab:orange"}
    shown = [r for r in rows if r["status"] != "rejected" and r["tokens_per_s_per_user"] > 0]
    for mode in MODES:
        pts = [r for r in shown if r["mode"] == mode]
        if not pts:
            continue
        ok = [r for r in pts if r["meets_sla"]]
        bad = [r for r in pts if not r["meets_sla"]]
        ax.scatter([r["tokens_per_s_per_user"] for r in ok], [r["tokens_per_s_per_gpu"] for r in ok], s=28,
                   color=colors[mode], label=f"{mode} (meets SLA)", zorder=3)
        ax.scatter([r["tokens_per_s_per_user"] for r in bad], [r["tokens_per_s_per_gpu"] for r in bad], s=28,
                   facecolors="none", edgecolors=colors[mode], label=f"{mode} (misses SLA)", zorder=2)
        front = _frontier(ok)
        if len(front) > 1:
            ax.plot([r["tokens_per_s_per_user"] for r in front], [r["tokens_per_s_per_gpu"] for r in front],
                    color=colors[mode], lw=1.2, zorder=2)
    ax.scatter([best["tokens_per_s_per_user"]], [best["tokens_per_s_per_gpu"]], marker="*", s=260, color="gold",
               edgecolors="black", zorder=4, label=f"best: {best['mode']} {best['layout']}")
    ax.axvline(1000.0 / sla.tpot_ms, color="grey", ls="--", lw=0.8, label=f"1 / TPOT bound ({1000 / sla.tpot_ms:g})")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("tokens/s/user (mean over the requests)")
    ax.set_ylabel("output tokens/s/GPU" + (" at the highest rate meeting the SLA" if rate else ""))
    ax.set_title("Deployments: per-GPU throughput against per-user speed")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write(path, buf.getvalue())


def _frontier(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The points no other point beats on both axes, by tokens/s/user."""
    pts = sorted(rows, key=lambda r: (-r["tokens_per_s_per_user"], -r["tokens_per_s_per_gpu"]))
    out, best_gpu = [], -1.0
    for r in pts:
        if r["tokens_per_s_per_gpu"] > best_gpu:
            out.append(r)
            best_gpu = r["tokens_per_s_per_gpu"]
    return out
