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

import difflib
import functools
import re
from dataclasses import dataclass, field, fields as dc_fields
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .coerce import coerce
from .errors import ConfigError, Problem, problem_for
from .fields import NAMESPACES
from .legacy import Setting, flag_to_field, split_argv
from .record import FIELDS, ServerArgs

# ``job`` and ``hardware`` are composed beside the record (config/hardware.py), not into it.
GROUPS = tuple(NAMESPACES) + ("job", "hardware")


# --------------------------------------------------------------------------- conf/ lookup
@functools.lru_cache(maxsize=1)
def conf_dir() -> Path:
    """The ``conf/`` directory: shipped as package ``sglang_hydra.conf`` or beside the repo."""
    try:
        import importlib.util
        spec = importlib.util.find_spec("sglang_hydra.conf")
        if spec and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                if (Path(loc) / "config.yaml").is_file():
                    return Path(loc)
    except ImportError:
        pass
    here = Path(__file__).resolve().parents[2] / "conf"
    if (here / "config.yaml").is_file():
        return here
    raise FileNotFoundError("cannot find the conf/ directory (config.yaml) of sglang-hydra")


def _yaml_load(path: Path) -> Any:
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, "r", encoding="utf-8") as fh:
        return yaml.load(fh, Loader=loader)


_GLOBAL_PACKAGE = re.compile(r"^#\s*@package\s+_global_\s*$", re.M)


@functools.lru_cache(maxsize=256)
def _load_preset(path: str, group: str, mtime: float) -> Tuple[Any, bool]:
    """(settings by namespace, plain); plain is False when the file needs Hydra.

    A preset normally holds fields of its own group's namespace.  One headed
    ``# @package _global_`` may also set fields of other namespaces (``hicache_file`` picks
    a page size); as long as it is a plain ``{namespace: {field: value}}`` mapping the
    direct composer applies it too.  Defaults lists and other packages go through Hydra.
    """
    text = Path(path).read_text(encoding="utf-8")
    data = _yaml_load(Path(path)) or {}
    if not isinstance(data, dict):
        return data, True
    if _GLOBAL_PACKAGE.search(text):
        plain = "defaults" not in data and all(k in NAMESPACES and isinstance(v, dict) for k, v in data.items())
        return data, plain
    plain = "@package" not in text and "defaults" not in data
    return {group: data}, plain


def preset(group: str, option: str) -> Tuple[Any, bool]:
    """The preset ``group/option`` as ``{namespace: {field: value}}`` (None when missing)."""
    p = conf_dir() / group / f"{option}.yaml"
    if not p.is_file():
        return None, True
    return _load_preset(str(p), group, p.stat().st_mtime)


def group_options(group: str) -> List[str]:
    d = conf_dir() / group
    names = sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []
    if group == "job":
        from ..jobs.specs import JOB_SPECS
        names = sorted(set(names) | set(JOB_SPECS))
    return names


@functools.lru_cache(maxsize=1)
def default_choices() -> Tuple[Tuple[str, str], ...]:
    """Group -> option pairs from the defaults list of conf/config.yaml."""
    data = _yaml_load(conf_dir() / "config.yaml") or {}
    out = []
    for entry in data.get("defaults", []):
        if isinstance(entry, dict):
            for k, v in entry.items():
                if k in GROUPS:
                    out.append((k, v))
    return tuple(out)


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


