"""The reference engine's flat command line, generated from the field declarations.

``legacy_parser()`` is a plain argparse parser whose flags, aliases, defaults, choices,
``store_true``/value kinds, ``nargs`` and JSON value parsers match the reference for every
declared field (``dest`` is the field name).  ``split_argv`` walks a mixed command line
and turns each legacy flag *in place* into a typed setting, so legacy flags and Hydra
overrides can be interleaved and the last occurrence of a setting wins.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import typing
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .coerce import allowed_choices, base_type
from .errors import Problem
from .record import FIELDS, FieldInfo
from .spec import flags_of, primary_flag

# Flags the reference registers by hand that map onto record fields.
_DEPRECATED_FLAGS = {"--enable-dp-attention": "enable_dp_attention"}

# Hydra's own command-line flags: name -> takes a value.
HYDRA_FLAGS = {
    "-m": False, "--multirun": False, "-h": False, "--help": False, "--hydra-help": False,
    "--version": False, "--resolve": False, "-r": False, "--run": False,
    "--cfg": True, "-c": True, "--package": True, "-p": True, "--info": None, "-i": None,
    "-cp": True, "--config-path": True, "-cn": True, "--config-name": True, "-cd": True,
    "--config-dir": True, "-sc": True, "--shell-completion": True, "--experimental-rerun": True,
}
_INFO_CHOICES = {"all", "config", "defaults", "defaults-tree", "plugins", "searchpath"}
_OVERRIDE_RE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.@/\-]*=")


def _json_loads(text: str):
    return json.loads(text)


_json_loads.__name__ = "loads"  # argparse names the type function in its error: "invalid loads value"


def json_list_type(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(f"Invalid JSON list: {text}. Please provide a valid JSON list.")


def _type_func(fi: FieldInfo):
    if fi.arg.parser == "json":
        return _json_loads
    if fi.arg.parser == "json_list":
        return json_list_type
    tp, _ = base_type(fi)
    if typing.get_origin(tp) in (list, List):
        (elem,) = typing.get_args(tp) or (str,)
        tp = elem
    return {int: int, float: float}.get(tp, str)


def cli_fields() -> List[FieldInfo]:
    return [fi for fi in FIELDS.values() if not (fi.arg.no_cli or fi.arg.hydra_only)]


def _add_field(parser: argparse.ArgumentParser, fi: FieldInfo) -> None:
    names = list(flags_of(fi.name, fi.arg))
    kw: Dict[str, Any] = {"help": fi.arg.help, "default": fi.default_value()}
    if primary_flag(fi.name, fi.arg)[2:].replace("-", "_") != fi.name:
        kw["dest"] = fi.name
    tp, _ = base_type(fi)
    if tp is bool:
        kw["action"] = "store_true"
    else:
        kw["type"] = _type_func(fi)
        if typing.get_origin(tp) in (list, List) and fi.arg.parser is None:
            kw["nargs"] = fi.arg.nargs or "+"
        elif fi.arg.nargs:
            kw["nargs"] = fi.arg.nargs
        opts = allowed_choices(fi)
        if opts:
            kw["choices"] = opts
    parser.add_argument(*names, **kw)


def legacy_parser(prog: str = "sglang-hydra") -> argparse.ArgumentParser:
    """The reference engine's flags for every declared field (dest = field name)."""
    parser = argparse.ArgumentParser(prog=prog, add_help=True)
    for fi in cli_fields():
        _add_field(parser, fi)
    parser.add_argument("--enable-dp-attention", dest="enable_dp_attention", action="store_true",
                        default=False, help="Deprecated: use --attn-dp-size.")
    parser.add_argument("--config", help="YAML file of settings merged after presets and before the command line.")
    return parser


@dataclass(frozen=True)
class Setting:
    """One typed value for one field, with where it came from."""

    name: str
    value: Any
    source: str


@dataclass
class SplitArgv:
    settings: List[Tuple[int, Setting]]       # (argv position, setting)
    overrides: List[Tuple[int, str]]          # (argv position, Hydra override text)
    hydra_flags: List[str]                    # Hydra's own flags, with their values
    config_file: Optional[str]
    problems: List[Problem]


_PARSER_CACHE: Dict[Tuple, argparse.ArgumentParser] = {}


def _cached_parser() -> argparse.ArgumentParser:
    from . import choices as c
    key = tuple((k, tuple(v)) for k, v in sorted(c._REGISTRY.items()))
    p = _PARSER_CACHE.get(key)
    if p is None:
        _PARSER_CACHE.clear()
        p = _PARSER_CACHE[key] = legacy_parser()
    return p


def flag_actions() -> Dict[str, argparse.Action]:
    return dict(_cached_parser()._option_string_actions)


def _problem(action: argparse.Action, flag: str, message: str) -> Problem:
    fi = FIELDS.get(action.dest)
    key = fi.key if fi else action.dest
    return Problem(key, flag, message, source=flag)


