"""``job=plan``: the memory plan for a target machine, without allocating anything.

``sglang-hydra job=plan model=llama3_8b hardware=h100_80gb`` prints what a server with this
record would get on that machine: bytes per token and page, the weights each GPU holds,
the device pool, the host tier and the decode retraction backup, each with the reason for
its size.  Nothing is allocated and, for a hardware preset, torch is not even imported,
so a sweep over machines and settings (``-m hardware=h100_80gb,h200_141gb
memory.hicache_ratio=1,2,4``) runs in about a second per point.
"""
from __future__ import annotations

import json

from ..config.errors import ConfigError, Problem
from .context import JobContext


def _metrics(plan) -> dict:
    d = plan.to_dict()
    keep = ("target", "device_tokens", "device_pages", "device_bytes", "host_tokens", "host_pages", "host_bytes",
            "host_ratio", "bytes_per_token", "bytes_per_page", "page_size", "weights_bytes", "mem_fraction_static",
            "retraction_backup")
    return {k: d.get(k) for k in keep}


def run(record, job: dict, ctx: JobContext) -> dict:
    from ..memory.errors import MemorySetupError
    from ..memory.plan import make_plan
    from .single_engine import data_parallel_problems

    problems = data_parallel_problems(record, "plan")
    if problems:
        raise ConfigError(problems)
    try:
        plan = make_plan(record, hardware=ctx.hardware, check_io=False)
    except MemorySetupError as exc:
        raise ConfigError(exc.problems) from None
    except ValueError as exc:  # an unknown weight dtype and the like
        raise ConfigError([Problem("model", None, str(exc), "plan")]) from None
    metrics = _metrics(plan)
    if job.get("format") == "json":
        print(json.dumps(plan.to_dict(), indent=2, default=str))
    else:
        print(plan.render())
    if ctx.multirun:
        ctx.write_text("metrics.json", json.dumps(metrics, default=str))
    return metrics
