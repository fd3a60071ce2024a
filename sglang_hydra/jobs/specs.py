"""What each job is: its config schema (selected with ``job=<name>``) and its entry point.

Only dataclasses live here, so registering the ``job`` group never imports torch; a job's
implementation module is imported when that job runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional


@dataclass
class ResolveJob:
    """Print the resolved flat record."""

    name: str = "resolve"
    format: str = "yaml"  # yaml | json | argv
    output: Optional[str] = None  # also write it to this file (atomically)


@dataclass(frozen=True)
class JobSpec:
    config_cls: type
    entry: str           # "module:function" taking (record, job_cfg, ctx)
    choices: Dict[str, tuple] = field(default_factory=dict)  # field -> allowed values


JOB_SPECS: Dict[str, JobSpec] = {
    "resolve": JobSpec(ResolveJob, "sglang_hydra.jobs.resolve:run", {"format": ("yaml", "json", "argv")}),
}