def _convert(action: argparse.Action, flag: str, raw: str) -> Tuple[Any, Optional[Problem]]:
    func = action.type or str
    try:
        value = func(raw)
    except argparse.ArgumentTypeError as exc:
        return None, _problem(action, flag, f"argument {flag}: {exc}")
    except (TypeError, ValueError):
        name = getattr(func, "__name__", repr(func))
        return None, _problem(action, flag, f"argument {flag}: invalid {name} value: {raw!r}")
    if action.choices is not None and value not in action.choices:
        allowed = ", ".join(repr(c) for c in action.choices)
        return None, _problem(action, flag, f"argument {flag}: invalid choice: {value!r} (choose from {allowed})")
    return value, None


def split_argv(argv: Sequence[str]) -> SplitArgv:
    """Separate a mixed command line into typed legacy settings, Hydra overrides and Hydra flags."""
    actions = flag_actions()
    out = SplitArgv([], [], [], None, [])
    argv = list(argv)
    i = 0
    while i < len(argv):
        tok = argv[i]
        pos = i
        i += 1
        if tok in ("-m", "--multirun") or tok in HYDRA_FLAGS:
            out.hydra_flags.append(tok)
            takes = HYDRA_FLAGS[tok]
            if takes or (takes is None and i < len(argv) and argv[i] in _INFO_CHOICES):
                if i < len(argv):
                    out.hydra_flags.append(argv[i])
                    i += 1
            continue
        if tok.startswith("--") and len(tok) > 2:
            flag, eq, inline = tok.partition("=")
            if flag == "--config":
                if eq:
                    out.config_file = inline
                elif i < len(argv):
                    out.config_file = argv[i]
                    i += 1
                else:
                    out.problems.append(Problem("", "--config", "argument --config: expected one argument"))
                continue
            if flag.split("=")[0] in HYDRA_FLAGS:
                out.hydra_flags.append(tok)
                continue
            action = actions.get(flag)
            if action is None or flag in ("--help", "-h"):
                close = difflib.get_close_matches(flag, [a for a in actions if a.startswith("--")], n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                out.problems.append(Problem("", flag, f"unrecognized flag {flag}{hint}", source=flag))
                if not eq and i < len(argv) and not argv[i].startswith("-") and "=" not in argv[i]:
                    i += 1  # skip its value so it is not mistaken for an override
                continue
            if isinstance(action, argparse._StoreTrueAction):
                if eq:
                    out.problems.append(_problem(action, flag, f"argument {flag}: ignored explicit argument {inline!r}"))
                else:
                    out.settings.append((pos, Setting(action.dest, True, flag)))
                continue
            if action.nargs in ("+", "*"):
                raws = [inline] if eq else []
                while not eq and i < len(argv) and not argv[i].startswith("-") and not _looks_like_override(argv[i]):
                    raws.append(argv[i])
                    i += 1
                if not raws and action.nargs == "+":
                    out.problems.append(_problem(action, flag, f"argument {flag}: expected at least one argument"))
                    continue
                values, bad = [], False
                for r in raws:
                    v, prob = _convert(action, flag, r)
                    if prob:
                        out.problems.append(prob)
                        bad = True
                    values.append(v)
                if not bad:
                    out.settings.append((pos, Setting(action.dest, values, flag)))
                continue
            if eq:
                raw = inline
            elif i < len(argv) and (not argv[i].startswith("-") or _is_number(argv[i])):
                raw = argv[i]
                i += 1
            else:
                out.problems.append(_problem(action, flag, f"argument {flag}: expected one argument"))
                continue
            v, prob = _convert(action, flag, raw)
            if prob:
                out.problems.append(prob)
            else:
                out.settings.append((pos, Setting(action.dest, v, flag)))
            continue
        if tok.startswith("-") and not _looks_like_override(tok):
            out.problems.append(Problem("", tok, f"unrecognized flag {tok}", source=tok))
            continue
        out.overrides.append((pos, tok))
    return out


def _looks_like_override(tok: str) -> bool:
    return bool(_OVERRIDE_RE.match(tok))


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def flag_to_field() -> Dict[str, str]:
    """Every legacy spelling (without leading dashes) -> field name; used for --config files."""
    out: Dict[str, str] = {}
    for flag, action in flag_actions().items():
        if flag.startswith("--") and action.dest in FIELDS:
            out[flag[2:]] = action.dest
    return out


def to_argv(values: Dict[str, Any], defaults: Dict[str, Any]) -> List[str]:
    """Reference launch flags for every field whose value differs from its default."""
    out: List[str] = []
    for fi in cli_fields():
        v = values.get(fi.name)
        if v == defaults.get(fi.name) and fi.name != "model_path":  # the reference requires --model-path
            continue
        flag = primary_flag(fi.name, fi.arg)
        tp, _ = base_type(fi)
        if tp is bool:
            if v:
                out.append(flag)
            else:
                continue  # a store_true flag cannot express False; the default already is False
        elif v is None:
            continue  # no flag spelling for "unset"; the reference default is None too
        elif fi.arg.parser in ("json", "json_list"):
            out += [flag, json.dumps(v, separators=(",", ":"))]
        elif isinstance(v, list):
            if v:
                out += [flag, *map(str, v)]
        else:
            out += [flag, str(v)]
    return out
