"""``--help``: every field with its Hydra key, legacy flag, default and purpose."""
from __future__ import annotations

import io
import re
import textwrap
from typing import Any, Dict, List

from .coerce import allowed_choices
from .showcase import showcase_help_lines
from .fields import NAMESPACES
from .record import fields_of_namespace
from .spec import flags_of, has_flag


def field_help_lines() -> List[str]:
    lines: List[str] = []
    for ns, cls in NAMESPACES.items():
        import sys
        mdoc = sys.modules[cls.__module__].__doc__ or ""
        doc = mdoc.strip().splitlines()[0] if mdoc.strip() else ""
        lines.append(f"== {ns} == {doc}")
        for fi in fields_of_namespace(ns):
            if fi.arg.no_cli:
                continue
            flags = "  [" + ", ".join(flags_of(fi.name, fi.arg)) + "]" if has_flag(fi.arg) else ""
            default = fi.default_value()
            lines.append(f"  {fi.key}={default!r}{flags}")
            text = fi.arg.help
            opts = allowed_choices(fi)
            if opts:
                text += f" Choices: {', '.join(map(str, opts))}."
            if not text:
                continue  # a reference field without a rule here: `sglang serve --help` explains it
            lines += textwrap.wrap(text, width=96, initial_indent="      ", subsequent_indent="      ")
        lines.append("")
    return lines


# One line per job setting; a setting missing here is still listed, with its default.
JOB_FIELD_HELP = {
    "format": "How the result is printed.",
    "output": "Also write the rendered record to this file (atomically).",
    "verify": "Round-trip random pages device->host->device and check them.",
    "rounds": "How many verify round trips.",
    "progress": "Show progress bars (off in sweeps).",
    "trace": "Mooncake JSONL trace: a file path, or a bundled trace by name (conversation: the full "
             "12,031-request trace; sample: its first 1,000 requests). Unset: the sample.",
    "workload": "Replay a trace file, or generate synthetic multi-turn conversations.",
    "max_requests": "Replay only the first N requests.",
    "mode": "device_only: the device tier only, HiCache off (formerly 'metadata'); sim: every tier, no bytes; "
            "full: move real KV bytes through the tiers.",
    "policy": "Replay-only eviction policy (e.g. belady, fifo) instead of the record's.",
    "tail_threshold_tokens": "Requests with more uncached tokens than this count as the tail.",
    "on_bad_line": "A malformed trace line stops the replay (fail) or is skipped and counted (skip).",
    "seed": "Seed of the synthetic workload.",
    "conversations": "Synthetic workload: number of conversations.",
    "turns": "Synthetic workload: turns per conversation.",
    "prefill": "Decode side: host:port of the prefill side's bootstrap server.",
    "requests": "How many requests to transfer (prefill side: unset serves until idle).",
    "pages_per_request": "KV pages moved per request.",
    "timeout": "Seconds before the whole exchange is given up.",
    "idle_timeout": "Prefill side: stop after this many idle seconds.",
    "objective": "The metric a sweep optimises: Optuna minimises or maximises it, and the sweep summary "
                 "picks best_config.yaml by it (never a saturated point while an unsaturated one exists). "
                 "Latency and throughput objectives need a hardware preset with timing figures.",
    "repeats": "How many times each measurement is repeated (the median is kept).",
    "server_module": "The Python module that starts one server (run as python -m MODULE).",
    "router_module": "The Python module that starts the router in front of several servers.",
    "pd_pair.requests": "How many requests to transfer.",
    "pd_pair.verify": "Check that every transferred page arrived intact.",
    # job=deploy_search
    "deploy_search.time_scale": "Arrival times x this (0.5: the trace at twice its request rate).",
    "deploy_search.arrival": "spread: each request at a seeded random time within its trace tick (the default); "
                             "as_is: the stored timestamps (a steady synthetic trace); poisson: exponential gaps.",
    "sla.ttft_ms": "Time-to-first-token bound in ms.",
    "sla.tpot_ms": "Time-per-output-token bound in ms (after the first token).",
    "deploy_search.sla.ttft_ms": "Time-to-first-token bound in ms (required).",
    "deploy_search.sla.tpot_ms": "Time-per-output-token bound in ms (required).",
    "sla.percentile": "The bounds hold for this percentile of the requests (nearest rank): 50, 90 or 99.",
    "search.modes": "agg: replicas behind the router; disagg: prefill and decode pools (xPyD).",
    "search.tp": "Tensor-parallel sizes tried for each server (each side of disagg on its own).",
    "search.hicache_ratio": "HiCache host-tier sizes tried (x the device pool; 0: no host tier).",
    "search.policies": "Radix-cache eviction policies tried (memory.radix_eviction_policy).",
    "search.router_policies": "sglang-router policies tried when a pool has several servers.",
    "search.chunked_prefill_size": "Prefill chunk sizes tried for aggregated servers (null: the record's "
                                   "schedule.chunked_prefill_size); with schedule.enable_mixed_chunk=true a smaller "
                                   "chunk trades TTFT for TPOT.",
    "search.all_gpus": "Only deployments that use every GPU of deploy.total_gpus (as aiconfigurator's cli "
                       "default does); otherwise smaller ones compete per GPU too.",
    "rate_search": "Per deployment, find the highest request rate (scaling the trace's arrival times) that "
                   "still meets the SLA and rank by output tokens/s per GPU there.",
    "processes": "Worker processes that evaluate deployments (results do not depend on it).",
    "top": "How many deployments the table prints (summary.csv has them all).",
    "deploy_search.output_dir": "Write summary.csv, pareto.png, best_deploy.yaml and deploy_search.json here "
                                "(a directory that holds no earlier search); unset: outputs/<date>/<time>/.",
}


