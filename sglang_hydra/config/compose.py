"""From a command line to one resolved record.

Precedence, lowest first: field defaults < the default presets of ``conf/config.yaml`` <
presets the user selects (``memory=hicache``) < ``--config FILE`` < the command line, where
Hydra overrides and legacy flags are applied in the order they were written, so the last
occurrence of a setting wins.

Two composers produce the same flat values:

* the direct composer reads the YAML presets itself and applies typed settings; it handles
  ``key=value``, ``group=option``, ``++key=value`` and every legacy flag, without building
  OmegaConf trees (this keeps ``compose_record`` in the millisecond range);
* Hydra's Compose API, used only when an override needs Hydra's own machinery
  (interpolations, ``key@package``), and by the ``@hydra.main`` path of the CLI (``-m``,
  ``--cfg``, ``--help`` ...).  Tests check that both agree.

Either way the flat values then go through the same type/choice checks and resolution
rules, and every problem of the command is reported in one :class:`ConfigError`.
"""
from __future__ import annotations

import functools
import logging
import re
from dataclasses import MISSING, dataclass, field, fields as dc_fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .coerce import coerce
from .errors import ConfigError, Problem, did_you_mean, problem_for
from .fields import NAMESPACES
from .legacy import Setting, flag_to_field, split_argv
from .record import FIELDS, ServerArgs
from .presets import GROUPS, conf_dir, default_choices, group_options, no_such_option, preset, yaml_load  # noqa: F401  (GROUPS, conf_dir: re-exported)
from .registry import job_schemas


log = logging.getLogger("sglang_hydra.config")


# --------------------------------------------------------------------------- the request
@dataclass
class Command:
    """Everything one command asks for, in precedence order."""

    choices: Dict[str, str] = field(default_factory=dict)            # user-selected presets
    settings: List[Setting] = field(default_factory=list)             # typed record settings
    job_settings: List[Tuple[str, Any, str]] = field(default_factory=list)  # (job field, value, source)
    hardware_settings: List[Tuple[str, Any, str]] = field(default_factory=list)  # (hardware field, value, source)
    hydra_overrides: List[str] = field(default_factory=list)          # overrides only Hydra can apply
    hydra_only: List[str] = field(default_factory=list)               # hydra.* / hydra/... overrides
    problems: List[Problem] = field(default_factory=list)
    sweep: bool = False
    deprecated: List[Tuple[str, str]] = field(default_factory=list)  # (deprecated flag spelling, where)


@functools.lru_cache(maxsize=1)
def _all_record_keys() -> Dict[str, str]:
    # Cached: FIELDS never changes, and the record has 561 fields (read-only to callers).
    return {fi.key: name for name, fi in FIELDS.items() if not fi.arg.no_cli}


