"""Run a job on a record: the only place (with ``cli``) that meets Hydra's runtime."""
from __future__ import annotations

import importlib
import json
from typing import Any

from .context import JobContext
from .specs import JOB_SPECS


def run_job(name: str, record, job: dict, ctx: JobContext) -> Any:
    spec = JOB_SPECS[name]
    module, func = spec.entry.split(":")
    result = getattr(importlib.import_module(module), func)(record, job, ctx)
    if ctx.multirun and ctx.output_dir is not None and not (ctx.output_dir / "metrics.json").exists() \
            and (type(result) is not int or result == 0):
        # A sweep point's metrics.json says it finished; jobs without figures (resolve) leave
        # just that, so the sweep summary does not take them for killed points.
        ctx.write_text("metrics.json", json.dumps({"status": "ok", "job": name}))
    return result