def field_comments(cls: type) -> Dict[str, str]:
    """Each field's comment in ``cls``'s source: the ``# ...`` at the end of its line (or of
    the last line of a multi-line default), else the comment lines just above it.  This is
    how job settings are documented where they are declared, so a new setting has its help
    the moment it is written."""
    import ast
    import inspect
    import tokenize

    try:
        src = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments: Dict[int, str] = {}
    own_line: Dict[int, bool] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
                own_line[tok.start[0]] = not tok.line[:tok.start[1]].strip()
        tree = ast.parse(src)
    except (SyntaxError, tokenize.TokenError):
        return {}
    out: Dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        end = getattr(node, "end_lineno", node.lineno)
        text = next((comments[ln] for ln in range(node.lineno, end + 1) if ln in comments and not own_line[ln]), "")
        if not text:
            above, ln = [], node.lineno - 1
            while ln in comments and own_line[ln]:
                above.insert(0, comments[ln])
                ln -= 1
            text = " ".join(above)
        if text:
            out[node.target.id] = text
    return out


def _default_of(f) -> Any:
    import dataclasses
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def job_field_lines(job: str, cls: type, choices, prefix: str = "") -> List[str]:
    """``job.<key>=default`` and its description for every field of ``cls``; a field that is
    itself a dataclass (``job.sla``) lists its own fields as ``job.sla.<key>``."""
    import dataclasses

    lines: List[str] = []
    comments = field_comments(cls)
    for f in dataclasses.fields(cls):
        if f.name == "name" and not prefix:
            continue
        key = f"{prefix}{f.name}"
        default = _default_of(f)
        if dataclasses.is_dataclass(default):
            head = comments.get(f.name) or (type(default).__doc__ or "").strip().split("\n")[0]
            lines.append(f"  job.{key}.*: {head}".rstrip(": "))
            lines += job_field_lines(job, type(default), {}, prefix=f"{key}.")
            continue
        comment = comments.get(f.name, "")
        if re.fullmatch(r"[\w.-]+( \| [\w.-]+)+\.?", comment) and JOB_FIELD_HELP.get(key):
            comment = ""      # a bare list of values: the shared sentence says more
        text = (JOB_FIELD_HELP.get(f"{job}.{key}") or f.metadata.get("help") or comment
                or JOB_FIELD_HELP.get(key) or "").strip()
        first = re.split(r"[\s|(]", text, maxsplit=1)[0] if text else ""
        if text and first not in map(str, choices.get(key, ())):
            text = text[0].upper() + text[1:]
        if text and not text.endswith("."):
            text += "."
        if key in choices:
            text += f" Choices: {', '.join(map(str, choices[key]))}."
        lines.append(f"  job.{key}={default!r}")
        if text.strip():
            lines += textwrap.wrap(text.strip(), width=96, initial_indent="      ", subsequent_indent="      ")
    return lines


