"""``job.check=engine``: ask an installed SGLang whether it accepts the resolved command.

sglang-hydra checks types, choices and the memory/disaggregation rules itself; the many
cross-field rules of the other namespaces live only in the engine.  This module exports the
record as reference flags, runs the engine's own parsing and resolution on them in a
subprocess (``engine_probe.py``, under ``job.python``), and turns its verdict into this
project's :class:`Problem` form.  It also compares the engine's memory/disagg fields with the
built-in ones and warns about every difference (version drift).
"""
from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .errors import Problem, problem_for

log = logging.getLogger("sglang_hydra.config")
PROBE = Path(__file__).resolve().parent / "engine_probe.py"


def run_probe(python: str, request: Dict[str, Any], timeout: float = 600.0) -> Dict[str, Any]:
    """The probe's JSON answer; ``{"installed": False, ...}`` when the interpreter is unusable."""
    try:
        proc = subprocess.run([python, str(PROBE)], input=json.dumps(request), capture_output=True, text=True,
                              timeout=timeout)
    except FileNotFoundError:
        return {"installed": False, "error": f"no interpreter at {python}"}
    except subprocess.TimeoutExpired:
        return {"installed": True, "verdict": {"ok": False, "error": f"the engine did not answer within {timeout:.0f} s"}}
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return {"installed": False, "error": tail}


def model_dir_for(record, workdir: Path) -> str:
    """A local checkpoint directory for the engine: the record's own, else a ``config.json``
    written from the record's KV geometry (the engine only reads the config on CPU)."""
    path = Path(str(record.model_path))
    if (path / "config.json").is_file():
        return str(path)
    heads = getattr(record, "num_attention_heads", None) or max(record.num_key_value_heads, 1) * 2
    cfg = {
        "architectures": [record.architecture], "model_type": record.model_type,
        "num_hidden_layers": record.num_hidden_layers, "num_key_value_heads": record.num_key_value_heads,
        "num_attention_heads": heads, "head_dim": record.head_dim,
        "hidden_size": getattr(record, "hidden_size", None) or heads * record.head_dim,
        "intermediate_size": 4 * heads * record.head_dim, "vocab_size": 32000,
        "max_position_embeddings": record.max_position_embeddings, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
    }
    if record.attention_arch == "mla":
        cfg.update(kv_lora_rank=record.kv_lora_rank, qk_rope_head_dim=record.qk_rope_head_dim)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return str(workdir)


def stand_in_caveat(record) -> Optional[str]:
    """What the engine could not judge when :func:`model_dir_for` had to make the model up.

    For a ``model_path`` that is neither a checkpoint directory nor a selected preset, the
    written ``config.json`` carries the tiny defaults (a two-layer Llama); the engine then
    judges that stand-in, so its model-dependent checks say nothing about the real model."""
    from .rules.model_facts import ARCHITECTURE_FIELDS, GEOMETRY_FIELDS, known_in_record
    if (Path(str(record.model_path)) / "config.json").is_file():
        return None
    unknown = [what for what, fields in (("architecture", ARCHITECTURE_FIELDS), ("KV geometry", GEOMETRY_FIELDS))
               if not known_in_record(record, fields)]
    if not unknown:
        return None
    return (f"not judged for {record.model_path!r}: its {' and '.join(unknown)} "
            f"{'is' if len(unknown) == 1 else 'are'} unknown (neither a selected model preset nor a local "
            f"checkpoint directory), so the engine checked a stand-in config.json ({record.architecture}, "
            f"{record.attention_arch.upper()}, {record.num_hidden_layers} layers, {record.num_key_value_heads} KV heads); "
            "its model-dependent checks (which architectures a feature supports, MLA-only or MHA-only options, "
            "hybrid-layer options, head and layer counts against the parallel sizes) describe that stand-in, "
            "not this model. State the model with model=<preset>, a checkpoint directory, or "
            "model.architecture=... and the geometry fields")


def engine_argv(record, model_dir: str) -> Tuple[List[str], List[str]]:
    """(argv for the engine, notes on what was added for a CPU-only check)."""
    from .legacy import to_argv
    from .record import FIELDS
    defaults = {n: fi.default_value() for n, fi in FIELDS.items()}
    values = dict(record.raw_input) or record.to_dict()
    values["model_path"] = model_dir
    argv = to_argv(values, defaults)
    notes = []
    if values.get("device") is None:
        argv += ["--device", "cpu"]
        notes.append("--device cpu (the record leaves the device unset)")
    if not values.get("skip_tokenizer_init"):
        argv.append("--skip-tokenizer-init")
        notes.append("--skip-tokenizer-init (no tokenizer files are needed to check the config)")
    return argv, notes


_WORD = re.compile(r"--?[a-z][a-z0-9-]+|[a-z][a-z0-9]*(?:_[a-z0-9]+)+")