@functools.lru_cache(maxsize=1)
def _override_parser():
    """Hydra's override parser; building it inspects ~20 grammar functions, so keep one."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    return OverridesParser.create()


def parse_overrides(texts: Sequence[str], cmd: Command, *, allow_sweep: bool = False) -> None:
    """Classify Hydra override strings into group choices, typed settings and the rest."""
    if not texts:
        return
    from hydra.errors import HydraException

    parser = _override_parser()
    keys = _all_record_keys()
    for text in texts:
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException as exc:
            msg = str(exc).strip().splitlines()[0]
            key = text.split("=")[0].lstrip("+~")
            cmd.problems.append(Problem(key, _flag_of_key(key), f"cannot parse override {text!r}: {msg}{_quoting_hint(text)}", "override"))
            continue
        key = ov.key_or_group
        if key == "hydra" or key.startswith("hydra.") or key.startswith("hydra/"):
            cmd.hydra_only.append(text)
            continue
        if ov.is_sweep_override():
            cmd.sweep = True
            if not allow_sweep:
                cmd.problems.append(Problem(key, _flag_of_key(key), f"{text!r} is a sweep; run it with -m (multirun)", "override"))
            elif ov.is_interval_sweep():
                _check_numeric_sweep(key, keys, cmd)
            else:
                if ov.is_range_sweep():
                    _check_numeric_sweep(key, keys, cmd)
                cmd.problems += _check_sweep_values(ov, text, keys)
            cmd.hydra_overrides.append(text)
            continue
        if ov.is_delete():
            cmd.problems.append(Problem(key, _flag_of_key(key), "schema fields cannot be deleted; set a value instead", "override"))
            continue
        if ov.package:
            cmd.hydra_overrides.append(text)
            continue
        value = ov.value()
        if key in GROUPS:
            if ov.is_add() and not ov.is_force_add():
                cmd.problems.append(Problem(key, None, f"group '{key}' is always present; select a preset with {key}=<option>", "override"))
                continue
            if not isinstance(value, str):
                cmd.problems.append(Problem(key, None, f"a whole namespace cannot be replaced by {value!r}; select a preset ({key}=<option>) or set keys ({key}.<field>=...)", "override"))
                continue
            cmd.choices[key] = value
            continue
        if _has_interpolation(value):
            cmd.hydra_overrides.append(text)
            continue
        if key.startswith("job."):
            cmd.job_settings.append((key[4:], value, f"override {text}"))
            continue
        if key.startswith("hardware."):
            cmd.hardware_settings.append((key[9:], value, f"override {text}"))
            continue
        name = keys.get(key)
        if name is None:
            cmd.problems.append(Problem(key, None, f"unknown key{did_you_mean(key, list(keys) + ['job.' ])}", "override"))
            continue
        if ov.is_add() and not ov.is_force_add():
            cmd.problems.append(problem_for(name, f"'+{key}' would add a key that already exists; use {key}=... to change it", "override"))
            continue
        cmd.settings.append(Setting(name, value, f"override {text}"))


def _quoting_hint(text: str) -> str:
    """How to write the value so that Hydra's grammar (and the shell) accept it."""
    _, _, value = text.partition("=")
    if not any(ch in value for ch in "{}[]\"'"):
        return ""
    return ("; Hydra's grammar wants dict keys as bare words (key={a:1,b:2}); JSON text must be one quoted "
            "Hydra string, with single quotes around the whole override for the shell: "
            "'key=\"{\\\"a\\\": 1}\"' (or use the field's legacy --flag, which takes plain JSON)")


def _check_sweep_values(ov, text: str, keys: Dict[str, str]) -> List[Problem]:
    """Problems with the listed values of a choice/range sweep, found before anything runs.

    A value that can never work (not a number, no such preset) is a mistake in the command,
    not a point that fails on its own; interval sweeps (Optuna) and job settings are checked
    by each job instead."""
    key = ov.key_or_group
    if not (ov.is_choice_sweep() or ov.is_range_sweep()):
        return []
    try:
        values = list(ov.sweep_iterator())
    except Exception:  # glob() needs Hydra's config loader: left to Hydra
        return []
    problems: List[Problem] = []
    if key in GROUPS:
        options = group_options(key)
        for v in values:
            if str(v) not in options:
                problems.append(Problem(key, None, f"sweep value {v!r} in {text!r}: "
                                                   f"{no_such_option(key, str(v), options)}", "override"))
        return problems
    if key.startswith("hardware."):
        # hardware fields sit beside the record: every listed value goes through the same
        # checks as hardware.<field>=<value> (one point per value, each composed on its own)
        from .hardware import HARDWARE_FIELDS, compose_hardware
        field = key[len("hardware."):]
        for v in values[:1] if field not in HARDWARE_FIELDS else values:     # an unknown field: once
            _, bad = compose_hardware("local", [(field, v, f"override {text}")])
            problems.extend(bad)
        return problems
    name = keys.get(key)
    if name is None:
        if not key.startswith("job."):
            problems.append(Problem(key, None, f"unknown key{did_you_mean(key, keys)}", "override"))
        return problems
    for v in values:
        _, err = coerce(FIELDS[name], v)
        if err:
            problems.append(problem_for(name, f"sweep value {v!r}: {err}", "override"))
    return problems


def _searchpath_dirs(cmd: Command) -> List[Path]:
    """Local directories a ``hydra.searchpath=[file://...]`` override adds to Hydra's search path."""
    dirs = []
    for text in cmd.hydra_only:
        key, _, value = text.partition("=")
        if key.lstrip("+~") != "hydra.searchpath":
            continue
        for item in value.strip("[]").split(","):
            item = item.strip().strip("'\"")
            if item.startswith("file://"):
                dirs.append(Path(item[len("file://"):]))
    return dirs


