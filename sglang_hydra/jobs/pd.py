"""``job=pd`` (one side) and ``job=pd_pair`` (both sides as separate processes)."""
from __future__ import annotations

import json
from dataclasses import asdict

from ..config.errors import ConfigError, Problem
from .context import JobContext


def run_side(record, job: dict, ctx: JobContext) -> dict:
    from ..disagg import pd

    mode = record.disaggregation_mode
    if mode == "prefill":
        res = pd.run_prefill(record, requests=job.get("requests"), pages_per_request=job.get("pages_per_request"),
                             bootstrap_port=record.disaggregation_bootstrap_port, timeout=job.get("timeout"),
                             idle_timeout=job.get("idle_timeout"))
    elif mode == "decode":
        if not job.get("prefill"):
            raise ConfigError([Problem("job.prefill", None, "the decode side needs job.prefill=HOST:PORT of the prefill "
                                       "bootstrap server", "pd")])
        res = pd.run_decode(record, prefill_addr=job["prefill"], requests=job.get("requests") or 1,
                            pages_per_request=job.get("pages_per_request", 8), timeout=job.get("timeout"))
    else:
        raise ConfigError([Problem("disagg.disaggregation_mode", "--disaggregation-mode",
                                   "job=pd needs disagg=prefill or disagg=decode", "pd")])
    out = asdict(res) if hasattr(res, "__dataclass_fields__") else dict(res)
    print(json.dumps(out, indent=2, default=str))
    return {k: v for k, v in out.items() if isinstance(v, (int, float, str, bool))}


def run_pair(record, job: dict, ctx: JobContext) -> dict:
    from ..disagg import pd

    res = pd.run_pair(record, requests=job.get("requests", 200), pages_per_request=job.get("pages_per_request", 8),
                      timeout=job.get("timeout", 120.0), verify=job.get("verify", True))
    data = asdict(res)
    metrics = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool)) or v is None}
    if job.get("format") == "json":
        print(json.dumps(data, indent=2, default=str))
    else:
        print(res.summary())
    if ctx.multirun:
        ctx.write_text("metrics.json", json.dumps(metrics))
    if res.failed:
        print(f"{res.failed} request(s) failed: {res.failures[:5]}")
    return metrics
