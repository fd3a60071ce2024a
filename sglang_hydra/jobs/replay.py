"""``job=replay``: a trace through the prefix cache, timed by the TTFT model.

Writes ``replay.json`` (everything, including the TTFT model's assumptions) and
``metrics.json`` (flat: per-tier hit rates, TTFT percentiles, host memory, the overrides
that define the point) into the job dir, and returns ``job.objective`` as a float: that is
the value Hydra hands to a sweeper (Optuna minimises or maximises it, see OBJECTIVES).

Modes: ``metadata`` (one device tier, decisions only), ``sim`` (device/host/storage tiers,
no bytes; the default when HiCache is on) and ``full`` (real KV bytes).
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Tuple

from ..config.errors import ConfigError, Problem
from .context import JobContext
from .sweeps import objective_direction

GiB = 1024 ** 3
GB = 1e9


_TRACE_CACHE: Dict[tuple, Any] = {}


def _cached_trace(path, on_bad_line: str):
    """Sweep points in one process (basic launcher, Optuna) parse the same trace once."""
    from pathlib import Path
    from ..workload.trace import load_trace
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


def replay_mode(record, job: dict) -> str:
    """``job.mode`` as given; unset: ``sim`` when the record enables HiCache, else ``metadata``."""
    mode = job.get("mode")
    if mode:
        return mode
    return "sim" if getattr(record, "enable_hierarchical_cache", False) else "metadata"


def make_timeline(record, hardware) -> Tuple[Any, Optional[str]]:
    """(PrefillTimeline, None), or (None, why TTFT cannot be modelled for this record/hardware)."""
    from ..workload.ttft import HardwareSpec, ModelShape, PrefillTimeline, default_chunk_tokens

    if hardware is None:
        return None, "no hardware selected; choose one, e.g. hardware=h100_80gb"
    try:
        hw = HardwareSpec.from_any(hardware)
    except ValueError as exc:
        name = getattr(hardware, "name", None) or (hardware.get("name") if isinstance(hardware, dict) else "?")
        get = (lambda f: hardware.get(f)) if isinstance(hardware, dict) else (lambda f: getattr(hardware, f, None))
        missing = [f for f in ("bf16_tflops", "prefill_efficiency", "hbm_bandwidth_gbps", "h2d_gbps") if not get(f)]
        what = f"has no {', '.join(missing)}" if missing else f"has unusable figures ({exc})"
        return None, (f"hardware '{name}' {what}; choose a preset such as hardware=h100_80gb, "
                      "or measure this GPU with job=calibrate")
    try:
        model = ModelShape.from_record(record)
    except ValueError as exc:
        return None, str(exc)
    return PrefillTimeline(hw, model, chunk_tokens=default_chunk_tokens(record, hw)), None


def _per_request_device_hits(record, reqs, hit_pages: List[int]) -> List[int]:
    ps = int(record.page_size or 1)
    return [min(k * ps, r.input_length) for r, k in zip(reqs, hit_pages)]


def time_device_hits(timeline, reqs, hit_tokens: List[int], time_scale: float = 1.0) -> None:
    """Feed a single-tier replay's per-request hits to the timeline (every hit on device)."""
    serve = timeline.serve
    scale = time_scale / 1000.0       # trace timestamps are in ms
    for r, h in zip(reqs, hit_tokens):
        serve(r.timestamp * scale, r.input_length, h, 0, 0)


def memory_plan(record, hardware):
    """The memory plan for ``record`` on ``hardware`` (nothing allocated; bad sizes are config errors)."""
    from ..memory.errors import MemorySetupError
    from ..memory.plan import make_plan

    try:
        return make_plan(record, hardware=hardware, check_io=False)
    except MemorySetupError as exc:
        raise ConfigError(exc.problems) from None
    except ValueError as exc:  # an unknown weight dtype and the like
        raise ConfigError([Problem("model", None, str(exc), "plan")]) from None


def host_memory_bytes(record, plan) -> Tuple[int, str]:
    """Host KV memory the configuration uses, from the memory plan; (bytes, how it was sized)."""
    if not getattr(record, "enable_hierarchical_cache", False):
        return 0, "HiCache off: no host KV tier"
    return int(plan.host_bytes), plan.host_budget_reason


class _SizedRecord:
    """The record with the device pool the plan sized for the target hardware."""

    def __init__(self, record, max_total_tokens: int):
        self._record = record
        self.max_total_tokens = max_total_tokens

    def __getattr__(self, name):
        return getattr(self._record, name)


def sized_for_target(record, hardware, plan):
    """A preset hardware sizes the device pool when the record does not (``max_total_tokens``)."""
    if getattr(record, "max_total_tokens", None) or hardware is None or getattr(hardware, "is_local", True):
        return record
    return _SizedRecord(record, int(plan.device_tokens))


def _trace_name(job: dict) -> str:
    if job.get("workload") == "synthetic":
        return f"synthetic ({job.get('conversations', 200)} conversations)"
    if job.get("trace"):
        from pathlib import Path
        return Path(str(job["trace"])).name
    return "bundled trace sample"