def check_choices(cmd: Command) -> List[Problem]:
    """Group selections (``memory=hicache``, ``job=setup``) that name no preset or job (in conf/
    or in a directory that ``hydra.searchpath`` adds)."""
    problems = []
    extra_dirs = _searchpath_dirs(cmd)
    for group, option in cmd.choices.items():
        options = list(group_options(group))
        for d in extra_dirs:
            options += sorted(p.stem for p in (d / group).glob("*.yaml")) if (d / group).is_dir() else []
        if option not in options:
            kind = "job" if group == "job" else "preset"
            problems.append(Problem(group, None, no_such_option(group, option, options, kind), "override"))
    return problems


def hydra_problem(exc: BaseException) -> Problem:
    """One problem line for an error Hydra or OmegaConf raised while composing."""
    return Problem("", None, _hydra_message(exc), "hydra")


def _check_numeric_sweep(key: str, keys: Dict[str, str], cmd: Command) -> None:
    """interval()/range() only make sense on a number; a string or bool field gets a clear problem."""
    import typing
    name = keys.get(key)
    if name is None:
        return
    tp = FIELDS[name].type
    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is typing.Union else [tp]
    if not any(a in (int, float) for a in args):
        allowed = FIELDS[name].arg.choices
        if isinstance(allowed, str):
            from .choices import choices as registry
            allowed = registry(allowed)
        hint = f"use choice({', '.join(map(str, allowed))})" if allowed else "use choice(...) with its values"
        cmd.problems.append(problem_for(name, f"interval()/range() need a numeric field, but {key} is "
                                        f"{getattr(args[0], '__name__', args[0])}; {hint}", "override"))


def _flag_of_key(key: str) -> Optional[str]:
    name = _all_record_keys().get(key)
    if name is None:
        return None
    return problem_for(name, "").flag


