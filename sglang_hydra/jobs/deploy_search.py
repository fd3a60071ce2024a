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
from .search_pool import base_rate, drive, rate_search  # noqa: F401  (rate_search: this job's API)

# SGLang 0.5.23's own --radix-eviction-policy choices; other names (ghost_lru) are this project's
# and need its plugin on the engine (see docs/deploy_search.md)
ENGINE_EVICTION_POLICIES = ("lru", "lfu", "slru", "priority", "tlru")
MODES = ("agg", "disagg")
PERCENTILES = (50, 90, 99)
# router policies the evaluator models: manual routes by a request header a trace does not carry
MODELLED_ROUTER_POLICIES = tuple(p for p in ROUTER_POLICIES if p != "manual")


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
    dp: int = 1                     # agg: data-parallel engines inside each server (parallel.dp_size)

    @property
    def gpus(self) -> int:
        return self.workers * self.tp * self.dp + self.decode_workers * self.decode_tp

    @property
    def layout(self) -> str:
        if self.mode == "agg":
            return f"{self.workers} x TP{self.tp}" + (f" DP{self.dp}" if self.dp > 1 else "")
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
    def hicache_ratio_ok(r) -> bool:     # SGLang's rule: a host tier is more than 1 x the device pool; 0 = none
        return isinstance(r, (int, float)) and (r == 0 or r > 1) and math.isfinite(r)

    for r in space["hicache_ratio"]:
        if not hicache_ratio_ok(r):
            out.append(Problem("job.search.hicache_ratio", None, f"{r!r}: a HiCache host tier is more than 1 x the "
                               f"device pool (SGLang's rule); 0 means none", "deploy_search"))
    if space.get("question") not in QUESTIONS:
        out.append(Problem("job.search.question", None, f"{space.get('question')!r} is not one of: "
                           f"{', '.join(QUESTIONS)}", "deploy_search"))
    levers = space.get("levers")
    if not isinstance(levers, (list, tuple)):
        out.append(Problem("job.search.levers", None, f"{levers!r} must be a list (possibly empty) of: "
                           f"{', '.join(LEVERS)}", "deploy_search"))
        space["levers"] = []
    for lv in space["levers"]:
        if lv not in LEVERS:
            out.append(Problem("job.search.levers", None, f"{lv!r} is not one of: {', '.join(LEVERS)}", "deploy_search"))
    for key, lo, hi in (("lever_margin", 0.0, 1.0), ("break_rate_tolerance", 0.001, 0.5)):
        v = space.get(key)
        if not (isinstance(v, (int, float)) and lo <= v < hi):
            out.append(Problem(f"job.search.{key}", None, f"{v!r} is not a fraction in [{lo:g}, {hi:g})", "deploy_search"))
    v = space.get("lever_hicache_ratio")
    if not hicache_ratio_ok(v):
        out.append(Problem("job.search.lever_hicache_ratio", None, f"{v!r}: a HiCache host tier is more than 1 x the "
                           f"device pool; 0 skips the lever", "deploy_search"))
    for c in space.get("lever_chunked_prefill_size") or []:
        if not (isinstance(c, int) and c >= 1):
            out.append(Problem("job.search.lever_chunked_prefill_size", None, f"{c!r} is not a positive number of "
                               f"tokens", "deploy_search"))
    from .search_pool import EXECUTORS
    if space.get("executor") not in EXECUTORS:
        out.append(Problem("job.search.executor", None, f"{space.get('executor')!r} is not one of: "
                           f"{', '.join(EXECUTORS)}", "deploy_search"))
    h = sla.get("headroom")
    if not (isinstance(h, (int, float)) and 1 <= h <= 100 and math.isfinite(h)):
        out.append(Problem("job.sla.headroom", None, f"{h!r} is not a multiple of the trace's rate of at least 1 "
                           f"(1.25: the SLA must hold at 1.25x the rate; 1: no headroom)", "deploy_search"))
    b = sla.get("max_busy_share")
    if b is not None and not (isinstance(b, (int, float)) and 0 < b <= 1):
        out.append(Problem("job.sla.max_busy_share", None, f"{b!r} is not a share in (0, 1] (0.8: no engine busy more "
                           f"than 80 % of the time) or null", "deploy_search"))
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

    def server(self, tp: int, ratio: float, policy: str, *, role: str, chunk: Optional[int] = None, dp: int = 1):
        """One server's record: TP, DP, HiCache (host tier ``ratio`` x the device pool) and eviction policy."""
        self.pass_model(tp)
        rec = dataclasses.replace(self.record, tp_size=tp, radix_eviction_policy=policy, dp_size=dp,
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
                                                                        chunk=c.chunk, dp=c.dp),
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


# --------------------------------------------------------------------------- the questions
QUESTIONS = ("both", "fewest_gpus", "best_service", "all")
LEVERS = ("router_policy", "dp", "hicache", "chunked_prefill")
_LEVER_ROUTERS = ("cache_aware", "round_robin")


class _Interrupted(KeyboardInterrupt):
    """SIGTERM during the search: ends it the way Ctrl-C does (the finished rows are written)."""


@dataclass
class _Answer:
    question: str
    row: Dict[str, Any]
    levers: List[str] = dataclasses.field(default_factory=list)
    adopted: Optional[str] = None


