"""``job=resolve``: print the resolved record (yaml/json in record order, or reference flags)."""
from __future__ import annotations

import json

from ..config.legacy import to_argv
from ..config.record import FIELDS
from .context import JobContext, atomic_write


def render(record, fmt: str) -> str:
    values = record.to_dict()
    if fmt == "json":
        return json.dumps(values, indent=2)
    if fmt == "argv":
        import shlex
        defaults = {n: fi.default_value() for n, fi in FIELDS.items()}
        raw = dict(record.raw_input) or values
        return " ".join(shlex.quote(a) for a in to_argv(raw, defaults))
    import yaml
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # 557 fields: the C emitter is ~10x faster
    return yaml.dump(values, Dumper=dumper, sort_keys=False, default_flow_style=None, width=120)


def run(record, job: dict, ctx: JobContext) -> dict:
    if job.get("check") == "engine":
        import sys
        from ..config.engine_check import check_with_engine
        from ..config.errors import ConfigError
        problems, notes = check_with_engine(record, job.get("python"))
        for note in notes:
            print(f"sglang-hydra: check=engine: {note}", file=sys.stderr)
        if problems:
            raise ConfigError(problems)
    text = render(record, job.get("format", "yaml"))
    print(text if text.endswith("\n") else text + "\n", end="")
    if job.get("output"):
        atomic_write(job["output"], text)
    if ctx.multirun:
        ctx.write_text("record.yaml", render(record, "yaml"))
    return {}
