"""``job=resolve``: print the resolved record (yaml/json in record order, or reference flags)."""
from __future__ import annotations

import json

from ..config.legacy import to_argv
from ..config.record import FIELDS
from .context import JobContext, atomic_write


def settings_of(record) -> dict:
    """The record's settings, without its internal bookkeeping fields (``_..._explicitly_set``)."""
    return {k: v for k, v in record.to_dict().items() if not k.startswith("_")}


def render(record, fmt: str) -> str:
    values = settings_of(record)
    if fmt == "json":
        return json.dumps(values, indent=2)
    if fmt == "argv":
        import shlex
        defaults = {n: fi.default_value() for n, fi in FIELDS.items()}
        raw = dict(record.raw_input) or values
        return " ".join(shlex.quote(a) for a in to_argv(raw, defaults))
    import yaml
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # 561 fields: the C emitter is ~10x faster
    return yaml.dump(values, Dumper=dumper, sort_keys=False, default_flow_style=None, width=120)


def render_deployment(dep, fmt: str) -> str:
    """A deployment: every server's record (yaml/json) or its flags, and the router's (argv)."""
    from ..config.deploy import router_argv

    if fmt == "argv":
        import shlex
        lines = [f"{s.name}: {render(s.record, 'argv')}" for s in dep.servers]
        return "\n".join(lines + [f"router: {shlex.join(router_argv(dep))}"]) + "\n"
    data = {"deploy": dep.name, **{s.name: settings_of(s.record) for s in dep.servers}}
    if dep.router is not None:
        r = dep.router
        data["router"] = {"host": r.host, "port": r.port, "prometheus_port": r.prometheus_port,
                          "policy": r.policy, "extra_args": list(r.extra_args), "url": r.url}
    if fmt == "json":
        return json.dumps(data, indent=2)
    import yaml
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120)


def engine_verdict(target, python):
    """(problems, notes) from ``job.check=engine`` for a record or for each side of a deployment.

    A deployment's sides are checked one by one; their problems are keyed ``prefill.<key>`` /
    ``decode.<key>`` and their notes start with the role.  An interpreter without SGLang is one
    problem for the whole command (the second side is not tried), and version drift is reported
    once: it concerns the engine, not a side."""
    from ..config.deploy import Deployment
    from ..config.engine_check import check_with_engine
    from ..config.errors import Problem

    if not isinstance(target, Deployment):
        return check_with_engine(target, python)
    problems, notes = [], []
    for i, server in enumerate(s for s in target.servers if not s.index):   # one server per role is enough
        side_problems, side_notes = check_with_engine(server.record, python, drift_check=(i == 0))
        if any(p.key == "job.check" for p in side_problems):       # no usable engine: nothing to say per side
            return side_problems, side_notes
        role = server.role
        problems += [Problem(f"{role}.{p.key}" if p.key else role, p.flag, p.message, p.source)
                     for p in side_problems]
        notes += [n if n.startswith("version drift") else f"{role}: {n}" for n in side_notes]
    return problems, notes


def _output_problems(output) -> list:
    """``job.output`` must name a file it can write (checked before anything is printed)."""
    from pathlib import Path
    from ..config.errors import Problem
    if not output:
        return []
    path = Path(str(output)).expanduser()
    if path.is_dir():
        return [Problem("job.output", None, f"{str(output)!r} is a directory; give a file path, e.g. "
                        f"job.output={path / 'record.yaml'}")]
    return []


def run(record, job: dict, ctx: JobContext) -> dict:
    from ..config.errors import ConfigError
    bad_output = _output_problems(job.get("output"))
    if bad_output:
        raise ConfigError(bad_output)
    if job.get("check") == "engine":
        import sys
        problems, notes = engine_verdict(record, job.get("python"))
        for note in notes:
            print(f"sglang-hydra: check=engine: {note}", file=sys.stderr)
        if problems:
            raise ConfigError(problems)
    from ..config.deploy import Deployment
    fmt = job.get("format", "yaml")
    text = render_deployment(record, fmt) if isinstance(record, Deployment) else render(record, fmt)
    print(text if text.endswith("\n") else text + "\n", end="")
    if job.get("output"):
        atomic_write(job["output"], text)
    if ctx.multirun and not isinstance(record, Deployment):
        ctx.write_text("record.yaml", render(record, "yaml"))
    return {}