def _has_interpolation(v: Any) -> bool:
    if isinstance(v, str):
        return "${" in v
    if isinstance(v, dict):
        return any(_has_interpolation(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_interpolation(x) for x in v)
    return False


def settings_from_mapping(data: Any, source: str, cmd: Command, *, choices_ok: bool) -> None:
    """Settings from a YAML mapping: nested namespaces, dotted keys, field names or flag names."""
    if not isinstance(data, dict):
        cmd.problems.append(Problem("", "--config", f"{source}: the file must hold a mapping at its top level, got {type(data).__name__}"))
        return
    flags = flag_to_field()
    keys = _all_record_keys()
    for k, v in data.items():
        k = str(k)
        if k in NAMESPACES and isinstance(v, dict):
            for fk, fv in v.items():
                _one(f"{k}.{fk}", fv, source, cmd, keys, flags)
        elif k in GROUPS and isinstance(v, str) and choices_ok and not _flag_not_preset(k, v, flags):
            cmd.choices.setdefault(k, v)
        elif k == "job" and isinstance(v, dict):
            for fk, fv in v.items():
                cmd.job_settings.append((str(fk), fv, source))
        elif k == "hardware" and isinstance(v, dict):
            for fk, fv in v.items():
                cmd.hardware_settings.append((str(fk), fv, source))
        else:
            _one(k, v, source, cmd, keys, flags)
    _keep_hicache_auto_sizing(cmd)
    _unstate_stand_in_model(cmd)


def _flag_not_preset(key: str, value: str, flags: Dict[str, str]) -> bool:
    """Whether a top-level ``--config`` key that names both a preset group and an SGLang flag
    (``model:``, the ``--model`` alias of ``--model-path``; ``device:``, ``--device``) means the
    flag: it does when its value is not one of the group's presets (``model: llama3_8b`` selects
    the preset, ``model: meta-llama/Llama-3.1-8B-Instruct`` and ``device: cpu`` set the flag)."""
    if not dict.__contains__(flags, key):   # the exact spelling of a flag, not a prefix of one
        return False
    return value not in group_options(key)


def _one(k: str, v: Any, source: str, cmd: Command, keys: Dict[str, str], flags: Dict[str, str]) -> None:
    name = keys.get(k) or (k if k in FIELDS and not FIELDS[k].arg.no_cli else None) or flags.get(k.lstrip("-"))
    if name is None:
        cmd.problems.append(Problem(k, None, f"unknown setting in {source}{did_you_mean(k, list(keys) + list(flags))}", source))
        return
    if FIELDS[name].type is bool and v is False and flags.get(k.lstrip("-")) == name:
        pass  # "flag: false" keeps the flag off, as the reference does
    flag = "--" + k.lstrip("-")
    if v is not False and v is not None and flag in _deprecated_flags():
        cmd.deprecated.append((flag, source))
        from .legacy import flag_actions
        action = flag_actions()[flag]
        if action.kind == "deprecated_store_const" and action.choices and v in action.choices:
            v = action.const     # `monokernel-backend: amd` sets what `--monokernel-backend amd` sets
    cmd.settings.append(Setting(name, v, source))


@functools.lru_cache(maxsize=1)
def _deprecated_flags() -> frozenset:
    from .legacy import flag_actions
    return frozenset(f for f, a in flag_actions().items() if a.kind.startswith("deprecated"))


# What replaces each deprecated reference flag (the engine names the same replacements).
_DEPRECATED_FLAG_REPLACEMENTS = {
    "--enable-dp-attention": "--attn-dp-size <N> in place of --dp-size <N> --enable-dp-attention",
    "--disable-cuda-graph": "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled",
    "--monokernel-backend": "--enable-amd-monokernel in place of --monokernel-backend amd",
}


def deprecated_flag_notes(spellings: Sequence[Tuple[str, str]]) -> List[str]:
    """One warning per deprecated flag used: ``(flag, where)`` pairs -> texts naming the replacement."""
    from .legacy import flag_actions
    actions = flag_actions()
    out = []
    for flag, where in spellings:
        action = actions.get(flag)
        if action is None or not action.kind.startswith("deprecated"):
            continue
        use = _DEPRECATED_FLAG_REPLACEMENTS.get(flag)
        text = (f"warning: {flag} ({where}) is deprecated in SGLang and will be removed"
                + (f"; use {use}" if use else ""))
        if text not in out:
            out.append(text)
    return out


def build_command(overrides: Sequence[str] = (), argv: Sequence[str] = (), config_file: Optional[str] = None,
                  *, allow_sweep: bool = False) -> Tuple[Command, List[str]]:
    """Parse everything a command gives; returns the command and Hydra's own flags."""
    cmd = Command()
    split = split_argv(list(argv))
    cmd.problems += split.problems
    cfg_path = split.config_file or config_file
    if split.config_file and config_file:
        cmd.problems.append(Problem("", "--config", "only one --config file may be given"))
    file_cmd = Command()
    if cfg_path:
        load_config_file(cfg_path, file_cmd)
    # Command-line pieces in written order: Hydra overrides (from `overrides`, then argv) and legacy flags.
    cli = Command()
    ordered: List[Tuple[int, Any]] = [(-1, o) for o in overrides]
    ordered += split.overrides + [(pos, s) for pos, s in split.settings]
    ordered.sort(key=lambda t: t[0])
    for _, item in ordered:
        if isinstance(item, Setting):
            cli.settings.append(item)
        else:
            parse_overrides([item], cli, allow_sweep=allow_sweep)
    cmd.problems += file_cmd.problems + cli.problems
    cmd.choices = {**file_cmd.choices, **cli.choices}
    cmd.settings = file_cmd.settings + cli.settings
    cmd.job_settings = file_cmd.job_settings + cli.job_settings
    cmd.hardware_settings = file_cmd.hardware_settings + cli.hardware_settings
    cmd.hydra_overrides = cli.hydra_overrides
    cmd.hydra_only = cli.hydra_only
    cmd.sweep = cli.sweep
    for text in deprecated_flag_notes([(s.source, "command line") for s in cli.settings] + file_cmd.deprecated):
        log.warning(text)
    return cmd, split.hydra_flags


def load_config_file(path: str, cmd: Command) -> None:
    p = Path(path)
    if p.suffix.lower() not in (".yaml", ".yml"):
        cmd.problems.append(Problem("", "--config", f"{path}: only .yaml or .yml files are accepted"))
        return
    if not p.is_file():
        cmd.problems.append(Problem("", "--config", f"{path}: no such file"))
        return
    try:
        data = yaml_load(p)
    except Exception as exc:  # yaml.YAMLError and decoding errors
        cmd.problems.append(Problem("", "--config", _yaml_error_text(path, exc)))
        return
    settings_from_mapping(data if data is not None else {}, f"--config {path}", cmd, choices_ok=True)


@functools.lru_cache(maxsize=1)
def _stand_in_model_fields() -> Tuple[str, ...]:
    """The model's shape fields (no engine flag): their defaults are the tiny preset's model."""
    return tuple(n for n, fi in FIELDS.items() if fi.namespace == "model" and fi.arg.hydra_only)


def _unstate_stand_in_model(cmd: Command) -> None:
    """A file whose model shape fields all hold the defaults (the tiny stand-in a record printed
    for an unknown model carries: ``architecture: LlamaForCausalLM``, two layers ...) does not
    thereby state the model: those settings are dropped, so the values stay the same and
    architecture- and geometry-dependent rules keep skipping, as they did for the printed record.
    A file that gives any shape field another value states the model as written."""
    names = _stand_in_model_fields()
    given = [s for s in cmd.settings if s.name in names]
    if not given:
        return
    for s in given:
        v, err = coerce(FIELDS[s.name], s.value)
        if err or v != FIELDS[s.name].default_value():
            return
    cmd.settings = [s for s in cmd.settings if s.name not in names]


def _keep_hicache_auto_sizing(cmd: Command) -> None:
    """A file that states a HiCache host-memory fraction beside the ratio resolution fills in by
    default (what a printed record holds: ``hicache_ratio: 2.0`` next to
    ``hicache_host_memory_fraction: 0.8``) keeps auto-sizing on.

    Resolution (M-HR3) turns the fraction off whenever a ratio is *given*; a record printed by
    ``job=resolve`` names the defaulted ratio, so reading it back would silently switch auto-sizing
    off.  The defaulted ratio is therefore not counted as given: resolution fills in the same
    value again.  A ratio other than that default still turns the fraction off."""
    last = {s.name: s for s in cmd.settings}
    ratio, frac = last.get("hicache_ratio"), last.get("hicache_host_memory_fraction")
    if ratio is None or frac is None or frac.value is None:
        return
    mode = last.get("hicache_host_memory_mode")
    default = 1.2 if mode is not None and mode.value == "buffer_only" else 2.0
    try:
        same = float(ratio.value) == default
    except (TypeError, ValueError):
        return      # a bad value: coercion reports it
    if same:
        cmd.settings = [s for s in cmd.settings if s.name != "hicache_ratio"]


def _yaml_error_text(path: str, exc: BaseException) -> str:
    """``file:line:column: what is wrong`` for a YAML error (1-based, as editors count)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    what = " ".join(x for x in (getattr(exc, "context", None), getattr(exc, "problem", None)) if x)
    if mark is not None:
        return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {what or type(exc).__name__}"
    if isinstance(exc, UnicodeDecodeError):
        return f"{path}: not UTF-8 text (byte {exc.start}): not a YAML file?"
    return f"{path}: not valid YAML: {' '.join(str(exc).split()) or type(exc).__name__}"


# --------------------------------------------------------------------------- composition
@dataclass
class Composed:
    values: Dict[str, Any]          # flat record values before resolution
    explicit: frozenset             # fields the user set (CLI, --config, chosen presets)
    job_name: str
    job: Dict[str, Any]             # the selected job's settings
    problems: List[Problem] = field(default_factory=list)  # found while composing (raise=False)
    hardware: Any = None            # config.hardware.Hardware: the machine to size for


def compose_values(cmd: Command, *, raise_problems: bool = True) -> Composed:
    """The direct composer: presets + settings, typed and checked, no OmegaConf trees.

    With ``raise_problems=False`` bad values keep their defaults and the problems travel in
    the result, so resolution can add its own and the user sees all of them at once."""
    problems = list(cmd.problems)
    values = {n: fi.default_value() for n, fi in FIELDS.items()}
    explicit = set()
    chosen = dict(default_choices())
    chosen.update(cmd.choices)
    job_name = chosen.get("job", "resolve")
    keys = _all_record_keys()
    for group, option in chosen.items():
        if group in ("job", "hardware") or option is None:   # null: the group selects nothing
            continue
        data, _plain = preset(group, option)
        if data is None:
            problems.append(Problem(group, None, no_such_option(group, option, group_options(group)), "preset"))
            continue
        if not isinstance(data, dict):
            problems.append(Problem(group, None, f"preset {group}/{option} must be a mapping", "preset"))
            continue
        for ns, settings in data.items():
            if not isinstance(settings, dict):
                problems.append(Problem(f"{ns}", None, f"preset {group}/{option} must map fields to values", "preset"))
                continue
            applied = _apply_namespace(ns, settings, f"preset {group}/{option}", keys, values, problems)
            if group in cmd.choices:
                explicit.update(applied)
    for s in cmd.settings:
        v, err = coerce(FIELDS[s.name], s.value)
        if err:
            problems.append(problem_for(s.name, err, s.source))
            continue
        values[s.name] = v
        explicit.add(s.name)
    job = _job_values(job_name, cmd.job_settings, problems)
    from .hardware import compose_hardware
    hardware, hw_problems = compose_hardware(chosen.get("hardware"), cmd.hardware_settings)
    problems += hw_problems
    if problems and raise_problems:
        raise ConfigError(problems)
    return Composed(values, frozenset(explicit), job_name, job, problems, hardware)


def _apply_namespace(ns: str, data: Dict[str, Any], source: str, keys: Dict[str, str],
                     values: Dict[str, Any], problems: List[Problem]) -> List[str]:
    """Check and apply one namespace's ``{field: value}`` mapping; returns the fields set."""
    applied = []
    for fk, fv in data.items():
        key = f"{ns}.{fk}"
        name = keys.get(key)
        if name is None:
            problems.append(Problem(key, None, f"unknown key in {source}{did_you_mean(key, keys)}", source))
            continue
        v, err = coerce(FIELDS[name], fv)
        if err:
            problems.append(problem_for(name, err, source))
            continue
        values[name] = v
        applied.append(name)
    return applied


def _job_values(job_name: str, job_settings, problems: List[Problem]) -> Dict[str, Any]:
    jobs = job_schemas()
    spec = jobs.get(job_name)
    if spec is None:
        problems.append(Problem("job", None, f"no job '{job_name}'; available: {', '.join(sorted(jobs))}{did_you_mean(job_name, jobs)}", "job"))
        return {}
    cls = spec.config_cls
    out = {f.name: (f.default_factory() if f.default_factory is not MISSING else f.default) for f in dc_fields(cls)}
    types = {f.name: f.type for f in dc_fields(cls)}
    import dataclasses
    groups = {k: v for k, v in out.items() if dataclasses.is_dataclass(v)}   # nested settings: job.sla.ttft_ms
    for k, v in groups.items():
        out[k] = dataclasses.asdict(v)
    for k, v, src in job_settings:
        if _nested_job_setting(job_name, cls, out, k, v, src, problems):
            continue
        if k not in out or k == "name":
            problems.append(Problem(f"job.{k}", None, f"job '{job_name}' has no setting '{k}'{did_you_mean(k, [n for n in out if n != 'name'])}", src))
            continue
        v, err = _coerce_job(types[k], v)
        if err is None and k in spec.choices and v not in spec.choices[k]:
            err = f"{v!r} is not one of: {', '.join(map(str, spec.choices[k]))}"
        if err:
            problems.append(Problem(f"job.{k}", None, err, src))
            continue
        out[k] = v
    return out


def _nested_job_setting(job_name: str, cls: type, out: Dict[str, Any], key: str, value: Any, src: str,
                        problems: List[Problem]) -> bool:
    """``job.<group>.<field>=...`` (or a ``job: {<group>: {...}}`` mapping in a --config file) for a job
    setting that is itself a dataclass (``job.sla.ttft_ms``); True when ``key`` was such a setting.
    The job then receives the group as a plain dict."""
    import dataclasses
    import typing

    head, dot, rest = key.partition(".")
    hints = typing.get_type_hints(cls)
    sub = hints.get(head)
    if not (isinstance(sub, type) and dataclasses.is_dataclass(sub)):
        return False
    if not dot and not isinstance(value, dict):
        problems.append(Problem(f"job.{head}", None, f"is a group of settings ({', '.join(f.name for f in dc_fields(sub))}); "
                                f"set job.{head}.<setting>=...", src))
        return True
    current = out.get(head)
    group = dict(dataclasses.asdict(current) if dataclasses.is_dataclass(current) else (current or {}))
    sub_hints = typing.get_type_hints(sub)
    items = [(rest, value)] if dot else [(str(k), v) for k, v in value.items()]
    for name, v in items:
        if name not in sub_hints:
            problems.append(Problem(f"job.{head}.{name}", None, f"job '{job_name}' has no setting '{head}.{name}'"
                                    f"{did_you_mean(name, list(sub_hints))}; job.{head} has: {', '.join(sub_hints)}", src))
            continue
        v, err = _coerce_job(sub_hints[name], v)
        if err:
            problems.append(Problem(f"job.{head}.{name}", None, err, src))
            continue
        group[name] = v
    out[head] = group
    return True


def _coerce_job(tp: Any, v: Any):
    from .record import FieldInfo
    from .spec import Arg
    import dataclasses
    import typing
    if isinstance(tp, str):  # postponed annotations
        tp = eval(tp, dict(typing.__dict__))  # noqa: S307 - our own annotation strings
    fi = FieldInfo("job", "job", tp, None, dataclasses.MISSING, Arg())
    return coerce(fi, v)


# --------------------------------------------------------------------------- Hydra composer
_hydra_ready = False


def _ensure_hydra() -> None:
    global _hydra_ready
    from hydra.core.global_hydra import GlobalHydra
    from hydra import initialize_config_dir

    from .schema import register_configs
    register_configs()
    gh = GlobalHydra.instance()
    if not gh.is_initialized():
        initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="sglang_hydra")
    _hydra_ready = True