class _Search:
    """The stages of one search: which deployments to run at which rate, decided from what came back.

    * ``fewest GPUs``: by GPU count upwards, every deployment at ``headroom`` x the trace's rate
      (runs that miss stop early); a count with a deployment that holds ends the stage, and the
      counts above it are skipped.
    * ``best service``: the deployments that use all the GPUs; once one holds, the rest run only
      as long as they can still beat it (``outranked`` otherwise).
    * ``levers``: around each answer, the settings the grid does not vary (router policy, in-server
      DP instead of the router, HiCache, the prefill chunk); a variant that beats the answer by
      more than ``lever_margin`` (or holds on fewer GPUs) replaces it and the report says so.
    * ``break rates``: each answer at the trace's own rate, and the rate at which it breaks the SLA.
    """

    def __init__(self, *, engines, pool, progress, sla: Sla, headroom: float, max_busy: Optional[float], total: int,
                 base_rps: float, question: str, levers: Sequence[str], margin: float, tolerance: float,
                 lever_hicache: float, lever_chunks: Sequence[int], rate: bool):
        self.engines, self.pool, self.progress, self.sla = engines, pool, progress, sla
        self.headroom, self.max_busy, self.total, self.base_rps = headroom, max_busy, total, base_rps
        self.question, self.levers, self.margin, self.tolerance = question, list(levers), margin, tolerance
        self.lever_hicache, self.lever_chunks, self.rate = lever_hicache, list(lever_chunks), rate
        self.rows: Dict[Candidate, Dict[str, Any]] = {}
        self.in_flight: Dict[int, Any] = {}
        self.queue: List[Candidate] = []               # the current stage's deployments not started yet
        self.stage = ""
        self.answers: Dict[str, _Answer] = {}
        self.full = 0
        self.later: Dict[Candidate, str] = {}

    # ---- rows
    def _holds(self, row: Dict[str, Any]) -> bool:
        return bool(row.get("meets_sla"))

    def _ratio(self, row: Dict[str, Any]) -> float:
        return row.get("sla_latency_ratio", math.inf)

    def _record(self, c: Candidate, m: Dict[str, Any], stage: str) -> str:
        row = _row(c, m, self.sla, self.rate, self.total)
        if not self.rate:
            design = self.headroom * self.base_rps
            row["evaluated_at_rps"] = design
            row["busy_share"] = min(1.0, row.get("busy_share") or 0.0)
            if row["status"] == "ok":
                row["sla_latency_ratio"] = shortfall(m, self.sla)
            if self.max_busy is not None and row["meets_sla"] and row["busy_share"] > self.max_busy:
                row["meets_sla"] = False
                row["note"] = f"busiest engine {100 * row['busy_share']:.0f} % busy (job.sla.max_busy_share " \
                              f"{100 * self.max_busy:.0f} %)"
            if row["meets_sla"]:
                row["sla_holds_at_rps"] = design
            elif row["status"] in ("ok", "saturated") and self.max_busy is None:
                row["sla_breaks_by_rps"] = design
            if row["status"] == "outranked":
                row["note"] = "stopped once its TTFT percentile could no longer beat the best so far"
        row["stage"] = stage
        self.rows[c] = row
        return "holds" if row["meets_sla"] else row["status"] if row["status"] != "ok" else "misses"

    def _skip(self, c: Candidate, why: str) -> None:
        row = _unevaluated_row(c, self.total, "skipped", why)
        row["stage"] = self.stage
        self.rows[c] = row

    def _task(self, c: Candidate, outrank: Optional[float] = None) -> Tuple:
        if self.rate:
            return ("rate", self.engines.plan(c))
        return ("eval", self.engines.plan(c), self.headroom, outrank)

    def _run(self, name: str, items: List[Candidate], make_task, skip_why) -> None:
        self.stage = name
        self.progress.start(name, len(items))
        drive(self.pool, items, make_task, lambda c, m: self._record(c, m, name),
              lambda c: self._skip(c, skip_why(c)), self.progress, self.in_flight, self.queue)
        self.progress.end()

    # ---- stages
    def every(self, cands: List[Candidate]) -> None:
        order = sorted(cands, key=lambda c: -_cost_hint(self.engines.plan(c)))
        self._run("every deployment", order, lambda c: self._task(c), lambda c: "")

    def fewest(self, cands: List[Candidate], with_full: bool = False) -> None:
        """``with_full``: the best-service question's deployments (all the GPUs) run in the same
        pass, after the smaller counts, so no stage waits for another's last run."""
        best: Dict[int, float] = {}              # per GPU count, the best ratio that holds

        def task(c):
            held = [g for g in best if g < c.gpus]
            if held and not (with_full and c.gpus == self.full):
                return None
            bound = best.get(c.gpus)
            return self._task(c, bound * self.sla.ttft_ms if bound is not None else None)

        def note(c):
            return f"more GPUs than the fewest that hold the SLA ({min(best)})"

        def record(c, m):
            out = self._record(c, m, "best service" if with_full and c.gpus == self.full else "fewest GPUs")
            r = self.rows[c]
            if self._holds(r):
                best[c.gpus] = min(best.get(c.gpus, math.inf), self._ratio(r))
            return out
        self.stage = "fewest GPUs" + (" and best service" if with_full else "")
        self.progress.start(self.stage, len(cands))
        skipped: List[Candidate] = []
        drive(self.pool, sorted(cands, key=lambda c: (c.gpus, _order_key(c))), task, record,
              skipped.append, self.progress, self.in_flight, self.queue)
        self.later = {c: note(c) for c in skipped}      # a row once the other stages have not run them
        held = [self.rows[c]["gpus_used"] for c in cands if c in self.rows and self._holds(self.rows[c])]
        self.progress.end(f"the fewest GPUs that hold the SLA at {self.headroom:g}x the rate: "
                          f"{min(held)}" if held else "no deployment holds the SLA with the headroom")

    def service(self, cands: List[Candidate]) -> None:
        full = [c for c in cands if c.gpus == self.full and c not in self.rows]
        done = [self.rows[c] for c in cands if c.gpus == self.full and c in self.rows]
        best = [min((self._ratio(r) for r in done if self._holds(r)), default=math.inf)]

        def task(c):
            return self._task(c, best[0] * self.sla.ttft_ms if math.isfinite(best[0]) else None)

        def record(c, m):
            out = self._record(c, m, "best service")
            r = self.rows[c]
            if self._holds(r):
                best[0] = min(best[0], self._ratio(r))
            return out
        self.stage = "best service"
        self.progress.start(self.stage, len(full))
        drive(self.pool, sorted(full, key=_order_key), task, record, lambda c: None, self.progress, self.in_flight, self.queue)
        self.progress.end()

    def pick(self) -> None:
        """The answers from the rows so far."""
        held = [r for r in self.rows.values() if self._holds(r)]
        if not held:
            return
        key = lambda r: (self._ratio(r), _rank_key(r, False))   # noqa: E731
        if self.question in ("both", "fewest_gpus", "all"):
            g = min(r["gpus_used"] for r in held)
            self.answers["fewest_gpus"] = _Answer("fewest_gpus", min((r for r in held if r["gpus_used"] == g), key=key))
        if self.question in ("both", "best_service", "all"):
            top = [r for r in held if r["gpus_used"] == self.full] or \
                  [r for r in held if r["gpus_used"] == max(x["gpus_used"] for x in held)]
            self.answers["best_service"] = _Answer("best_service", min(top, key=key))

    def lever_stage(self) -> None:
        if not self.levers or not self.answers:
            return
        jobs: List[Tuple[Candidate, str, Optional[float], str]] = []     # variant, text, outrank ratio, answer
        seen = set(self.rows)
        for q, ans in self.answers.items():
            c = ans.row["_candidate"]
            bound = self._ratio(ans.row) * (1 - self.margin)
            for text, v in self.variants(c):
                if v not in seen:
                    seen.add(v)
                    jobs.append((v, text, bound, q))
            if q == "fewest_gpus":          # could a lever hold the SLA on fewer GPUs?
                below = [r for r in self.rows.values() if r["gpus_used"] < c.gpus and r["status"] != "skipped"
                         and r["status"] != "rejected" and not self._holds(r)]
                if below:
                    g = max(r["gpus_used"] for r in below)
                    miss = min((r for r in below if r["gpus_used"] == g), key=lambda r: r.get("closest", math.inf))
                    for text, v in self.variants(miss["_candidate"]):
                        if v not in seen:
                            seen.add(v)
                            jobs.append((v, text, None, q))
        texts = {v: (text, q) for v, text, _b, q in jobs}
        bounds = {v: b for v, _t, b, _q in jobs}
        self._run("levers", [v for v, *_ in jobs],
                  lambda v: self._task(v, bounds[v] * self.sla.ttft_ms if bounds[v] is not None else None),
                  lambda v: "")
        for v, (text, q) in texts.items():
            r = self.rows.get(v)
            if r is not None:
                r["lever"] = text
        for q, ans in self.answers.items():
            base = ans.row
            for v, (text, vq) in texts.items():
                r = self.rows.get(v)
                if vq != q or r is None:
                    continue
                ans.levers.append(_lever_line(text, r, base, self.sla, self.margin))
            def wins(r, q=q, base=base):
                if not self._holds(r):
                    return False
                if q == "fewest_gpus" and r["gpus_used"] < base["gpus_used"]:
                    return True
                return r["gpus_used"] == base["gpus_used"] and self._ratio(r) < self._ratio(base) * (1 - self.margin)
            better = [self.rows[v] for v, (_t, vq) in texts.items() if vq == q and v in self.rows and wins(self.rows[v])]
            if better:
                win = min(better, key=lambda r: (r["gpus_used"], self._ratio(r)))
                ans.adopted = f"{win['lever']} changes the answer: {win['mode']} {win['layout']} " \
                              f"({_service_text(win, self.sla)}) instead of {base['mode']} {base['layout']} " \
                              f"({_service_text(base, self.sla)})"
                ans.row = win

    def variants(self, c: Candidate) -> List[Tuple[str, Candidate]]:
        """The lever settings around ``c`` that the grid does not vary (each with the override text)."""
        out: List[Tuple[str, Candidate]] = []
        rep = dataclasses.replace
        if "router_policy" in self.levers and (c.workers > 1 or c.decode_workers > 1):
            for rp in _LEVER_ROUTERS:
                if rp != c.router_policy:
                    out.append((f"deploy.router_policy={rp}", rep(c, router_policy=rp)))
        if "dp" in self.levers and c.mode == "agg":
            if c.workers > 1 and c.dp == 1:
                out.append((f"deploy.workers=1 parallel.dp_size={c.workers} (in-server DP, no router)",
                            rep(c, workers=1, dp=c.workers, router_policy="cache_aware")))
            elif c.dp > 1 and c.workers == 1:
                out.append((f"deploy.workers={c.dp} parallel.dp_size=1 (router cache_aware, no in-server DP)",
                            rep(c, workers=c.dp, dp=1, router_policy="cache_aware")))
        if "hicache" in self.levers and not c.hicache_ratio and self.lever_hicache:
            out.append((f"memory.hicache_ratio={self.lever_hicache:g} (HiCache host tier)",
                        rep(c, hicache_ratio=float(self.lever_hicache))))
        if "chunked_prefill" in self.levers and c.mode == "agg":
            for ch in self.lever_chunks:
                if ch != c.chunk:
                    out.append((f"schedule.chunked_prefill_size={ch}", rep(c, chunk=int(ch))))
        return out

    def break_rates(self) -> None:
        rows = list({id(a.row): a.row for a in self.answers.values()}.values())
        by_cand = {r["_candidate"]: r for r in rows}

        def record(c, res):
            r = by_cand[c]
            base = res["at_trace_rate"]
            r["busy_share_at_trace_rate"] = base.get("busy_share")
            r["ttft_p90_ms_at_trace_rate"] = base.get(f"ttft_p{self.sla.percentile}_ms")
            r["tpot_p90_ms_at_trace_rate"] = base.get(f"tpot_p{self.sla.percentile}_ms")
            r["meets_sla_at_trace_rate"] = meets(base, self.sla)
            if res.get("break_factor"):
                r["sla_break_rate_rps"] = res["break_factor"] * self.base_rps
                r["sla_breaks_by_rps"] = res["break_factor"] * self.base_rps
            if res.get("held_factor"):
                r["sla_holds_at_rps"] = res["held_factor"] * self.base_rps
            return "profiled"
        self.stage = "break rates"
        self.progress.start(self.stage, len(by_cand))
        drive(self.pool, list(by_cand), lambda c: ("profile", self.engines.plan(c), self.headroom, self.tolerance),
              record, lambda c: None, self.progress, self.in_flight, self.queue)
        self.progress.end()