def _suggest(key: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def _all_record_keys() -> Dict[str, str]:
    return {fi.key: name for name, fi in FIELDS.items() if not fi.arg.no_cli}


def parse_overrides(texts: Sequence[str], cmd: Command, *, allow_sweep: bool = False) -> None:
    """Classify Hydra override strings into group choices, typed settings and the rest."""
    if not texts:
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    keys = _all_record_keys()
    for text in texts:
        try:
            (ov,) = parser.parse_overrides([text])
        except HydraException as exc:
            msg = str(exc).strip().splitlines()[0]
            cmd.problems.append(Problem(text.split("=")[0].lstrip("+~"), None, f"cannot parse override {text!r}: {msg}", "override"))
            continue
        key = ov.key_or_group
        if key == "hydra" or key.startswith("hydra.") or key.startswith("hydra/"):
            cmd.hydra_only.append(text)
            continue
        if ov.is_sweep_override():
            cmd.sweep = True
            if not allow_sweep:
                cmd.problems.append(Problem(key, _flag_of_key(key), f"{text!r} is a sweep; run it with -m (multirun)", "override"))
            elif ov.is_interval_sweep() or ov.is_range_sweep():
                _check_numeric_sweep(key, keys, cmd)
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
            cmd.problems.append(Problem(key, None, f"unknown key{_suggest(key, list(keys) + ['job.' ])}", "override"))
            continue
        if ov.is_add() and not ov.is_force_add():
            cmd.problems.append(problem_for(name, f"'+{key}' would add a key that already exists; use {key}=... to change it", "override"))
            continue
        cmd.settings.append(Setting(name, value, f"override {text}"))


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
        elif k in GROUPS and isinstance(v, str) and choices_ok:
            cmd.choices.setdefault(k, v)
        elif k == "job" and isinstance(v, dict):
            for fk, fv in v.items():
                cmd.job_settings.append((str(fk), fv, source))
        elif k == "hardware" and isinstance(v, dict):
            for fk, fv in v.items():
                cmd.hardware_settings.append((str(fk), fv, source))
        else:
            _one(k, v, source, cmd, keys, flags)


def _one(k: str, v: Any, source: str, cmd: Command, keys: Dict[str, str], flags: Dict[str, str]) -> None:
    name = keys.get(k) or (k if k in FIELDS and not FIELDS[k].arg.no_cli else None) or flags.get(k.lstrip("-"))
    if name is None:
        cmd.problems.append(Problem(k, None, f"unknown setting in {source}{_suggest(k, list(keys) + list(flags))}", source))
        return
    if FIELDS[name].type is bool and v is False and flags.get(k.lstrip("-")) == name:
        pass  # "flag: false" keeps the flag off, as the reference does
    cmd.settings.append(Setting(name, v, source))


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
        data = _yaml_load(p)
    except Exception as exc:  # yaml.YAMLError and decoding errors
        cmd.problems.append(Problem("", "--config", f"{path}: not valid YAML ({str(exc).splitlines()[0]})"))
        return
    settings_from_mapping(data if data is not None else {}, f"--config {path}", cmd, choices_ok=True)


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
        if group in ("job", "hardware"):
            continue
        data, _plain = preset(group, option)
        if data is None:
            problems.append(Problem(group, None, f"no preset '{option}' in group '{group}'; available: {', '.join(group_options(group))}{_suggest(option, group_options(group))}", "preset"))
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
            problems.append(Problem(key, None, f"unknown key in {source}{_suggest(key, keys)}", source))
            continue
        v, err = coerce(FIELDS[name], fv)
        if err:
            problems.append(problem_for(name, err, source))
            continue
        values[name] = v
        applied.append(name)
    return applied


def _job_values(job_name: str, job_settings, problems: List[Problem]) -> Dict[str, Any]:
    from ..jobs.specs import JOB_SPECS
    spec = JOB_SPECS.get(job_name)
    if spec is None:
        problems.append(Problem("job", None, f"no job '{job_name}'; available: {', '.join(sorted(JOB_SPECS))}{_suggest(job_name, JOB_SPECS)}", "job"))
        return {}
    cls = spec.config_cls
    out = {f.name: (f.default_factory() if callable(getattr(f, 'default_factory', None)) and f.default_factory is not __import__('dataclasses').MISSING else f.default) for f in dc_fields(cls)}
    types = {f.name: f.type for f in dc_fields(cls)}
    for k, v, src in job_settings:
        if k not in out or k == "name":
            problems.append(Problem(f"job.{k}", None, f"job '{job_name}' has no setting '{k}'{_suggest(k, [n for n in out if n != 'name'])}", src))
            continue
        v, err = _coerce_job(types[k], v)
        if err is None and k in spec.choices and v not in spec.choices[k]:
            err = f"{v!r} is not one of: {', '.join(map(str, spec.choices[k]))}"
        if err:
            problems.append(Problem(f"job.{k}", None, err, src))
            continue
        out[k] = v
    return out


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


_SAFE_KEY = __import__("re").compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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
        problems.append(Problem(k, None, f"unknown key{_suggest(k, keys)}", "hydra"))
    job = data.get("job") or {}
    job_name = job.get("name", "resolve")
    from ..jobs.specs import JOB_SPECS
    spec = JOB_SPECS.get(job_name)
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
    from .resolve import resolve

    cmd, hydra_flags = build_command(overrides, argv, config_file)
    if hydra_flags:
        cmd.problems.append(Problem("", hydra_flags[0], f"Hydra flag {hydra_flags[0]} is only meaningful on the command line"))
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
            cmd.problems.append(Problem(k, None, f"not a settable record field{_suggest(k, FIELDS)}", "python"))
            continue
        cmd.settings.append(Setting(k, v, "python"))
    composed = compose_values(cmd)
    return resolve(composed.values, explicit=composed.explicit, env=env)