def render_override(key: str, value: Any) -> str:
    """``key=value`` in Hydra's override grammar for any plain Python value."""
    return f"{key}={render_value(value)}"


def render_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "nan"
        if v in (float("inf"), float("-inf")):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return _quote(v)
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(render_value(x) for x in v) + "]"
    if isinstance(v, dict):
        if all(isinstance(k, str) and _SAFE_KEY.match(k) for k in v):
            return "{" + ",".join(f"{k}:{render_value(x)}" for k, x in v.items()) + "}"
        import json  # keys the grammar cannot spell: hand over JSON text (dict fields accept it)
        return _quote(json.dumps(v))
    raise TypeError(f"cannot express {type(v).__name__} as a Hydra override value")


_SAFE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _quote(s: str) -> str:
    # Inside a single-quoted Hydra string only quotes need escaping, and backslashes that
    # precede a quote (or end the string) must be doubled.
    out = []
    i = 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == "\\":
            j += 1
        run = j - i
        if run:
            nxt = s[j] if j < len(s) else None
            out.append("\\" * (run * 2 if nxt in ("'", None) else run))
            i = j
            continue
        ch = s[i]
        out.append("\\'" if ch == "'" else ch)
        i += 1
    return "'" + "".join(out) + "'"


def hydra_override_list(cmd: Command, *, include_hydra: bool = True) -> List[str]:
    """The command as Hydra overrides: group choices, then settings in precedence order."""
    out = [f"{g}={o}" for g, o in cmd.choices.items()]
    last: Dict[str, int] = {}
    rendered: List[str] = []
    for s in cmd.settings:
        key = FIELDS[s.name].key
        last[key] = len(rendered)
        rendered.append(render_override(key, s.value))
    for k, v, _ in cmd.job_settings:
        last[f"job.{k}"] = len(rendered)
        rendered.append(render_override(f"job.{k}", v))
    for k, v, _ in cmd.hardware_settings:
        last[f"hardware.{k}"] = len(rendered)
        rendered.append(render_override(f"hardware.{k}", v))
    keep = set(last.values())
    out += [r for i, r in enumerate(rendered) if i in keep]
    out += cmd.hydra_overrides
    if include_hydra:
        out += cmd.hydra_only
    return out


