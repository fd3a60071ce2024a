"""What each job is: its config schema (selected with ``job=<name>``) and its entry point.

Only dataclasses live here, so registering the ``job`` group never imports torch; a job's
implementation module is imported when that job runs.  Importing this module registers
every job's settings with the config layer (``config.registry``), which composes and checks
``job.*`` settings without importing this layer; the entry points stay here, for the runner.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..config.registry import register_job_schema


@dataclass
class ResolveJob:
    """Print the resolved flat record."""

    name: str = "resolve"
    format: str = "yaml"  # yaml | json | argv
    output: Optional[str] = None  # also write it to this file (atomically)
    check: str = "none"   # none | engine: also run the installed SGLang's own resolution on it
    python: Optional[str] = None  # interpreter for check=engine (unset: this one)


@dataclass
class SetupJob:
    """Plan, allocate and (optionally) verify the KV memory the record describes."""

    name: str = "setup"
    format: str = "table"   # table | json
    verify: bool = False
    rounds: int = 4
    progress: bool = True


@dataclass
class SlaSettings:
    """The latency targets a request must meet to count towards SLA goodput."""

    ttft_ms: float = 2000.0              # time to first token
    tpot_ms: float = 50.0                # time per output token after the first


@dataclass
class ReplayJob:
    """Simulate the deployment the record (or deploy=pd) describes on a request trace."""

    name: str = "replay"
    trace: Optional[str] = None          # Mooncake JSONL; unset: the bundled sample
    workload: str = "trace"              # trace | synthetic
    max_requests: Optional[int] = None
    mode: Optional[str] = None           # device_only | sim | full; unset: sim with HiCache, else device_only
                                         # (metadata: the old name of device_only, still accepted)
    policy: Optional[str] = None         # replay-only policies (belady, fifo) override the record's
    arrival: str = "spread"              # spread | as_is | poisson | sequential (docs/whatif.md)
    sla: SlaSettings = field(default_factory=SlaSettings)
    cache_semantics: str = "rules"       # rules | sglang: how the prefix cache stamps and evicts
    tail_threshold_tokens: int = 4096
    objective: str = "ttft_p90_ms"       # the value a sweep optimises (see OBJECTIVES)
    max_host_memory_gb: Optional[float] = None   # a budget: points above it are infeasible
    time_scale: float = 1.0              # arrival times x this (2: the trace at half its request rate); > 0
    on_bad_line: str = "fail"            # fail | skip
    format: str = "table"                # table | json
    progress: bool = True
    seed: int = 0                        # arrival spreading, routers' random choices, synthetic workload
    conversations: int = 200
    turns: int = 6
    per_request: bool = False            # also write requests.jsonl: one predicted line per request


@dataclass
class PdJob:
    """One side of a prefill/decode pair (role from disagg.disaggregation_mode)."""

    name: str = "pd"
    prefill: Optional[str] = None        # decode side: host:port of the prefill bootstrap server
    requests: Optional[int] = None       # prefill: None serves until idle; decode: how many to fetch
    pages_per_request: int = 8
    timeout: float = 120.0
    idle_timeout: float = 30.0
    verify: bool = True                  # decode: compare the received bytes with the test pattern


@dataclass
class PdPairJob:
    """Both PD sides as separate processes on 127.0.0.1, with latency and throughput."""

    name: str = "pd_pair"
    requests: int = 200
    pages_per_request: int = 8
    timeout: float = 120.0
    verify: bool = True
    format: str = "table"                # table | json


@dataclass
class LaunchJob:
    """Start the SGLang server(s) of the record or deployment, supervise them, stop them together."""

    name: str = "launch"
    python: Optional[str] = None             # the interpreter that has SGLang (None: this one)
    server_module: str = "sglang.launch_server"
    router_python: Optional[str] = None      # the interpreter that has sglang-router (None: job.python)
    router_module: str = "sglang_router.launch_router"
    health_timeout: float = 1800.0           # seconds for each server (then the router) to answer /health
    stop_timeout: float = 30.0               # seconds between SIGTERM and SIGKILL when stopping
    dry_run: bool = False                    # print the command lines, start nothing


@dataclass
class CalibrateJob:
    """Measure prefill efficiency and host<->device bandwidth on this GPU; write a hardware preset."""

    name: str = "calibrate"
    via: str = "auto"                    # auto | kernels | engine; auto: kernels on a GPU, the real engine without one
    device: str = "cuda"                 # kernels: cuda | cpu (cpu: a rehearsal with tiny shapes, not a calibration)
    python: Optional[str] = None         # engine: the interpreter that has SGLang (as job=launch)
    health_timeout: float = 600.0        # engine: seconds for the server to answer /health
    stop_timeout: float = 30.0           # engine: seconds between SIGTERM and SIGKILL when stopping it
    preset_name: Optional[str] = None    # name of the written preset (default: calibrated_<gpu>)
    repeats: int = 5
    format: str = "table"                # table | json


@dataclass
class ValidateTolerances:
    """How close a prediction must be to the engine (job.tolerance.*; null: not checked)."""

    cached_token_mismatches: Optional[int] = None   # requests whose cached tokens may differ
    hit_rate_points: Optional[float] = 1.0          # token hit rate, percentage points
    ttft_p50: Optional[float] = 0.25                # relative error of the run's TTFT P50
    ttft_p90: Optional[float] = 0.25                # relative error of the run's TTFT P90
    tpot_p50: Optional[float] = 0.25                # relative error of the run's TPOT P50
    worker_share_points: Optional[float] = 5.0      # each worker's share of the requests, points
    saturation: bool = True                         # predicted saturated iff measured saturated


@dataclass
class ValidateJob:
    """Launch the deployment, serve a trace through a real client, predict it, compare per request."""

    name: str = "validate"
    trace: Optional[str] = None          # Mooncake JSONL; unset: the bundled sample
    workload: str = "trace"              # trace | synthetic
    conversations: int = 40              # synthetic workload
    turns: int = 4
    seed: int = 0                        # rate pacing, synthetic workload
    on_bad_line: str = "fail"            # fail | skip: what a malformed trace line does
    block_size: int = 512                # tokens per hash id of the trace
    max_requests: int = 100
    max_input_tokens: Optional[int] = 8192     # longer prompts are left out (a CPU engine is slow)
    max_output_tokens: Optional[int] = 16      # outputs capped at this
    pacing: str = "sequential"           # sequential | trace | rate
    rate: Optional[float] = None         # requests/s for pacing=rate (Poisson)
    time_scale: float = 1.0              # pacing=trace: arrival times x this
    calibrate: bool = False              # fit this machine's pass-time model on the launched engine first
    url: Optional[str] = None            # validate a running deployment at this URL instead of launching
    python: Optional[str] = None         # the interpreter that has SGLang (as job=launch)
    router_python: Optional[str] = None  # the interpreter that has sglang-router (None: job.python)
    health_timeout: float = 600.0        # seconds for each server (then the router) to answer /health
    stop_timeout: float = 30.0           # seconds between SIGTERM and SIGKILL when stopping
    request_timeout: float = 600.0       # seconds one request may take before it counts as failed
    tolerance: ValidateTolerances = field(default_factory=ValidateTolerances)
    format: str = "table"                # table | json


# ---- job=deploy_search (the deployment search; sglang_hydra/jobs/deploy_search.py) ----
@dataclass
class SearchSlaSettings:
    """The service level a deployment must hold (job.sla.*)."""

    ttft_ms: Optional[float] = None      # time to first token bound, ms
    tpot_ms: Optional[float] = None      # time per output token bound, ms
    percentile: int = 90                 # the bounds hold for this percentile of the requests
    headroom: float = 1.25               # the bounds must still hold at this multiple of the trace's rate (1: none)
    max_busy_share: Optional[float] = None   # and no engine busier than this share of the time (unset: no limit)


@dataclass
class DeploySearchSpace:
    """What the deployment search enumerates (job.search.*)."""

    modes: List[str] = field(default_factory=lambda: ["agg", "disagg"])
    tp: List[int] = field(default_factory=lambda: [1, 2, 4, 8])        # TP sizes per server
    hicache_ratio: List[float] = field(default_factory=lambda: [0.0])  # 0: no HiCache host tier
    policies: List[str] = field(default_factory=lambda: ["lru"])       # radix eviction policies
    router_policies: List[str] = field(default_factory=lambda: ["cache_aware"])
    chunked_prefill_size: List[Optional[int]] = field(default_factory=lambda: [None])   # agg; None: the record's
    all_gpus: bool = False               # only deployments that use every GPU of deploy.total_gpus
    question: str = "both"               # fewest_gpus | best_service | both | all (every deployment, ranked)
    levers: List[str] = field(default_factory=lambda: ["router_policy", "dp", "hicache", "chunked_prefill"])  # tried around each answer ([]: none)
    lever_margin: float = 0.05           # a lever that beats an answer by more than this (relative) replaces it
    lever_hicache_ratio: float = 2.0     # the HiCache ratio the hicache lever tries
    lever_chunked_prefill_size: List[int] = field(default_factory=lambda: [16384])   # what chunked_prefill tries
    break_rate_tolerance: float = 0.05   # the answers' break rate is found to this (relative)
    executor: str = "local"              # local (forked processes) | ray_local (a private Ray) | ray (a cluster)
    ray_address: Optional[str] = None    # executor=ray: the cluster (unset: RAY_ADDRESS or a running one)


@dataclass
class DeploySearchJob:
    """Rank every deployment that fits deploy.total_gpus by SLA goodput per GPU on a trace."""

    name: str = "deploy_search"
    trace: Optional[str] = None          # Mooncake JSONL or a bundled name; unset: the bundled sample
    max_requests: Optional[int] = None
    time_scale: float = 1.0              # arrival times x this
    arrival: str = "spread"              # spread | as_is | poisson: as job=replay (docs/whatif.md)
    sla: SearchSlaSettings = field(default_factory=SearchSlaSettings)
    search: DeploySearchSpace = field(default_factory=DeploySearchSpace)
    rate_search: bool = False            # per deployment, the highest request rate that meets the SLA
    processes: int = 2                   # worker processes evaluating deployments
    top: int = 20                        # table rows printed
    format: str = "table"                # table | json
    output_dir: Optional[str] = None     # where the outputs go (unset: outputs/<date>/<time>/)


#: what job.objective may name, and which way is better (one table: config/objectives.py)
from ..config.objectives import OBJECTIVES  # noqa: E402


@dataclass
class PlanJob:
    """Print the memory plan for the selected hardware, allocating nothing."""

    name: str = "plan"
    format: str = "table"                # table | json


@dataclass
class EstimateJob:
    """One static batch on the target hardware: TTFT, TPOT, tokens/s and memory (pass-time model)."""

    name: str = "estimate"
    isl: int = 1024                      # prompt tokens per request
    osl: int = 128                       # output tokens per request
    batch_size: int = 1                  # requests that arrive together
    prefix: int = 0                      # cached prompt tokens per request
    format: str = "table"                # table | json


@dataclass(frozen=True)
class JobSpec:
    """A job: its settings class, its implementation and the allowed values of its settings."""

    config_cls: type
    entry: str           # "module:function" taking (record, job_cfg, ctx)
    choices: Dict[str, tuple] = field(default_factory=dict)  # field -> allowed values


JOB_SPECS: Dict[str, JobSpec] = {
    "resolve": JobSpec(ResolveJob, "sglang_hydra.jobs.resolve:run", {"format": ("yaml", "json", "argv"),
                                                                      "check": ("none", "engine")}),
    "setup": JobSpec(SetupJob, "sglang_hydra.jobs.allocate:run", {"format": ("table", "json")}),
    "replay": JobSpec(ReplayJob, "sglang_hydra.jobs.replay:run", {
        "format": ("table", "json"), "on_bad_line": ("fail", "skip"), "workload": ("trace", "synthetic"),
        "mode": (None, "device_only", "sim", "full", "metadata"), "objective": tuple(OBJECTIVES),
        "arrival": ("spread", "as_is", "poisson", "sequential"), "cache_semantics": ("rules", "sglang")}),
    "calibrate": JobSpec(CalibrateJob, "sglang_hydra.jobs.calibrate:run", {
        "device": ("cuda", "cpu"), "format": ("table", "json"), "via": ("auto", "kernels", "engine")}),
    "pd": JobSpec(PdJob, "sglang_hydra.jobs.pd_transfer:run_side"),
    "pd_pair": JobSpec(PdPairJob, "sglang_hydra.jobs.pd_transfer:run_pair", {"format": ("table", "json")}),
    "launch": JobSpec(LaunchJob, "sglang_hydra.jobs.launch:run"),
    "plan": JobSpec(PlanJob, "sglang_hydra.jobs.plan:run", {"format": ("table", "json")}),
    "deploy_search": JobSpec(DeploySearchJob, "sglang_hydra.jobs.deploy_search:run", {
        "format": ("table", "json"), "arrival": ("spread", "as_is", "poisson")}),
    "estimate": JobSpec(EstimateJob, "sglang_hydra.jobs.estimate:run", {"format": ("table", "json")}),
    "validate": JobSpec(ValidateJob, "sglang_hydra.jobs.validate:run", {
        "format": ("table", "json"), "pacing": ("sequential", "trace", "rate"), "workload": ("trace", "synthetic"),
        "on_bad_line": ("fail", "skip")}),
}


def register_job_schemas() -> None:
    """Tell the config layer about every job above (idempotent; runs on import)."""
    for job_name, spec in JOB_SPECS.items():
        register_job_schema(job_name, spec.config_cls, spec.choices)


register_job_schemas()