def _flat_overrides(ctx: JobContext) -> Dict[str, str]:
    out = {}
    for ov in ctx.overrides or ():
        k, _, v = str(ov).partition("=")
        out[k.lstrip("+~")] = v
    return out


def run(record, job: dict, ctx: JobContext) -> float:
    from ..workload.replay import replay

    requests = load_requests(job)
    mode = replay_mode(record, job)
    objective = job.get("objective") or "ttft_p90_ms"
    direction = objective_direction(objective)
    hardware = getattr(ctx, "hardware", None)
    plan = memory_plan(record, hardware)
    if mode != "full":      # full mode allocates real pools here, sized by the record itself
        record = sized_for_target(record, hardware, plan)
    timeline, no_ttft = make_timeline(record, hardware)
    time_scale = float(job.get("time_scale", 1.0) or 1.0)
    if time_scale <= 0:
        raise ConfigError([Problem("job.time_scale", None, f"must be > 0, got {time_scale}", "replay")])
    kwargs = dict(max_requests=job.get("max_requests"),
                  tail_threshold_tokens=job.get("tail_threshold_tokens", 4096),
                  progress=job.get("progress", True) and not ctx.multirun)
    if job.get("policy"):
        kwargs["policy"] = job["policy"]
    semantics = job.get("cache_semantics") or "rules"
    if semantics != "rules":
        if mode != "metadata":
            raise ConfigError([Problem("job.cache_semantics", None,
                                       f"{semantics} models the engine's one-tier radix cache; it needs "
                                       f"job.mode=metadata (got {mode})", "replay")])
        kwargs["cache_semantics"] = semantics
    try:
        if mode in ("sim", "full"):
            result = _tiered(record, requests, mode, timeline, kwargs, time_scale, plan, hardware)
        else:
            result = replay(record, requests, mode="metadata", keep_per_request=True, **kwargs)
            if timeline is not None:
                from ..workload.replay import select_requests
                reqs = select_requests(requests, kwargs["max_requests"], 0.0)
                time_device_hits(timeline, reqs, _per_request_device_hits(record, reqs, result.per_request_hit_pages),
                                 time_scale)
    except ConfigError:
        raise                       # already one line per problem; do not nest it under "job"
    except ValueError as exc:
        raise ConfigError([Problem("job", None, str(exc), "replay")]) from None
    data = _flat_tiers(result.to_dict())
    # TTFT comes from the timeline below (the replays' own figures are the same numbers or
    # the old linear estimate, uncached tokens x a constant)
    for k in [k for k in data if k.startswith(("ttft_ms_", "ttft_s_")) or k == "prefill_us_per_token"]:
        data.pop(k)
    data["mode"] = mode
    data["cache_semantics"] = semantics
    data["time_scale"] = time_scale
    data["model"] = getattr(record, "model_path", None)
    data["trace"] = _trace_name(job)
    data["hardware"] = getattr(hardware, "name", None) if hardware is not None else None
    if timeline is not None:
        data.update(timeline.summary())
        data["ttft_assumptions"] = timeline.assumptions()
    else:
        data["ttft_model"] = f"off: {no_ttft}"
    _tier_rates(data)
    host_bytes, host_why = host_memory_bytes(record, plan)
    data["device_tokens"] = int(getattr(record, "max_total_tokens", None) or plan.device_tokens)
    data["host_memory_bytes"] = host_bytes
    data["host_memory_gb"] = host_bytes / GB
    data["host_memory_sized_by"] = host_why
    skipped = getattr(requests, "skipped", 0)
    if skipped:
        data["skipped_lines"] = skipped
    status, reason = "ok", ""
    budget = job.get("max_host_memory_gb")
    if budget is not None and host_bytes > float(budget) * GB:
        status = "infeasible"
        reason = (f"host memory {host_bytes / GB:.3g} GB exceeds job.max_host_memory_gb={float(budget):g}")
    value = data.get(objective)
    if value is None:
        value = float("nan")
        if status == "ok":
            status, reason = "no_objective", f"{objective} is not available: {no_ttft or 'not computed in this mode'}"
    data.update(objective=objective, objective_direction=direction, objective_value=float(value),
                status=status, status_reason=reason)
    ctx.write_text("replay.json", json.dumps(data, indent=2, default=str))
    metrics = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool)) or v is None}
    metrics.update(_flat_overrides(ctx))
    ctx.write_text("metrics.json", json.dumps(metrics))
    _print(data, job, ctx)
    if status != "ok":
        if not ctx.multirun:
            if status == "infeasible":   # a single run over its budget exits 2 naming the budget
                raise ConfigError([Problem("job.max_host_memory_gb", None, reason, "constraint")])
            print(f"note: {reason}", file=sys.stderr)     # stdout may be JSON (job.format=json)
        # in a sweep the point stays in the tables, marked with its status; under Optuna the
        # NaN it returns becomes a failed trial (summary.mark_failed_trial)
    return float(value) if status == "ok" else float("nan")


