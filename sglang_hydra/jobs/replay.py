"""``job=replay``: a trace through the prefix cache; a table, and replay.json in the job dir."""
from __future__ import annotations

import json

from ..config.errors import ConfigError, Problem
from .context import JobContext


def load_requests(job: dict):
    from ..workload.trace import TraceError, load_trace
    if job.get("workload") == "synthetic":
        from ..workload.synthetic import generate_conversations
        return generate_conversations(seed=job.get("seed", 0), conversations=job.get("conversations", 200),
                                      turns=job.get("turns", 6))
    try:
        return load_trace(job.get("trace"), on_bad_line=job.get("on_bad_line", "fail"))
    except TraceError as exc:
        raise ConfigError([Problem("job.trace", None, str(exc), "trace")]) from None
    except FileNotFoundError as exc:
        raise ConfigError([Problem("job.trace", None, f"no such trace file: {exc.filename}", "trace")]) from None


def run(record, job: dict, ctx: JobContext) -> dict:
    from ..workload.replay import replay

    requests = load_requests(job)
    mode = job.get("mode", "metadata")
    kwargs = dict(mode=mode, max_requests=job.get("max_requests"),
                  tail_threshold_tokens=job.get("tail_threshold_tokens", 4096),
                  prefill_us_per_token=job.get("prefill_us_per_token", 50.0),
                  progress=job.get("progress", True) and not ctx.multirun)
    if job.get("policy"):
        kwargs["policy"] = job["policy"]
    try:
        if mode == "full":
            from ..workload.full_replay import full_replay
            result = full_replay(record, requests, **kwargs)
        else:
            result = replay(record, requests, **kwargs)
    except ConfigError:
        raise                      # already names its keys (memory plan, hardware)
    except ValueError as exc:
        raise ConfigError([Problem("job", None, str(exc), "replay")]) from None
    data = result.to_dict()
    skipped = getattr(requests, "skipped", 0)
    if skipped:
        data["skipped_lines"] = skipped
    ctx.write_text("replay.json", json.dumps(data, indent=2))
    if job.get("format") == "json":
        print(json.dumps(data, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table
        t = Table(title="replay")
        t.add_column("metric")
        t.add_column("value", justify="right")
        for k, v in result.summary_rows():
            t.add_row(k, v)
        if skipped:
            t.add_row("skipped bad lines", str(skipped))
        Console(width=120).print(t)
        print(f"wrote {ctx.out_dir() / 'replay.json'}")
    metrics = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool)) or v is None}
    ctx.write_text("metrics.json", json.dumps(metrics))
    return metrics