def _order_key(c: Candidate):
    """Likely best service first (wide TP, aggregated), so the bound that stops the rest comes early."""
    return (c.mode != "agg", -max(c.tp, c.decode_tp), -c.tp, c.workers, c.decode_workers, c.layout)


def _service_text(r: Dict[str, Any], sla: Sla) -> str:
    p = sla.percentile
    return (f"P{p} TTFT {r[f'ttft_p{p}_ms']:,.0f} ms, TPOT {r[f'tpot_p{p}_ms']:,.1f} ms, hit rate "
            f"{100 * r.get('token_hit_rate', 0.0):.1f} %")


def _lever_line(text: str, r: Dict[str, Any], base: Dict[str, Any], sla: Sla, margin: float) -> str:
    p = sla.percentile
    if r["status"] == "outranked":
        return f"{text}: no better (stopped once its P{p} TTFT could not beat the answer's by {100 * margin:g} %)"
    if not r["meets_sla"]:
        return f"{text} on {r['mode']} {r['layout']}: still misses the SLA ({r['status']}, P{p} TTFT " \
               f"{r[f'ttft_p{p}_ms']:,.0f} ms)" if r["gpus_used"] < base["gpus_used"] else \
               f"{text}: misses the SLA ({r['status']})"
    return (f"{text}{' on ' + r['mode'] + ' ' + r['layout'] if r['gpus_used'] != base['gpus_used'] else ''}: "
            f"P{p} TTFT {r[f'ttft_p{p}_ms']:,.0f} ms vs {base[f'ttft_p{p}_ms']:,.0f} ms, hit rate "
            f"{100 * r.get('token_hit_rate', 0.0):.1f} % vs {100 * base.get('token_hit_rate', 0.0):.1f} %")


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
    question = str(space.get("question") or "both")
    headroom = 1.0 if rate else float(sla_cfg.get("headroom") or 1.0)
    max_busy = sla_cfg.get("max_busy_share")
    arrival, time_scale = str(job.get("arrival") or "spread"), float(job.get("time_scale", 1.0))
    base_rps = base_rate(requests, arrival, time_scale)
    from .search_pool import Progress, SearchPool
    progress = Progress(enabled=job.get("format") != "json" or True)
    search = _Search(engines=engines, pool=None, progress=progress, sla=sla, headroom=headroom,
                     max_busy=float(max_busy) if max_busy is not None else None, total=total, base_rps=base_rps,
                     question=question, levers=[] if rate else list(space.get("levers") or []),
                     margin=float(space.get("lever_margin", 0.05)), tolerance=float(space.get("break_rate_tolerance", 0.05)),
                     lever_hicache=float(space.get("lever_hicache_ratio") or 0.0),
                     lever_chunks=[int(c) for c in space.get("lever_chunked_prefill_size") or []], rate=rate)
    search.full = max(c.gpus for c in fit)
    for c in unfit:
        search.rows[c] = _unfit_row(c, engines, need, total)
    import signal

    def _term(signum, frame):
        raise _Interrupted()
    previous_term = signal.signal(signal.SIGTERM, _term)
    pool = None
    try:
        pool = SearchPool(requests, sla, arrival=arrival, time_scale=time_scale, processes=int(job.get("processes", 2)),
                          executor=str(space.get("executor") or "local"), ray_address=space.get("ray_address"))
        search.pool = pool
        if rate or question == "all":
            search.every(fit)
        else:
            if question in ("both", "fewest_gpus"):
                search.fewest(fit, with_full=question == "both")
            if question in ("both", "best_service"):
                search.service(fit)
            for c in fit:
                if c not in search.rows:
                    search._skip(c, search.later.get(c) or "not needed for the question")
        if not rate:
            search.pick()
            search.lever_stage()
            search.break_rates()
        pool.close()
    except KeyboardInterrupt as exc:
        if pool is not None:
            pool.close(terminate=True)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _write_interrupted(ctx.out_dir(), search, fit, rate, sla, total, trace_name, len(requests))
        if isinstance(exc, _Interrupted):
            raise SystemExit(143) from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    rows = _ranked(list(search.rows.values()), rate or question == "all", rate)
    passing = [r for r in rows if r["meets_sla"]]
    if not passing:
        close = min((r for r in rows if r["status"] not in ("rejected", "skipped")), key=lambda r: r["closest"],
                    default=rows[0])
        p = sla.percentile
        at = f" at {headroom:g}x the trace's rate (job.sla.headroom)" if headroom != 1 else ""
        raise ConfigError([Problem("job.sla", None, f"no deployment meets P{p} TTFT <= {sla.ttft_ms:g} ms and P{p} "
                                   f"TPOT <= {sla.tpot_ms:g} ms on this trace{at}; the closest, {close['mode']} "
                                   f"{close['layout']}, has P{p} TTFT {close[f'ttft_p{p}_ms']:,.0f} ms and P{p} TPOT "
                                   f"{close[f'tpot_p{p}_ms']:,.1f} ms ({close['status']}; {_over(close, sla)})",
                                   "deploy_search")])
    answers = search.answers
    primary = (answers.get("best_service") if question == "best_service" else answers.get("fewest_gpus")) \
        if not (rate or question == "all") else None
    best = primary.row if primary else passing[0]
    for q, a in answers.items():
        a.row.setdefault("answer", "")
        a.row["answer"] = ",".join(x for x in (a.row["answer"], q) if x)
    best_runnable = best if best["runnable"] else next((r for r in passing if r["runnable"]), None)
    out_dir = ctx.out_dir()
    public = [_public(r) for r in rows]
    summary = {"schema_version": SCHEMA_VERSION, "question": question, "headroom": headroom,
               "best": output_row(_best(best, best_runnable)),
               "answers": {q: {**output_row(_best(a.row, None)), "levers": a.levers, "changed_by_lever": a.adopted}
                           for q, a in answers.items()},
               "sla": {**dataclasses.asdict(sla), "headroom": headroom, "max_busy_share": search.max_busy},
               "rate_search": rate, "trace": trace_name, "requests": len(requests), "trace_rate_rps": base_rps,
               "total_gpus": total, "hardware": getattr(hardware, "name", None), "model": record.model_path,
               "deployments_evaluated": sum(r["status"] != "skipped" for r in rows), "meeting_sla": len(passing),
               "out_dir": str(out_dir), "deployments": [output_row(r) for r in public]}
    report = _report(search, question, rate, sla, total, base_rps, rows)
    _write_outputs(out_dir, public, summary, _public(best), _public(best_runnable) if best_runnable else None, record,
                   hardware, total, rate, sla, trace_name, report,
                   _public(answers["best_service"].row) if "best_service" in answers and primary is not None
                   and answers["best_service"].row is not best else None)
    _write_failed(out_dir, rows, [])
    if job.get("format") == "json":
        import json
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(_table(rows[: int(job.get("top", 20))], rate, sla, len(rows), headroom))
        if report:
            print("\n".join(report))
        else:
            print(f"best: {best['mode']} {best['layout']} ({best['gpus_used']} of {total} GPUs, {_memory_text(best)}, "
                  f"router {best['router_policy']}): {best['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU"
                  + (f" at {best['rate_rps']:.2f} requests/s" if rate else
                     f", {best['goodput_rps_per_gpu']:.3f} good requests/s/GPU"))
        print(f"wrote {out_dir}/summary.csv, failed.csv, pareto.png, best_deploy.yaml, deploy_search.json")
        print(f"launch it: sglang-hydra --config {out_dir}/best_deploy.yaml job=launch job.dry_run=true")
    if not best["runnable"]:
        alt = (f"; the best that plain SGLang runs is {best_runnable['mode']} {best_runnable['layout']} with "
               f"{best_runnable['policy']}" if best_runnable else "")
        print(f"sglang-hydra: note: the best deployment uses eviction policy {best['policy']!r}, which SGLang 0.5.23 "
              f"does not have; it needs this project's SGLang plugin on every server (best_deploy.yaml says so){alt}",
              file=sys.stderr)
    return summary