def _tiered(record, requests, mode, timeline, kwargs, time_scale, plan, hardware):
    """The tiered replay (device/host/storage): ``sim`` counts pages, ``full`` moves real bytes.

    The device and host tiers have the sizes the memory plan gives for the target hardware;
    storage reads run at the hardware's ``storage_read_gbps`` (instant without one)."""
    import dataclasses
    from ..workload.tiered_replay import tiered_replay

    reqs = list(getattr(requests, "requests", requests))
    if kwargs.get("max_requests") is not None:
        reqs = reqs[:kwargs["max_requests"]]
    if time_scale != 1.0:
        reqs = [dataclasses.replace(r, timestamp=r.timestamp * time_scale) for r in reqs]
    extra = {}
    if mode == "sim":
        extra["mover"] = "count"
        if getattr(record, "enable_hierarchical_cache", False) and plan.host_pages:
            extra["host_pages"] = int(plan.host_pages)
    else:
        extra["mover"] = "bytes"
    storage = getattr(hardware, "storage_read_gbps", None) if hardware is not None else None
    return tiered_replay(record, reqs, timeline=timeline, storage_read_bytes_per_s=storage * GB if storage else None,
                         policy=kwargs.get("policy"), keep_per_request=False, progress=kwargs.get("progress", False),
                         **extra)


def _flat_tiers(d: Dict[str, Any]) -> Dict[str, Any]:
    """The tiered replay's per-tier dicts as flat keys (token_hit_rate = all tiers; device_hit_rate ...)."""
    rates = d.get("token_hit_rate")
    if isinstance(rates, dict):
        d["token_hit_rates"] = rates
        d["token_hit_rate"] = rates.get("total", sum(v for k, v in rates.items() if k != "total"))
        for tier in ("device", "host", "storage"):
            if tier in rates:
                d[f"{tier}_hit_rate"] = rates[tier]
    tokens = d.get("hit_tokens")
    if isinstance(tokens, dict):
        d["hit_tokens_by_tier"] = tokens
        d["hit_tokens"] = sum(v for k, v in tokens.items() if k != "total")
        for tier, v in tokens.items():
            d[f"{tier}_hit_tokens"] = v
    for key in ("page_hit_rate", "hit_pages", "evicted_pages", "prefetch"):
        sub = d.get(key)
        if isinstance(sub, dict):
            for k, v in sub.items():
                if isinstance(v, (int, float)):
                    d[f"{key}_{k}"] = v
            d.pop(key)
    return d


def _tier_rates(data: Dict[str, Any]) -> None:
    """Per-tier token hit rates as flat keys (device, host, storage), from whatever the replay reports."""
    total = data.get("input_tokens") or 0
    if not total:
        return
    if all(f"{tier}_hit_rate" in data for tier in ("device", "host", "storage")):
        return      # the tiered replay reported them
    # single-tier replay: every hit is on the device
    data.update(device_hit_rate=data.get("hit_tokens", 0) / total, host_hit_rate=0.0, storage_hit_rate=0.0)


def _print(data: Dict[str, Any], job: dict, ctx: JobContext) -> None:
    if job.get("format") == "json":
        print(json.dumps(data, indent=2, default=str))
        return
    if ctx.multirun:
        obj = data["objective"]
        print(f"{obj}={data['objective_value']:.6g} token_hit_rate={data.get('token_hit_rate', 0):.4f} "
              f"status={data['status']}")
        return
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"replay ({data['mode']})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [("policy", str(data.get("policy"))), ("requests", f"{data.get('requests', 0):,}"),
            ("token hit rate", f"{100 * data.get('token_hit_rate', 0):.2f} %")]
    for tier in ("device", "host", "storage"):
        if f"{tier}_hit_rate" in data:
            rows.append((f"  {tier} hits", f"{100 * data[f'{tier}_hit_rate']:.2f} %"))
    if "ttft_p90_ms" in data:
        rows += [("TTFT P50 / P90 / P99", f"{data['ttft_p50_ms']:.1f} / {data['ttft_p90_ms']:.1f} / "
                                         f"{data['ttft_p99_ms']:.1f} ms"),
                 ("engine busy", f"{100 * data['engine_busy_share']:.1f} %"),
                 ("prefill throughput", f"{data['prefill_throughput']:,.0f} tokens/s")]
    else:
        rows.append(("TTFT", data.get("ttft_model", "")))
    rows.append(("host memory", f"{data['host_memory_gb']:.3g} GB"))
    rows.append((f"objective {data['objective']}", f"{data['objective_value']:.6g} ({data['objective_direction']})"))
    if data.get("skipped_lines"):
        rows.append(("skipped bad lines", str(data["skipped_lines"])))
    for k, v in rows:
        t.add_row(k, v)
    Console(width=120).print(t)
    print(f"wrote {ctx.out_dir() / 'replay.json'}")
