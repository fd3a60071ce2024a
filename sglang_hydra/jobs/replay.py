"""``job=replay``: a trace through the whole deployment, simulated (``docs/whatif.md``).

The record (``deploy=single``: ``deploy.workers`` servers of ``parallel.dp_size`` engines) or the
two records of ``deploy=pd`` become a :class:`~sglang_hydra.workload.deployment.DeploymentModel`;
:func:`~sglang_hydra.workload.deployment.simulate` replays the trace through it; the job writes
``metrics.json`` (one nested document, ``schema_version`` 3: groups of unit-suffixed leaves, every
leaf name unique and every quantity under one name, so ``flatten_metrics`` gives one flat row;
``docs/outputs.md`` documents each leaf) and returns ``job.objective`` (a leaf name) as a float for
Hydra's sweepers.

Requests longer than the context (``model.context_length``, else ``max_position_embeddings``) are
rejected as SGLang rejects them, or truncated with ``model.allow_auto_truncate`` (serving flag);
requests the KV pool can never hold are rejected too.  A point whose queue still grows at the end
of the trace is ``saturated``: its latencies are backlog, not latency.
"""
from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from ..config.errors import ConfigError, Problem
from ..utils.numbers import fmt_gb
from .context import JobContext
from .sweeps import objective_direction

GiB = 1024 ** 3
GB = 1e9
#: the one metrics file of a run (schema 3 dropped replay.json, which was a byte-identical copy)
METRICS_FILE = "metrics.json"

_TRACE_CACHE: Dict[tuple, Any] = {}
#: objectives that need timed passes (all but the cache and memory ones)
CACHE_OBJECTIVES = ("token_hit_rate", "host_memory_gb")
#: deploy.* keys the simulation uses
MODELLED_DEPLOY_KEYS = ("workers", "prefill_workers", "decode_workers", "router_policy", "total_gpus")
#: job.* keys that change the simulation's answer
MODELLED_JOB_KEYS = ("trace", "workload", "max_requests", "mode", "policy", "time_scale", "arrival", "seed",
                     "sla", "sla.ttft_ms", "sla.tpot_ms", "cache_semantics", "conversations", "turns")
#: the reason of a given setting the simulation does not read at all
NOT_MODELLED_WHY = "not modelled, the answer does not depend on it"
#: what no setting changes because the simulation does not model it
NOT_MODELLED_ALWAYS = [
    "speculative decoding, LoRA adapters, multimodal inputs and structured output (their settings change nothing here)",
    "priority scheduling and preemption (schedule.enable_priority_scheduling): requests are scheduled by schedule_policy only",
    "the overlap scheduler, CUDA graphs and torch.compile: each pass costs what the pass model says, no CPU time between passes",
    "tokenisation, detokenisation, HTTP and the network between client, router and servers",
    "pipeline parallelism (parallel.pp_size), expert parallelism and attention data parallelism",
    "the decode side's prefix cache in deploy=pd (off by default in SGLang, as here)",
]


def _cached_trace(path, on_bad_line: str):
    """Sweep points in one process (basic launcher, Optuna) parse the same trace once."""
    from pathlib import Path
    from ..workload.trace import load_trace, trace_path
    if path:
        path = trace_path(str(path))      # a bundled trace's name -> its file
    key = (str(path), on_bad_line)
    try:
        st = Path(path).stat() if path else None
        key += ((st.st_mtime_ns, st.st_size) if st else (None,))
    except OSError:
        return load_trace(path, on_bad_line=on_bad_line)   # its own error names the file
    if key not in _TRACE_CACHE:
        _TRACE_CACHE.clear()
        _TRACE_CACHE[key] = load_trace(path, on_bad_line=on_bad_line)
    return _TRACE_CACHE[key]


def load_requests(job: dict):
    from ..workload.trace import TraceError
    if job.get("workload") == "synthetic":
        from ..workload.synthetic import generate_conversations
        return generate_conversations(seed=job.get("seed", 0), conversations=job.get("conversations", 200),
                                      turns=job.get("turns", 6))
    try:
        return _cached_trace(job.get("trace"), job.get("on_bad_line", "fail"))
    except TraceError as exc:
        raise ConfigError([Problem("job.trace", None, str(exc), "trace")]) from None
    except FileNotFoundError as exc:
        raise ConfigError([Problem("job.trace", None, f"no such trace file: {exc.filename}", "trace")]) from None