def values_from_cfg(cfg, cmd: Command) -> Composed:
    """Flatten a composed Hydra config and check it exactly like the direct composer."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True)
    problems: List[Problem] = []
    keys = _all_record_keys()
    values = {n: fi.default_value() for n, fi in FIELDS.items()}
    for ns in NAMESPACES:
        _apply_namespace(ns, data.get(ns) or {}, "hydra", keys, values, problems)
    extra = set(data) - set(NAMESPACES) - {"job", "hydra", "hardware"}
    for k in sorted(extra):
        problems.append(Problem(k, None, f"unknown key{did_you_mean(k, keys)}", "hydra"))
    job = data.get("job") or {}
    job_name = job.get("name", "resolve")
    spec = job_schemas().get(job_name)
    if spec is not None:
        allowed = {f.name for f in dc_fields(spec.config_cls)}
        for k in job:
            if k not in allowed:
                problems.append(Problem(f"job.{k}", None, f"job '{job_name}' has no setting '{k}'", "hydra"))
        for k, opts in spec.choices.items():
            if job.get(k) not in opts:
                problems.append(Problem(f"job.{k}", None, f"{job.get(k)!r} is not one of: {', '.join(map(str, opts))}", "hydra"))
    explicit = set(s.name for s in cmd.settings)
    for g in cmd.choices:
        d, _ = preset(g, cmd.choices[g]) if g in NAMESPACES else (None, True)
        for ns, settings in (d.items() if isinstance(d, dict) else ()):
            for fk in (settings if isinstance(settings, dict) else ()):
                if f"{ns}.{fk}" in keys:
                    explicit.add(keys[f"{ns}.{fk}"])
    from .hardware import compose_hardware
    hw_data = data.get("hardware") or {}
    hardware, hw_problems = compose_hardware(hw_data.get("name"), preset_data=hw_data)
    problems += hw_problems
    if problems:
        raise ConfigError(problems)
    return Composed(values, frozenset(explicit), job_name, dict(job), hardware=hardware)


def compose_with_hydra(cmd: Command) -> Composed:
    from hydra import compose
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    _ensure_hydra()
    try:
        cfg = compose(config_name="config", overrides=hydra_override_list(cmd, include_hydra=False))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError([Problem("", None, _hydra_message(exc), "hydra")]) from None
    return values_from_cfg(cfg, cmd)


def _hydra_message(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("To append to your config use")]
    return " ".join(lines[:3]) or type(exc).__name__


def needs_hydra(cmd: Command) -> bool:
    if cmd.hydra_overrides:
        return True
    for g, o in cmd.choices.items():
        if g != "job":
            data, plain = preset(g, o)
            if data is not None and not plain:
                return True
    return False


# --------------------------------------------------------------------------- public API
def compose(overrides: Sequence[str] = (), argv: Sequence[str] = (), config_file: Optional[str] = None,
            *, env: Optional[Dict[str, str]] = None) -> Tuple[ServerArgs, Composed]:
    """The record and the selected job's settings for one command."""
    cmd, hydra_flags = build_command(overrides, argv, config_file)
    if hydra_flags:
        cmd.problems.append(Problem("", hydra_flags[0], f"Hydra flag {hydra_flags[0]} is only meaningful on the command line"))
    return resolve_command(cmd, env=env)