def _ranked(rows: List[Dict[str, Any]], by_goodput: bool, rate: bool = False) -> List[Dict[str, Any]]:
    """The table's order.  The peers' and the exhaustive search: as before (goodput per GPU at the
    rate evaluated).  The questions: what holds first, fewest GPUs first, then the best service;
    then the misses (closest first); then what was not run."""
    if by_goodput:
        rows.sort(key=lambda r: (r["status"] == "skipped", _rank_key(r, rate)))
    else:
        rows.sort(key=lambda r: (0 if r["meets_sla"] else 2 if r["status"] in ("skipped", "rejected") else 1,
                                 r["gpus_used"] if r["meets_sla"] else 0,
                                 r.get("sla_latency_ratio", math.inf) if r["meets_sla"] else r.get("closest", math.inf),
                                 _rank_key(r, False)))
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return rows


def _public(r: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in r.items() if not k.startswith("_")}


def _report(search, question: str, rate: bool, sla: Sla, total: int, base_rps: float, rows) -> List[str]:
    """The question(s) in words and their answers."""
    if rate:
        return []
    p = sla.percentile
    h = search.headroom
    bound = f"P{p} TTFT <= {sla.ttft_ms:g} ms and P{p} TPOT <= {sla.tpot_ms:g} ms"
    room = (f"at {h:g}x the trace's rate ({h * base_rps:.2f} requests/s; the trace's own: {base_rps:.2f})"
            if h != 1 else f"at the trace's rate ({base_rps:.2f} requests/s)")
    if search.max_busy is not None:
        room += f" with no engine over {100 * search.max_busy:.0f} % busy"
    out = []
    skipped = sum(r["status"] == "skipped" for r in rows)
    outranked = sum(r["status"] == "outranked" for r in rows)
    out.append(f"ran {len(rows) - skipped} of {len(rows)} deployments ({skipped} skipped: not needed for the "
               f"question; {outranked} stopped early once they could not beat the best so far)")
    titles = {"fewest_gpus": f"the fewest GPUs that hold {bound} {room}",
              "best_service": f"the best service from all {search.full} GPUs (the lowest P{p} latency against "
                              f"the bounds) holding {bound} {room}"}
    for q in ("fewest_gpus", "best_service"):
        a = search.answers.get(q)
        if question not in ("both", "all", q):
            continue
        out.append(f"question: {titles[q]}?")
        if a is None:
            out.append("  answer: none of the deployments run holds it")
            continue
        r = a.row
        out.append(f"  answer: {r['mode']} {r['layout']} ({_memory_text(r)}, "
                   f"{'router ' + r['router_policy'] if r['workers'] > 1 or r['decode_workers'] > 1 else 'no router'})"
                   f" on {r['gpus_used']} of {total} GPUs ({r['gpus_idle']} idle)")
        out.append(f"  at {h:g}x the rate: {_service_text(r, sla)}; busiest engine {100 * r['busy_share']:.0f} % busy")
        if r.get("busy_share_at_trace_rate") is not None:
            out.append(f"  at the trace's rate: P{p} TTFT {r.get('ttft_p90_ms_at_trace_rate') or 0:,.0f} ms, TPOT "
                       f"{r.get('tpot_p90_ms_at_trace_rate') or 0:,.1f} ms; busiest engine "
                       f"{100 * r['busy_share_at_trace_rate']:.0f} % busy")
        if r.get("sla_break_rate_rps"):
            out.append(f"  breaks the SLA at {r['sla_break_rate_rps']:.2f} requests/s "
                       f"({r['sla_break_rate_rps'] / base_rps:.2f}x the trace's rate)")
        for line in a.levers:
            out.append(f"  lever {line}")
        if a.adopted:
            out.append(f"  NOTE: {a.adopted}")
    return out