#: former names of job.mode values -> their names now
RENAMED_MODES = {"metadata": "device_only"}


def replay_mode(record, job: dict) -> str:
    """``job.mode`` as given; unset: ``sim`` when the record enables HiCache, else ``device_only``
    (the device tier only, HiCache off).  ``metadata``, its former name, still works, with a note."""
    mode = job.get("mode")
    if mode in RENAMED_MODES:
        new = RENAMED_MODES[mode]
        print(f"sglang-hydra: note: job.mode={mode} is now job.mode={new} (the device tier only, HiCache off); "
              "the old name still works", file=sys.stderr)
        return new
    if mode:
        return mode
    return "sim" if getattr(record, "enable_hierarchical_cache", False) else "device_only"


def _trace_name(job: dict) -> str:
    if job.get("workload") == "synthetic":
        return f"synthetic ({job.get('conversations', 200)} conversations)"
    if job.get("trace"):
        from pathlib import Path
        return Path(str(job["trace"])).name
    return "bundled trace sample"


def _flat_overrides(ctx: JobContext) -> Dict[str, str]:
    """The run's overrides as ``{key: value}``, each value as written (no quotes inside)."""
    from .override_values import plain_overrides
    return plain_overrides(ctx.overrides or ())


#: why a page size below the trace's block cannot change hits, and what it still changes
PAGE_BELOW_BLOCK_WHY = ("below the trace's {block}-token block: the trace only says which {block}-token blocks "
                        "repeat, so every hit is whole blocks whatever the page size; it changes only the rounding "
                        "of the pools and of each prompt's last partial block to whole pages")


def page_size_notes(overrides: Dict[str, str], block_size: int) -> List[str]:
    """``key=value: why`` for each given page size that divides the trace's block and is smaller:
    the hits cannot differ from a page of the block's size (issue 27: a sweep over
    ``schedule.page_size=1,64`` gave identical rows without a word)."""
    out = []
    for key, value in overrides.items():
        if key.split(".")[-1].replace("-", "_").lstrip("_") != "page_size":
            continue
        try:
            ps = int(value)
        except (TypeError, ValueError):
            continue
        if 0 < ps < block_size and block_size % ps == 0:
            out.append(f"{key}={value}: {PAGE_BELOW_BLOCK_WHY.format(block=block_size)}")
    return out


