"""Run a job on a record: the only place (with ``cli``) that meets Hydra's runtime."""
from __future__ import annotations

import importlib
from typing import Any

from .context import JobContext
from .specs import JOB_SPECS


def run_job(name: str, record, job: dict, ctx: JobContext) -> Any:
    spec = JOB_SPECS[name]
    module, func = spec.entry.split(":")
    return getattr(importlib.import_module(module), func)(record, job, ctx)