def _write_failed(out_dir, rows: List[Dict[str, Any]], extra: List[Tuple[str, str, int, str]]) -> None:
    """failed.csv: every deployment without figures, and why (rejected, interrupted, not started)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["mode", "layout", "gpus_used", "status", "reason"])
    for r in rows:
        if r["status"] in ("rejected",):
            w.writerow([r["mode"], r["layout"], r["gpus_used"], r["status"], r.get("note", "")])
    for row in extra:
        w.writerow(row)
    atomic_write(out_dir / "failed.csv", buf.getvalue())


def _write_interrupted(out_dir, search, fit, rate, sla, total, trace_name, n_requests) -> None:
    """What an interrupted search leaves: the finished rows, their summary, and failed.csv with
    the deployments that were running (interrupted) or not started."""
    import json
    running = set(search.in_flight.values())
    extra = []
    known = set(fit)
    waiting = set(search.queue)
    for c in list(fit) + [c for c in list(running) + search.queue if c not in known]:     # lever variants too
        if c in waiting and c not in running and c not in search.rows:
            extra.append((c.mode, c.layout, c.gpus, "not started", f"waiting in stage {search.stage!r}"))
            continue
        if c in running:
            extra.append((c.mode, c.layout, c.gpus, "interrupted", f"running in stage {search.stage!r} when stopped"))
        elif c not in search.rows:
            extra.append((c.mode, c.layout, c.gpus, "not started", "the search was stopped first"))
    rows = _ranked([r for r in search.rows.values()], True)
    public = [_public(r) for r in rows]
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(out_dir / "summary.csv", _csv(public))
    atomic_write(out_dir / "deploy_search.json", json.dumps(
        {"schema_version": SCHEMA_VERSION, "interrupted": True, "stage": search.stage, "deployments_listed": len(fit),
         "deployments_evaluated": len(rows), "trace": trace_name, "requests": n_requests, "total_gpus": total,
         "deployments": [output_row(r) for r in public]}, indent=2, default=str))
    _write_failed(out_dir, rows, extra)
    print(f"sglang-hydra: deploy_search interrupted in stage {search.stage!r}: {len(rows)} finished rows in "
          f"{out_dir}/summary.csv; {len(extra)} deployments in failed.csv", file=sys.stderr)


def _over(row: Dict[str, Any], sla: Sla) -> str:
    p = sla.percentile
    parts = []
    for key, bound in ((f"ttft_p{p}_ms", sla.ttft_ms), (f"tpot_p{p}_ms", sla.tpot_ms)):
        if row[key] > bound:
            parts.append(f"{key.split('_')[0].upper()} {100 * (row[key] / bound - 1):,.0f} % over")
    return ", ".join(parts) or "within the bounds but not keeping up with the arrivals"


def _identity(c: Candidate, total: int) -> Dict[str, Any]:
    return {"rank": 0, "answer": "", "mode": c.mode, "layout": c.layout, "gpus_used": c.gpus, "gpus_idle": total - c.gpus,
            "workers": c.workers, "tp": c.tp, "dp": c.dp, "decode_workers": c.decode_workers, "decode_tp": c.decode_tp,
            "hicache_ratio": c.hicache_ratio, "policy": c.policy, "router_policy": c.router_policy,
            "chunked_prefill_size": c.chunk, "runnable": c.runnable, "_candidate": c}


def _row(c: Candidate, m: Dict[str, Any], sla: Sla, rate: bool, total: int = 0) -> Dict[str, Any]:
    row = _identity(c, total or c.gpus)
    row.update({k: v for k, v in m.items() if k != "gpus"})
    row["meets_sla"] = (m.get("rate_rps", 0) > 0) if rate else meets(m, sla)
    row.setdefault("closest", shortfall(m, sla))
    return row


def _zero_figures() -> Dict[str, Any]:
    return {"tokens_per_s_per_gpu": 0.0, "tokens_per_s_per_user": 0.0, "goodput_rps_per_gpu": 0.0, "busy_share": 0.0,
            **{f"{k}_p{p}_ms": 0.0 for k in ("ttft", "tpot") for p in PERCENTILES}}


def _unfit_row(c: Candidate, engines: _Engines, need: int, total: int = 0) -> Dict[str, Any]:
    pool = engines.pool(c.tp if c.mode == "agg" else c.decode_tp, 0.0)[0]
    return {**_identity(c, total or c.gpus), "status": "rejected",
            "note": f"its pool of {pool:,} tokens cannot hold the longest request ({need:,})", "meets_sla": False,
            "closest": math.inf, **_zero_figures()}


def _unevaluated_row(c: Candidate, total: int, status: str, why: str) -> Dict[str, Any]:
    return {**_identity(c, total), "status": status, "note": why, "meets_sla": False, "closest": math.inf,
            **_zero_figures()}


def _rank_key(r: Dict[str, Any], rate: bool):
    """Meeting the SLA first; then goodput per GPU (rate search: tokens/s per GPU at the highest rate);
    ties: fewer GPUs, then the layout's name (so the order never depends on timing)."""
    score = r["tokens_per_s_per_gpu"] if rate else r["goodput_rps_per_gpu"]
    return (not r["meets_sla"], -round(score, 9), r["gpus_used"], r["mode"], r["layout"], r["hicache_ratio"],
            r["policy"], r["router_policy"], r["chunked_prefill_size"] or 0, r.get("dp", 1))