def resolve_command(cmd: Command, *, env: Optional[Dict[str, str]] = None) -> Tuple[ServerArgs, Composed]:
    """The resolved record and the composed values of a parsed command.

    Hydra's Compose API composes when an override needs it (and the command has no problems
    yet); otherwise the direct composer does, handing its problems on to resolution so that
    every problem of the command is raised together in one :class:`ConfigError`."""
    from .resolve import resolve

    composed = compose_with_hydra(cmd) if needs_hydra(cmd) and not cmd.problems else \
        compose_values(cmd, raise_problems=False)
    return resolve(composed.values, explicit=composed.explicit, env=env, prior=composed.problems), composed


def compose_record(overrides: Sequence[str] = (), argv: Sequence[str] = (), config_file: Optional[str] = None) -> ServerArgs:
    """Hydra overrides, then legacy flags and overrides in ``argv`` order -> a resolved record.

    This is exactly what the command line does for a single run.  Raises
    :class:`ConfigError` listing every problem of the command.
    """
    return compose(overrides, argv, config_file)[0]


def record_from_values(values: Dict[str, Any], *, env: Optional[Dict[str, str]] = None) -> ServerArgs:
    """A resolved record from flat Python values (each counts as explicitly set)."""
    from .resolve import resolve

    cmd = Command()
    for k, v in values.items():
        if k not in FIELDS or FIELDS[k].arg.no_cli:
            cmd.problems.append(Problem(k, None, f"not a settable record field{did_you_mean(k, FIELDS)}", "python"))
            continue
        cmd.settings.append(Setting(k, v, "python"))
    composed = compose_values(cmd)
    return resolve(composed.values, explicit=composed.explicit, env=env)