def job_help_lines() -> List[str]:
    """Every job (``job=<name>``) with each of its ``job.*`` settings, default and choices."""
    from .registry import job_schemas

    lines: List[str] = []
    for name, spec in sorted(job_schemas().items()):
        doc = (spec.config_cls.__doc__ or "").strip().splitlines()
        lines.append(f"job={name}: {doc[0] if doc else ''}")
        lines += job_field_lines(name, spec.config_cls, spec.choices)
        lines.append("")
    return lines


CONFIG_FILE_HELP = """\
--config FILE (.yaml/.yml) holds settings in any of these spellings, mixed freely:
  memory:                      # a namespace with its fields (as in --cfg job)
    hicache_ratio: 3
  schedule.page_size: 64       # a dotted key
  hicache_write_policy: write_through   # a bare field name
  disaggregation-mode: prefill # a legacy flag name (without --)
  model: tiny                  # a preset of a group (like model=tiny)
  job:                         # the job's settings (job.* keys below)
    format: json
Precedence, lowest first: field defaults < presets in conf/config.yaml < presets you select
(memory=hicache) < --config FILE < the command line (overrides and legacy flags, in the order
written; the last one wins). A complete example: docs/examples/server.yaml in the repository:
  sglang-hydra --config docs/examples/server.yaml job=resolve
"""


HEADER = "sglang-hydra: write, check, sweep, size and launch SGLang server settings."
FOOTER = ("Hydra's own flags: run 'sglang-hydra --hydra-help'. 'sglang-hydra --version' prints the version.\n"
          "Environment: SGLANG_HYDRA_TRACEBACK=1 adds the traceback to an unexpected error. Examples in README.md.")


def config_group_lines() -> List[str]:
    """``group: option, ...`` for every config group (the conf/ directories and the jobs)."""
    from .presets import conf_dir, group_options
    groups = {p.name for p in conf_dir().iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__")}
    return [f"{g}: {', '.join(group_options(g))}" for g in sorted(groups | {"job"})]


def help_page() -> str:
    """The ``--help`` page, built here rather than through Hydra: Hydra would run its
    interpolation grammar over these ~1,000 lines on every composition (about 10 s on a
    2-core machine); printed directly it takes a few milliseconds."""
    return "\n".join([
        HEADER,
        "Settings are Hydra overrides (key=value, group=option) or the reference engine's",
        "flags; both may be mixed and the last occurrence of a setting wins.",
        *showcase_help_lines(),
        "",
        "== Config groups ==", *config_group_lines(), "",
        "== Jobs: job=<name>, then job.<key>=value ==", *job_help_lines(),
        "== Config file: --config FILE ==", CONFIG_FILE_HELP,
        "== Fields: key=default [legacy flags] ==",
        "(A field without a description here is one sglang-hydra applies no rule of its own to;",
        "`python -m sglang.launch_server --help` describes it.)", *field_help_lines(),
        FOOTER, "",
    ])


def help_config():
    """Hydra's help node: a pointer to ``--help`` (which the CLI prints without Hydra).
    Hydra copies, parses and saves it into ``.hydra/hydra.yaml`` on every run, so it is small."""
    from hydra.conf import HelpConf

    return HelpConf(
        app_name="sglang-hydra",
        header=HEADER,
        footer=FOOTER,
        template="${hydra.help.header}\n(run sglang-hydra --help for the full page)\n${hydra.help.footer}\n",
    )