# --------------------------------------------------------------------------- inputs
def check_context(requests, limit: Optional[int], truncate: bool) -> Tuple[list, Dict[str, int], int]:
    """(requests to serve, rejected reasons -> count, truncated count) under SGLang's checks:
    an input of ``limit`` tokens or more is rejected (``input_longer_than_context``), and so is
    one whose input plus ``output_length`` (its ``max_new_tokens``) exceeds ``limit``
    (``input_plus_output_over_context``); with ``allow_auto_truncate`` the input is cut to the
    limit and the output to what is left (at least one token)."""
    if not limit:
        return list(requests), {}, 0
    from ..workload.trace import BLOCK_SIZE
    keep, reasons, truncated = [], {}, 0
    for r in requests:
        if r.input_length < limit and r.input_length + r.output_length <= limit:
            keep.append(r)
            continue
        if not truncate:
            why = "input_longer_than_context" if r.input_length >= limit else "input_plus_output_over_context"
            reasons[why] = reasons.get(why, 0) + 1
            continue
        inp = min(r.input_length, limit - 1)
        out = max(1, min(r.output_length, limit - inp))
        blocks = -(-inp // BLOCK_SIZE)
        keep.append(dataclasses.replace(r, input_length=inp, output_length=out, hash_ids=tuple(r.hash_ids[:blocks])))
        truncated += 1
    return keep, reasons, truncated


def _deploy_settings(target, ctx: JobContext) -> Dict[str, Any]:
    """Deployment-level keys: from the context (the CLI's deployment path), the target, or defaults."""
    src = getattr(ctx, "deploy", None) or getattr(target, "settings", None)
    out = {"workers": 1, "prefill_workers": 1, "decode_workers": 1, "router_policy": None, "total_gpus": None}
    if src is not None:
        for k in out:
            v = src.get(k) if isinstance(src, dict) else getattr(src, k, None)
            if v is not None:
                out[k] = v
    return out


def _records(target) -> Tuple[Optional[Any], Optional[Any], Optional[Any]]:
    """(record, prefill, decode): a single record, or the two sides of a PD deployment."""
    servers = getattr(target, "servers", None)
    if servers is None:
        return target, None, None
    roles = {s.role: s.record for s in servers}
    if "prefill" in roles and "decode" in roles:
        return None, roles["prefill"], roles["decode"]
    return next(iter(roles.values())), None, None


def _objective(job: dict, ctx: JobContext, disagg: bool) -> Tuple[str, str]:
    objective = job.get("objective") or "ttft_p90_ms"
    try:
        direction = objective_direction(objective)
    except ValueError as exc:
        raise ConfigError([Problem("job.objective", None, str(exc), "replay")]) from None
    if objective == "transfer_p90_ms" and not disagg:
        raise ConfigError([Problem("job.objective", None, "transfer_p90_ms is only produced by deploy=pd "
                                   "(an aggregated deployment moves no KV between servers)", "replay")])
    return objective, direction


def _time_scale(job: dict) -> float:
    raw = job.get("time_scale", 1.0)
    try:
        scale = float(1.0 if raw is None else raw)
    except (TypeError, ValueError):
        raise ConfigError([Problem("job.time_scale", None, f"must be a number > 0, got {raw!r}", "replay")]) from None
    if not scale > 0:
        raise ConfigError([Problem("job.time_scale", None, f"must be > 0 (2 = the trace at half its request rate), "
                                   f"got {raw!r}", "replay")])
    return scale


#: hardware fields only a disaggregated deployment reads (the KV transfer's NIC, PD pass scales)
DISAGG_ONLY_HARDWARE = ("nic_gbps", "disagg_prefill_pass_scale", "disagg_decode_pass_scale")


def not_modelled(overrides: Dict[str, str], job: dict, disagg: bool = False) -> List[str]:
    """The given settings the simulation does not read, each as ``key=value: not modelled``."""
    from ..workload.assemble import MODELLED_FIELDS
    out = []
    for key, value in overrides.items():
        parts = key.split(".")
        if parts[0] in ("prefill", "decode") and len(parts) > 1:
            parts = parts[1:]
        head = parts[0]
        if head.startswith("hydra") or head in ("model", "hardware", "memory", "schedule", "parallel", "disagg",
                                                "serving", "device", "spec", "exec", "mm") and len(parts) == 1:
            continue          # a preset selection (its fields are checked one by one below when given)
        if head == "job":
            if len(parts) > 1 and ".".join(parts[1:]) not in MODELLED_JOB_KEYS + (
                    "objective", "format", "progress", "on_bad_line", "max_host_memory_gb", "tail_threshold_tokens",
                    "name", "per_request"):
                out.append(f"{key}={value}")
            continue
        if head == "deploy":
            if len(parts) > 1 and parts[1] not in MODELLED_DEPLOY_KEYS:
                out.append(f"{key}={value}")
            continue
        if head == "hardware":
            # the pass model and the sizing read every figure; an aggregated deployment moves no KV
            if len(parts) > 1 and (parts[1] == "source" or (not disagg and parts[1] in DISAGG_ONLY_HARDWARE)):
                out.append(f"{key}={value}")
            continue
        field = parts[-1].replace("-", "_").lstrip("-")
        if field not in MODELLED_FIELDS:
            out.append(f"{key}={value}")
    return out


# --------------------------------------------------------------------------- the job
def run(target, job: dict, ctx: JobContext) -> float:
    """The job: :func:`evaluate`, then ``metrics.json`` (and ``requests.jsonl`` with
    ``job.per_request``), the terminal, the exit."""
    doc, rows = evaluate_requests(target, job, ctx)
    if job.get("per_request"):
        from ..workload.request_record import write_jsonl
        ctx.write_text("requests.jsonl", write_jsonl(rows))
    ctx.write_text(METRICS_FILE, json.dumps(doc, indent=2, default=str))
    _print(doc, job, ctx)
    status, reason = doc["status"], doc["status_reason"]
    value = objective_value(doc)
    if status == "infeasible" and not ctx.multirun:
        raise ConfigError([Problem("job.max_host_memory_gb", None, reason, "constraint")])
    if status != "ok" and not ctx.multirun and job.get("format") != "json":
        print(f"note: {reason}", file=sys.stderr)
    return float(value) if status in ("ok", "rejected") and value == value else float("nan")


def evaluate(target, job: dict, ctx: JobContext) -> Dict[str, Any]:
    """The metrics document of one deployment point (:func:`evaluate_requests` without the
    per-request records)."""
    return evaluate_requests(target, job, ctx)[0]


def evaluate_requests(target, job: dict, ctx: JobContext) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """The metrics document (``schema_version``: :data:`~sglang_hydra.workload.metrics.SCHEMA_VERSION`) of one deployment point, nothing written or printed.

    ``target``: a resolved record (``deploy=single``) or anything with ``servers`` holding a
    ``prefill`` and a ``decode`` server (``deploy=pd``); ``job``: the replay job's settings
    (``ReplayJob`` fields as a dict); ``ctx``: ``hardware`` (the target GPU), ``deploy`` (the
    ``deploy.*`` settings: ``workers``, ``prefill_workers``, ``decode_workers``, ``router_policy``)
    and ``overrides`` (listed under ``settings``; unmodelled ones under ``not_modelled``).
    Bad input raises :class:`~sglang_hydra.config.errors.ConfigError`."""
    from ..perf.pass_time import PassModelError
    from ..workload.assemble import DeploymentInputs, build_deployment, context_limit
    from ..workload.deployment import simulate
    from ..workload.metrics import SCHEMA_VERSION, summarize_simulation

    record, prefill, decode = _records(target)
    disagg = prefill is not None
    objective, direction = _objective(job, ctx, disagg)
    time_scale = _time_scale(job)
    arrival = job.get("arrival") or "spread"
    hardware = getattr(ctx, "hardware", None)
    front = prefill if disagg else record
    mode = replay_mode(front, job)
    if disagg and mode == "full":
        raise ConfigError([Problem("job.mode", None, "full runs one aggregated engine with real pools; "
                                   "use job.mode=sim for deploy=pd", "replay")])
    settings = _deploy_settings(target, ctx)
    sla = job.get("sla") or {}
    get = sla.get if hasattr(sla, "get") else (lambda k, d=None: getattr(sla, k, d))
    sla_ttft = float(get("ttft_ms", 2000.0) or 0.0)
    sla_tpot = float(get("tpot_ms", 50.0) or 0.0)
    problems = []
    if not sla_ttft > 0:
        problems.append(Problem("job.sla.ttft_ms", None, f"must be > 0 ms, got {sla_ttft:g}", "replay"))
    if not sla_tpot > 0:
        problems.append(Problem("job.sla.tpot_ms", None, f"must be > 0 ms, got {sla_tpot:g}", "replay"))
    semantics = job.get("cache_semantics") or "rules"
    if semantics != "rules" and any(getattr(r, "enable_hierarchical_cache", False)
                                    for r in (record, prefill, decode) if r is not None):
        problems.append(Problem("job.cache_semantics", None,
                                f"{semantics} models the engine's one-tier radix cache; it cannot run with "
                                "memory.enable_hierarchical_cache (HiCache); use job.cache_semantics=rules there",
                                "replay"))
    if hardware is None:
        problems.append(Problem("hardware", None, "job=replay times every pass on a target GPU; choose one, "
                                "e.g. hardware=h100_80gb", "replay"))
    requests = None
    try:
        requests = load_requests(job)
    except ConfigError as err:          # reported with the other problems, all at once
        problems.extend(err.problems)
    if problems:
        raise ConfigError(problems)
    reqs = list(getattr(requests, "requests", requests))
    if job.get("max_requests") is not None:
        if int(job["max_requests"]) < 0:
            raise ConfigError([Problem("job.max_requests", None, f"must be >= 0, got {job['max_requests']}", "replay")])
        reqs = reqs[:int(job["max_requests"])]
    inputs = DeploymentInputs(hardware=hardware, record=record, prefill=prefill, decode=decode,
                              workers=int(settings["workers"]), prefill_workers=int(settings["prefill_workers"]),
                              decode_workers=int(settings["decode_workers"]), router_policy=settings["router_policy"],
                              cache_mode=mode, cache_semantics=job.get("cache_semantics") or "rules",
                              policy=job.get("policy"))
    from ..memory.errors import MemorySetupError
    try:
        built = build_deployment(inputs)
    except MemorySetupError as exc:
        raise ConfigError(exc.problems) from None
    except PassModelError as exc:
        import re
        parts = re.split(r"; (?=(?:hardware|model|parallel|schedule)\.)", str(exc))
        raise ConfigError([_problem_from(part) for part in parts if part]) from None
    except ValueError as exc:
        raise ConfigError([_problem_from(str(exc))]) from None
    try:
        model = built.model
        # requests the server refuses: longer than the context, or than the KV pool can ever hold
        limit = context_limit(front)
        served, reasons, truncated = check_context(reqs, limit, bool(getattr(front, "allow_auto_truncate", False)))
        pools = [g.spec.pool_tokens for g in model.groups.values()]
        smallest = min(pools)
        fits = [r for r in served if r.input_length + 1 <= smallest]
        if len(fits) < len(served):
            reasons["longer_than_kv_pool"] = len(served) - len(fits)
        served = fits
        if not served:
            raise ConfigError([Problem("job.trace", None, f"no request of the trace can be served: "
                                       f"{_reasons_text(reasons)} (context {limit}, KV pool {smallest:,} tokens)",
                                       "replay")])
        try:
            result = simulate(model, served, arrival=arrival, time_scale=time_scale, seed=int(job.get("seed", 0) or 0),
                              progress=job.get("progress", True) and not ctx.multirun)
        except ValueError as exc:
            raise ConfigError([_problem_from(str(exc))]) from None
        groups = summarize_simulation(result, sla_ttft_ms=sla_ttft, sla_tpot_ms=sla_tpot)
        full = _full_mode_group(built) if mode == "full" else None
    finally:
        built.close()
    rejected = sum(reasons.values())
    groups["requests"].update(requests_total=len(reqs), rejected_requests=rejected, truncated_requests=truncated,
                              rejected_reasons=dict(sorted(reasons.items())))
    doc = _document(record=front, target_disagg=disagg, built=built, groups=groups, job=job, ctx=ctx, mode=mode,
                    arrival=arrival, time_scale=time_scale, hardware=hardware, settings=settings, result=result,
                    skipped=getattr(requests, "skipped", 0), limit=limit)
    if full is not None:
        doc["full_mode"] = full
    status, reason = _status(doc, job)
    doc["status"], doc["status_reason"] = status, reason
    # the objective's value is its own leaf (``ttft_p90_ms``): named here, not copied
    doc["objective"] = {"objective": objective, "objective_direction": direction}
    from ..workload.metrics import flatten_metrics
    flatten_metrics(doc)        # the leaf names stay unique (raises otherwise: a bug, not an input)
    from ..workload.request_record import predicted_requests
    return _ordered(doc, SCHEMA_VERSION), predicted_requests(result)


def _problem_from(message: str) -> Problem:
    """A ValueError of the simulation's layers as a problem naming its key when it starts with one
    (``hardware.nic_gbps is not set ...`` -> key ``hardware.nic_gbps``, message the rest)."""
    head = message.split("=", 1)[0].split(" ", 1)[0]
    if "." in head and head.split(".", 1)[0].isidentifier():
        rest = message[len(head):].lstrip()
        return Problem(head, None, rest if rest and not rest.startswith("=") else message, "replay")
    return Problem("replay", None, message, "replay")


def _reasons_text(reasons: Dict[str, int]) -> str:
    return ", ".join(f"{n:,} {why.replace('_', ' ')}" for why, n in sorted(reasons.items())) or "none"


def flat_value(doc: dict, name: str):
    from ..workload.metrics import flatten_metrics
    v = flatten_metrics({k: v for k, v in doc.items() if k != "objective"}).get(name)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def objective_value(doc: dict) -> float:
    """The value of the document's objective (the leaf ``objective`` names); NaN without one."""
    v = flat_value(doc, doc["objective"]["objective"])
    return float(v) if v is not None else float("nan")


def _ordered(doc: dict, version: int) -> dict:
    head = ("schema_version", "status", "status_reason", "objective", "settings", "deployment", "requests",
            "latency", "throughput", "load", "cache", "memory", "simulation", "full_mode", "not_modelled",
            "assumptions")
    out = {"schema_version": version}
    for k in head[1:]:
        if k in doc:
            out[k] = doc[k]
    for k, v in doc.items():
        if k not in out:
            out[k] = v
    return out


def _status(doc: dict, job: dict) -> Tuple[str, str]:
    from ..workload.metrics import backlog_grows
    load = doc["load"]
    req = doc["requests"]
    budget = job.get("max_host_memory_gb")
    host = doc["memory"]["host_memory_gb"]
    if budget is not None and host > float(budget):
        return "infeasible", f"host memory {fmt_gb(host)} exceeds job.max_host_memory_gb={float(budget):g}"
    early, late = load["ttft_mean_first_quarter_ms"], load["ttft_mean_last_quarter_ms"]
    span = doc["simulation"]["arrival_span_s"]
    drain = load["drain_after_last_arrival_s"]
    if backlog_grows(load, span):
        return "saturated", (f"saturated: the deployment cannot keep up with the trace (mean TTFT {late / 1000:,.1f} s in "
                             f"the last quarter of the trace against {early / 1000:,.1f} s in the first; "
                             f"{drain:,.0f} s to drain after the last arrival); latencies are backlog. Add servers "
                             "or GPUs, or slow the trace (job.time_scale=2)")
    if req["rejected_requests"]:
        return "rejected", (f"{req['rejected_requests']:,} of {req['requests_total']:,} requests rejected "
                            f"({_reasons_text(req['rejected_reasons'])}); the figures cover the others")
    return "ok", ""


def _full_mode_group(built) -> dict:
    """Real bytes moved (job.mode=full), per direction, and the page check."""
    out: Dict[str, Any] = {}
    for mover in built.byte_movers:
        for d in ("d2h", "h2d", "storage_write", "storage_read"):
            out[f"{d}_bytes"] = out.get(f"{d}_bytes", 0) + mover.meter.bytes(d)
            out[f"{d}_transfer_s"] = out.get(f"{d}_transfer_s", 0.0) + mover.meter.seconds(d)
        out["verified_pages"] = out.get("verified_pages", 0) + mover.stats["verified_pages"]
        out["verify_mismatch_pages"] = out.get("verify_mismatch_pages", 0) + mover.stats["verify_mismatch_pages"]
    return out


def _document(*, record, target_disagg, built, groups, job, ctx, mode, arrival, time_scale, hardware, settings,
              result, skipped, limit) -> dict:
    from ..workload.assemble import MODELLED_FIELDS  # noqa: F401  (documents where the list lives)
    model = built.model
    sides = built.sides
    # one aggregated server has no router in front of it: no policy to name, nothing routed
    routed = model.mode != "agg" or sides["agg"]["servers"] > 1
    dep: Dict[str, Any] = {
        "deploy_mode": model.mode, "gpus": model.gpus, "router_policy": model.router_policy if routed else None,
        "model_path": getattr(record, "model_path", None),
        "hardware_name": getattr(hardware, "name", None), "trace_name": _trace_name(job),
        "cache_mode": mode, "arrival": arrival, "time_scale": time_scale, "seed": int(job.get("seed", 0) or 0),
        "context_length_tokens": limit,
    }
    mem: Dict[str, Any] = {}
    host_bytes = 0
    host_why = []
    for role, info in sides.items():
        pre = "" if role == "agg" else f"{role}_"
        dep.update({f"{pre}servers": info["servers"], f"{pre}dp_size": info["dp_size"], f"{pre}tp_size": info["tp_size"],
                    f"{pre}load_balance_method": info["load_balance_method"],
                    f"{pre}max_running_requests": info["max_running_requests"],
                    f"{pre}chunked_prefill_tokens": info["chunk_tokens"],
                    f"{pre}max_prefill_tokens": info["max_prefill_tokens"],
                    f"{pre}schedule_policy": info["schedule_policy"], f"{pre}mixed_chunk": info["mixed_chunk"],
                    f"{pre}engines": info["servers"] * info["dp_size"]})
        c = info["cache"]
        dep.update({f"{pre}page_size": c.get("page_size"), f"{pre}eviction_policy": c.get("eviction_policy"),
                    f"{pre}prefix_cache": bool(c)})
        engines = info["servers"] * info["dp_size"]
        mem.update({f"{pre}kv_pool_tokens_per_engine": info["kv_pool_tokens"],
                    f"{pre}device_capacity_tokens": info["kv_pool_tokens"] * engines,
                    f"{pre}host_capacity_tokens": info["host_kv_tokens"] * engines,
                    f"{pre}weights_gb_per_gpu": info["weights_gb_per_gpu"]})
        host_bytes += info["host_kv_bytes_per_engine"] * engines
        if info["host_kv_tokens"]:
            cap = info["host_tokens_node_share_cap"]
            capped = cap is not None and info["host_kv_tokens"] >= (cap // max(1, c.get("page_size", 1))) * c.get("page_size", 1) \
                and info["plan_host_pages"] * c.get("page_size", 1) > info["host_kv_tokens"]
            host_why.append(f"{role}: {info['host_kv_tokens']:,} tokens per engine"
                            + (" (capped at its GPUs' share of the node's host memory)" if capped else
                               " (the memory plan's host tier)"))
    if target_disagg:
        dep["transfer_backend"] = model.transfer_backend
        media = sorted({lk.medium for lk in result.links.values()})
        dep["transfer_link"] = "+".join(media) if media else None
    mem.update({"host_memory_gb": host_bytes / GB,
                "host_memory_gb_per_gpu": host_bytes / GB / model.gpus if model.gpus else 0.0,
                "host_memory_sized_by": "; ".join(host_why) or "HiCache off: no host KV tier"})
    reqs = result.requests
    first = min((s.arrival_s for s in reqs), default=0.0)
    last = max((s.arrival_s for s in reqs), default=0.0)
    simulation = {"wall_time_s": result.wall_time_s, "events": result.events, "arrival_span_s": last - first,
                  "cache_semantics": job.get("cache_semantics") or "rules"}
    if skipped:
        simulation["skipped_lines"] = skipped
    if routed and "front" in result.routers and model.router_policy == "cache_aware":
        rt = result.routers["front"]
        groups["load"].update(router_cache_routed=rt.cache_routed, router_balance_routed=rt.balance_routed)
    overrides = _flat_overrides(ctx)
    ignored = not_modelled(overrides, job, disagg=model.mode == "disagg")
    doc = {"settings": {f"override {k}": v for k, v in overrides.items()}, "deployment": dep}
    doc.update(groups)
    doc["memory"] = mem
    doc["simulation"] = simulation
    doc["not_modelled"] = ([f"{x}: {NOT_MODELLED_WHY}" for x in ignored]
                           + page_size_notes(overrides, int(getattr(model, "block_size", 0) or 512))
                           + NOT_MODELLED_ALWAYS)
    doc["assumptions"] = assumptions()
    return doc


def assumptions() -> List[str]:
    """Every simplification of the simulation, each with when it is wrong (docs/whatif.md)."""
    return [
        "Pass times come from the pass model (perf/pass_time.py) on the hardware preset; wrong by that model's error.",
        "A pass's end is when its tokens exist; the scheduler's CPU time, the overlap scheduler and CUDA graphs are not "
        "modelled: optimistic for small decode batches.",
        "Admission reserves min(output, 4096) x 0.7 tokens per running request (SGLang's initial new-token ratio, held "
        "constant; SGLang lowers it as decode goes well and raises it after a retraction).",
        "Each running request holds its whole prompt in the pool even when its prefix is shared with another running "
        "request; the prefix cache's device tier has the whole pool. Pessimistic for admission, optimistic for hits "
        "under heavy load.",
        "The prompt enters the prefix cache when the request is admitted (SGLang inserts it as its chunks complete).",
        "Without chunked prefill a request admitted while the pass's token budget lasts runs whole.",
        "Data-parallel load-balance methods read exact load at dispatch (SGLang reads periodic snapshots); the router "
        "counts requests in flight, and its cache-aware tree holds the trace's 512-token prefix blocks, not text.",
        "KV transfers (deploy=pd) run on one FIFO link per prefill engine at the backend's measured share of the "
        "NIC or NVLink (docs/benchmarks.md); decode allocates the KV before the transfer starts.",
        "Host and storage loads of a cached prefix delay the pass that admits the request, overlapped layer by layer "
        "with its compute.",
        "Requests arrive at their trace times (spread within the trace's ticks unless job.arrival says otherwise); "
        "each asks for exactly its output_length tokens (ignore_eos) and nothing is sampled.",
    ]


def _fmt_ms(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v / 1000:,.2f} s" if v >= 10_000 else f"{v:,.1f} ms"


def _print(doc: Dict[str, Any], job: dict, ctx: JobContext) -> None:
    if job.get("format") == "json":
        print(json.dumps(doc, indent=2, default=str))
        return
    lat, thr, req, cache = doc["latency"], doc["throughput"], doc["requests"], doc["cache"]
    obj = doc["objective"]
    if ctx.multirun:
        rej = f" rejected={req['rejected_requests']}" if req["rejected_requests"] else ""
        shown = {"ttft_p90_ms": f"{lat['ttft_p90_ms']:.1f}", "tpot_p90_ms": f"{lat['tpot_p90_ms']:.2f}",
                 "tokens_per_s_per_gpu": f"{thr['tokens_per_s_per_gpu']:.1f}",
                 "token_hit_rate": f"{cache['token_hit_rate']:.4f}"}
        shown.pop(obj["objective"], None)
        print(f"{obj['objective']}={objective_value(doc):.6g} " + " ".join(f"{k}={v}" for k, v in shown.items())
              + f" status={doc['status']}{rej}")
        for line in _warnings(doc):
            print(f"warning: {line}", file=sys.stderr)
        if doc["status"] in ("saturated", "rejected"):
            print(f"warning: {doc['status_reason']}", file=sys.stderr)
        return
    from rich.console import Console
    from rich.table import Table
    dep = doc["deployment"]
    if dep["deploy_mode"] == "agg":
        shape = f"{dep['servers']} server(s) x dp {dep['dp_size']} x tp {dep['tp_size']}"
    else:
        shape = (f"{dep['prefill_servers']}P (dp {dep['prefill_dp_size']} x tp {dep['prefill_tp_size']}) + "
                 f"{dep['decode_servers']}D (dp {dep['decode_dp_size']} x tp {dep['decode_tp_size']}), "
                 f"{dep['transfer_backend']} over {dep.get('transfer_link') or '-'}")
    t = Table(title=f"replay: {dep['model_path']} on {dep['hardware_name']}, {dep['trace_name']}")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("deployment", f"{dep['deploy_mode']}: {shape} = {dep['gpus']} GPU(s), "
                       + (f"router {dep['router_policy']}" if dep["router_policy"] else "no router (one server)")),
        ("requests served / rejected", f"{req['requests_completed']:,} / {req['rejected_requests']:,}"),
        ("TTFT P50 / P90 / P99", f"{_fmt_ms(lat['ttft_p50_ms'])} / {_fmt_ms(lat['ttft_p90_ms'])} / "
                                 f"{_fmt_ms(lat['ttft_p99_ms'])}"),
        ("TTFT P90 alone on an idle engine", _fmt_ms(lat["ttft_unloaded_p90_ms"])),
        ("TPOT P50 / P90", f"{lat['tpot_p50_ms']:.2f} / {lat['tpot_p90_ms']:.2f} ms"),
        ("ITL P90 / E2E P90", f"{_fmt_ms(lat['itl_p90_ms'])} / {_fmt_ms(lat['e2e_p90_ms'])}"),
        ("tokens/s per GPU / per user", f"{thr['tokens_per_s_per_gpu']:,.1f} / {thr['tokens_per_s_per_user']:,.1f}"),
        (f"SLA goodput (TTFT <= {thr['sla_ttft_ms']:g} ms, TPOT <= {thr['sla_tpot_ms']:g} ms)",
         f"{thr['goodput_rps_per_gpu']:.4f} req/s per GPU ({100 * thr['sla_met_share']:.1f} % of requests)"),
        ("token hit rate (device / host / storage)",
         f"{100 * cache['token_hit_rate']:.2f} % ({100 * cache['device_hit_rate']:.1f} / "
         f"{100 * cache['host_hit_rate']:.1f} / {100 * cache['storage_hit_rate']:.1f})"),
        ("engine busy", f"{100 * doc['load']['engine_busy_share']:.1f} %"),
        ("host KV memory", fmt_gb(doc["memory"]["host_memory_gb"])),
        (f"objective {obj['objective']}", f"{objective_value(doc):.6g} ({obj['objective_direction']})"),
        ("status", doc["status"]),
    ]
    for k, v in rows:
        t.add_row(k, v)
    Console(width=140).print(t)
    for line in _warnings(doc):
        print(f"warning: {line}", file=sys.stderr)
    print(f"wrote {ctx.out_dir() / METRICS_FILE}")


def _warnings(doc: dict) -> List[str]:
    """The given settings the answer does not depend on.  A page size below the trace's block is
    listed in ``not_modelled`` but not warned about here: its pool rounding can still change the
    figures, so only a sweep whose rows come out identical says so (the sweep summary)."""
    return [x for x in doc["not_modelled"] if x.endswith(NOT_MODELLED_WHY)]
