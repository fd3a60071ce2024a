"""``job=setup``: print the memory plan, allocate it, and optionally round-trip pages (the module is
named for what it does; the job keeps its name, ``job=setup``)."""
from __future__ import annotations

import json

from ..config.errors import ConfigError, Problem
from .context import JobContext


def _as_config_error(exc) -> ConfigError:
    key = getattr(exc, "key", "") or ""
    flag = getattr(exc, "flag", None)
    msg = getattr(exc, "message", None) or str(exc)
    return ConfigError([Problem(key, flag, msg, "setup")])


def run(record, job: dict, ctx: JobContext) -> dict:
    from ..memory import MemorySetupError, build_memory, verify
    from .single_engine import data_parallel_problems

    problems = data_parallel_problems(record, "setup")
    if problems:
        raise ConfigError(problems)
    try:
        memory = build_memory(record, progress=job.get("progress", True), hardware=ctx.hardware)
    except MemorySetupError as exc:
        raise _as_config_error(exc) from None
    try:
        plan = memory.plan.to_dict()
        out = {"plan": plan}
        if job.get("verify"):
            rep = verify(memory, rounds=job.get("rounds", 4), progress=job.get("progress", True))
            out["verify"] = rep.to_dict()
        if job.get("format") == "json":
            print(json.dumps(out, indent=2, default=str))
        else:
            _print_table(memory.plan, out.get("verify"), rep if job.get("verify") else None)
        if ctx.multirun:
            ctx.write_text("metrics.json", json.dumps(_flat_metrics(out), default=str))
        if job.get("verify") and not out["verify"].get("ok", False):
            raise SystemExit(1)
        return _flat_metrics(out)
    finally:
        memory.close()


def _flat_metrics(out: dict) -> dict:
    plan = out["plan"]
    m = {k: v for k, v in plan.items() if isinstance(v, (int, float, str, bool)) or v is None}
    for k, v in (out.get("verify") or {}).items():
        if isinstance(v, (int, float, str, bool)):
            m[f"verify_{k}"] = v
    return m


def _print_table(plan, verify_dict, rep) -> None:
    render = getattr(plan, "render", None)
    if callable(render):
        print(render())
    else:
        from rich.console import Console
        from rich.table import Table
        t = Table(title="memory plan")
        t.add_column("item")
        t.add_column("value", justify="right")
        for k, v in plan.to_dict().items():
            if not isinstance(v, (list, dict)):
                t.add_row(k, str(v))
        Console(width=120).print(t)
        bufs = plan.to_dict().get("buffers") or []
        if bufs:
            t = Table(title="buffers")
            for c in bufs[0]:
                t.add_column(str(c))
            for b in bufs:
                t.add_row(*[str(b[c]) for c in bufs[0]])
            Console(width=120).print(t)
    if rep is not None:
        print(rep.render())