_BEST_KEYS = ("mode", "layout", "gpus_used", "gpus_idle", "workers", "tp", "dp", "decode_workers", "decode_tp",
              "hicache_ratio", "policy", "router_policy", "chunked_prefill_size", "runnable", "tokens_per_s_per_gpu",
              "tokens_per_s_per_user", "goodput_rps_per_gpu", "ttft_p90_ms", "tpot_p90_ms", "busy_share",
              "sla_latency_ratio", "evaluated_at_rps", "sla_break_rate_rps", "sla_holds_at_rps", "sla_breaks_by_rps",
              "busy_share_at_trace_rate", "ttft_p90_ms_at_trace_rate", "tpot_p90_ms_at_trace_rate",
              "meets_sla_at_trace_rate", "token_hit_rate", "rate_rps")


def _best(best: Dict[str, Any], runnable: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    out = {k: best[k] for k in _BEST_KEYS if k in best}
    if not best["runnable"]:
        out["engine_note"] = (f"eviction policy {best['policy']!r} is not in SGLang 0.5.23; it needs this project's "
                              f"SGLang plugin on every server")
        out["best_runnable_layout"] = f"{runnable['mode']} {runnable['layout']} ({runnable['policy']})" if runnable else None
    return out


def _memory_text(r: Dict[str, Any]) -> str:
    return (f"HiCache x{r['hicache_ratio']:g}" if r["hicache_ratio"] else "no HiCache") + f", {r['policy']}"


# --------------------------------------------------------------------------- output
_COLUMNS = [("rank", "#", "{}"), ("answer", "answer", "{}"), ("mode", "mode", "{}"), ("layout", "layout", "{}"),
            ("gpus_used", "GPUs", "{}"), ("gpus_idle", "idle", "{}"),
            ("hicache_ratio", "hicache", "{:g}"), ("policy", "policy", "{}"), ("router_policy", "router", "{}"),
            ("chunked_prefill_size", "chunk", "{}"),
            ("status", "status", "{}"), ("ttft_p90_ms", "TTFT p90 ms", "{:,.0f}"), ("tpot_p90_ms", "TPOT p90 ms", "{:,.1f}"),
            ("busy_share", "busy", "{:.0%}"), ("tokens_per_s_per_gpu", "tok/s/GPU", "{:,.0f}"),
            ("tokens_per_s_per_user", "tok/s/user", "{:,.1f}")]
_RIGHT = {"rank", "gpus_used", "gpus_idle", "ttft_p90_ms", "tpot_p90_ms", "busy_share", "tokens_per_s_per_gpu",
          "tokens_per_s_per_user", "rate_rps", "goodput_rps_per_gpu", "sla_break_rate_rps"}
_SHORT = {"fewest_gpus": "fewest", "best_service": "service", "fewest_gpus,best_service": "both"}


def _break_text(r: Dict[str, Any]) -> str:
    """The rate at which a row breaks the SLA: found (answers), or the bracket its runs give."""
    if r.get("sla_break_rate_rps"):
        return f"{r['sla_break_rate_rps']:.2f}"
    if r.get("sla_holds_at_rps"):
        return f">{r['sla_holds_at_rps']:.2f}"
    if r.get("sla_breaks_by_rps"):
        return f"<{r['sla_breaks_by_rps']:.2f}"
    return "-"


def _table(rows: List[Dict[str, Any]], rate: bool, sla: Sla, total_rows: int, headroom: float = 1.0) -> str:
    cols = list(_COLUMNS)
    cols += [("rate_rps", "max req/s", "{:.2f}")] if rate else \
        [("goodput_rps_per_gpu", "good req/s/GPU", "{:.3f}"), ("sla_break_rate_rps", "breaks at req/s", "{}")]
    cols += [("meets_sla", "SLA" if headroom == 1 else f"SLA@{headroom:g}x", "{}")]
    cells = [[h for _k, h, _f in cols]]
    for r in rows:
        line = []
        for k, _h, f in cols:
            v = r.get(k)
            if k == "meets_sla":
                v = "yes" if v else "no" if r["status"] not in ("skipped", "outranked") else "?"
            elif k == "policy" and not r["runnable"]:
                v = f"{v}*"
            elif k == "router_policy" and r["workers"] <= 1 and r["decode_workers"] <= 1:
                v = "none" if r["mode"] == "agg" else "-"     # one server: no router; 1P1D: nothing to choose
            elif k == "answer":
                v = _SHORT.get(v or "", v or "")
            elif k == "sla_break_rate_rps":
                v = _break_text(r)
            elif r["status"] == "skipped" and k not in dict((c[0], 1) for c in _COLUMNS[:11]):
                v = None
            line.append(f.format(v) if v is not None else "-")
        cells.append(line)
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    text = "\n".join("  ".join(c.rjust(w) if cols[i][0] in _RIGHT else c.ljust(w) for i, (c, w) in
                               enumerate(zip(row, widths))) for row in cells)
    p = sla.percentile
    at = f" at {headroom:g}x the trace's rate" if headroom != 1 else ""
    head = (f"deployments ranked by {'output tokens/s per GPU at the highest request rate' if rate else 'the questions below'}"
            f" (SLA: P{p} TTFT <= {sla.ttft_ms:g} ms, P{p} TPOT <= {sla.tpot_ms:g} ms{at}); {len(rows)} of {total_rows} shown")
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
        if k in ("gpus", "gpus_used"):
            out.update(layout)
    if "gpus" not in row and "gpus_used" not in row:
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
        if best.get("dp", 1) > 1:
            data["parallel"]["dp_size"] = best["dp"]
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


def _yaml_header(r: Dict[str, Any], best_runnable, record, hardware, total: int, rate: bool, sla: Sla, trace: str,
                 n_rows: int, what: str) -> List[str]:
    p = sla.percentile
    header = [f"sglang-hydra job=deploy_search: {what}, of {n_rows} deployments of up to {total} GPUs "
              f"({getattr(hardware, 'name', '?')}) for {record.model_path} on {trace}",
              f"uses {r['gpus_used']} of the {total} GPUs ({r['gpus_idle']} idle)",
              f"SLA: P{p} TTFT <= {sla.ttft_ms:g} ms and P{p} TPOT <= {sla.tpot_ms:g} ms; "
              + (f"{r['tokens_per_s_per_gpu']:,.0f} tokens/s/GPU at {r['rate_rps']:.2f} requests/s" if rate else
                 f"held at {r.get('evaluated_at_rps', 0):.2f} requests/s (busiest engine "
                 f"{100 * r.get('busy_share', 0):.0f} % busy)"
                 + (f"; breaks at {r['sla_break_rate_rps']:.2f} requests/s" if r.get("sla_break_rate_rps") else "")
                 + (f"; at the trace's rate the busiest engine is {100 * r['busy_share_at_trace_rate']:.0f} % busy"
                    if r.get("busy_share_at_trace_rate") is not None else "")),
              "start it: sglang-hydra --config <this file> job=launch   (job.dry_run=true prints the commands)"]
    if not r["runnable"]:
        header.insert(0, f"NOT RUNNABLE ON PLAIN SGLang 0.5.23: eviction policy {r['policy']!r} needs this "
                         f"project's SGLang plugin on every server"
                         + (f"; best runnable: {best_runnable['mode']} {best_runnable['layout']} "
                            f"({best_runnable['policy']})" if best_runnable else ""))
    return header


def _write_outputs(out_dir, rows, summary, best, best_runnable, record, hardware, total, rate, sla, trace,
                   report: Sequence[str] = (), service: Optional[Dict[str, Any]] = None) -> None:
    import json
    what = {"fewest_gpus": "the fewest GPUs that hold the SLA with its headroom",
            "best_service": "the best service from all the GPUs"}
    question = summary.get("question")
    name = "best" if rate or question == "all" else "best_service" if question == "best_service" else "fewest_gpus"
    atomic_write(out_dir / "summary.csv", _csv(rows))
    atomic_write(out_dir / "deploy_search.json", json.dumps(summary, indent=2, default=str))
    atomic_write(out_dir / "best_deploy.yaml", best_deploy_yaml(
        best, record, hardware, total, _yaml_header(best, best_runnable, record, hardware, total, rate, sla, trace,
                                                    len(rows), what.get(name, "the best"))))
    if service is not None:
        atomic_write(out_dir / "best_service_deploy.yaml", best_deploy_yaml(
            service, record, hardware, total, _yaml_header(service, None, record, hardware, total, rate, sla, trace,
                                                           len(rows), what["best_service"])))
    if report:
        atomic_write(out_dir / "report.txt", "\n".join(report) + "\n")
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
    shown = [r for r in rows if r["status"] not in ("rejected", "skipped") and r["tokens_per_s_per_user"] > 0]
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