def verdict_problem(message: str, version: str) -> Problem:
    """The engine's error as one problem, keyed by the first record field its text names."""
    from .legacy import flag_actions
    from .record import FIELDS
    actions = flag_actions()
    for word in _WORD.findall(message):
        name = actions[word].dest if word in actions else (word if word in FIELDS else None)
        if name in FIELDS:
            return problem_for(name, f"SGLang {version} rejects this configuration: {message}", "engine")
    return Problem("", None, f"SGLang {version} rejects this configuration: {message}", "engine")


_PLUGIN_PROBE = ("import importlib.metadata as m, sys; "
                 "sys.exit(0 if any(e.name == sys.argv[1] for e in m.entry_points(group='sglang.srt.plugins')) else 3)")


#: server settings under which SGLang builds another cache than the plugin's hooked RadixCache
_NOT_WITH_HOOKED_CACHE = ("enable_hierarchical_cache", "enable_lmcache", "enable_flexkv",
                          "enable_unified_cache_external_linker", "enable_session_radix_cache")


def eviction_policy_problems(record, python: Optional[str] = None, *, plugin_provided: bool = False) -> List[Problem]:
    """The record's eviction policy as SGLang sees it: built in, ours through the engine plugin
    (which ``python`` must have, unless the caller puts it on the server's path:
    ``plugin_provided``; issue 20), or one SGLang cannot run at all."""
    from .choices import engine_policy_support
    name = getattr(record, "radix_eviction_policy", None)
    support = engine_policy_support()
    if not name or name in support["builtin"] or not support["builtin"]:
        return []
    key, flag = "memory.radix_eviction_policy", "--radix-eviction-policy"
    python = python or sys.executable
    if name in support["plugin"]:
        if name in support.get("hooked", ()):
            # the plugin's hooked RadixCache serves plain models only (sglang_plugin._why_not_hooked)
            flags = [f"--{f.replace('_', '-')}" for f in _NOT_WITH_HOOKED_CACHE if getattr(record, f, False)]
            if flags:
                return [Problem(key, flag, f"{name!r} runs in SGLang only in sglang-hydra's hooked RadixCache, which "
                                f"SGLang does not use with {', '.join(flags)}; choose a built-in policy or drop "
                                f"{'them' if len(flags) > 1 else 'it'}", "engine")]
        if plugin_provided:
            return []
        try:
            ok = subprocess.run([python, "-c", _PLUGIN_PROBE, support["plugin_name"]], capture_output=True,
                                stdin=subprocess.DEVNULL, timeout=120).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return []
        return [Problem(key, flag, f"{name!r} runs in SGLang only through sglang-hydra's engine plugin "
                        f"(entry point {support['plugin_name']!r}), which {python} does not have; install it "
                        f"there: {python} -m pip install --no-deps sglang-hydra (or set job.python)", "engine")]
    runnable = ", ".join(support["builtin"] + support["plugin"])
    return [Problem(key, flag, f"{name!r} is a replay-only policy: SGLang cannot run it, even with sglang-hydra's "
                    f"engine plugin; allowed for a server: {runnable}", "engine")]


def check_with_engine(record, python: Optional[str] = None, *, drift_check: bool = True) -> Tuple[List[Problem], List[str]]:
    """(problems, notes): the engine's verdict on ``record`` and what it noticed on the way."""
    from .drift import drift
    python = python or sys.executable
    policy_problems = eviction_policy_problems(record, python)
    if policy_problems:
        return policy_problems, []
    caveat = stand_in_caveat(record)
    with tempfile.TemporaryDirectory(prefix="sglang-hydra-check-") as tmp:
        argv, notes = engine_argv(record, model_dir_for(record, Path(tmp) / "model"))
        answer = run_probe(python, {"argv": argv, "schema": drift_check})
    if caveat:
        notes.append(caveat)
    if not answer.get("installed"):
        why = answer.get("error", "")
        return [Problem("job.check", None, f"SGLang is not installed in {python} ({why}); install sglang there "
                        "or set job.python to an interpreter that has it", "engine")], notes
    version = answer.get("version", "?")
    if answer.get("schema"):
        for line in drift(answer["schema"]):
            log.warning("version drift: %s", line)
            notes.append(f"version drift: {line}")
    v = answer.get("verdict") or {}
    if v.get("ok"):
        notes.append(f"SGLang {version} accepts this configuration" + (" (with the stand-in model)" if caveat else ""))
        return [], notes
    problem = verdict_problem(v.get("error", "unknown error"), version)
    if caveat:
        problem = Problem(problem.key, problem.flag, problem.message + " (judged with a stand-in model: "
                          "the architecture/geometry is unknown; see the note above)", problem.source)
    return [problem], notes
