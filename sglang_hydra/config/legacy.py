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

from .coerce import allowed_choices, base_type, cuda_graph_backend, cuda_graph_config, human_readable_int
from .errors import Problem
from .record import FIELDS, FieldInfo
from .spec import FlagSpec, flags_of, has_flag

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


def nullable_str(text: str):
    """Empty text or the word ``None`` means unset, as in the reference."""
    return None if not text or text == "None" else text


VALUE_PARSERS = {
    "int": int, "float": float, "str": str, "json": _json_loads, "json_list": json_list_type,
    "human_readable_int": human_readable_int, "nullable_str": nullable_str,
    "cuda_graph_backend": cuda_graph_backend, "cuda_graph_config": cuda_graph_config,
}


def _type_name(fi: FieldInfo) -> str:
    tp, _ = base_type(fi)
    if typing.get_origin(tp) in (list, List):
        (elem,) = typing.get_args(tp) or (str,)
        tp = elem
    return {int: "int", float: "float"}.get(tp, "str")


def field_actions(fi: FieldInfo) -> Tuple[FlagSpec, ...]:
    """The reference's argparse actions for a field: from the snapshot, or derived from a
    hand-written declaration (one action: store_true for booleans, else store)."""
    a = fi.arg
    if a.actions:
        return a.actions
    if not has_flag(a):
        return ()
    flags = tuple(flags_of(fi.name, a))
    tp, _ = base_type(fi)
    if tp is bool:
        return (FlagSpec(flags, "store_true"),)
    nargs = None
    if typing.get_origin(tp) in (list, List) and a.parser is None:
        nargs = a.nargs or "+"
    elif a.nargs:
        nargs = a.nargs
    opts = allowed_choices(fi)
    return (FlagSpec(flags, "store", a.parser or _type_name(fi), tuple(opts) if opts else None, nargs),)


def cli_fields() -> List[FieldInfo]:
    """Fields with at least one reference flag."""
    return [fi for fi in FIELDS.values() if field_actions(fi)]


class _LoraPaths(argparse.Action):
    """``--lora-paths``: each item is a path, ``name=path``, or a JSON object with lora_name and lora_path."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, lora_path_items(values or []))


def lora_path_items(values: Sequence[str]) -> list:
    out = []
    for item in values:
        item = item.strip()
        if item.startswith("{") and item.endswith("}"):
            obj = json.loads(item)
            if not (isinstance(obj, dict) and "lora_path" in obj and "lora_name" in obj):
                raise ValueError(f"{item!r} is JSON but lacks the 'lora_name' and 'lora_path' keys")
            out.append(obj)
        else:
            out.append(item)
    return out


class _DeprecatedStoreConst(argparse.Action):
    """A retired flag that still sets its field to a fixed value (``const``)."""

    def __init__(self, option_strings, dest, const_value=None, **kw):
        self.const_value = const_value
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const_value)


def _add_action(parser: argparse.ArgumentParser, fi: FieldInfo, spec: FlagSpec) -> None:
    kw: Dict[str, Any] = {"help": fi.arg.help or None, "default": fi.default_value(), "dest": fi.name}
    names = list(spec.flags)
    if spec.action in ("store_true", "deprecated_store_true"):
        kw["action"] = "store_true"
    elif spec.action == "boolean_optional":
        names = [f for f in names if not f.startswith("--no-")]
        kw["action"] = argparse.BooleanOptionalAction
    elif spec.action == "deprecated_store_const":
        kw.update(action=_DeprecatedStoreConst, const_value=spec.const, choices=spec.choices)
    else:
        if spec.action == "lora_paths":
            kw["action"] = _LoraPaths
        kw["type"] = VALUE_PARSERS.get(spec.parser or "str", str)
        if spec.choices:
            kw["choices"] = list(spec.choices)
        if spec.nargs is not None:
            kw["nargs"] = spec.nargs
        if spec.nargs == "?":
            kw["const"] = spec.const
    parser.add_argument(*names, **kw)


def legacy_parser(prog: str = "sglang-hydra") -> argparse.ArgumentParser:
    """The reference engine's flags for every field (dest = field name)."""
    parser = argparse.ArgumentParser(prog=prog, add_help=True)
    for fi in FIELDS.values():
        for spec in field_actions(fi):
            _add_action(parser, fi, spec)
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


class FlagAction:
    """What split_argv needs to know about one flag; building these is ~10x cheaper than
    registering 530 argparse actions, which only ``legacy_parser()`` (tests, docs) still does."""

    __slots__ = ("option_strings", "dest", "kind", "nargs", "type", "choices", "const")

    def __init__(self, option_strings, dest, kind, nargs, type, choices, const):
        self.option_strings, self.dest, self.kind, self.nargs = option_strings, dest, kind, nargs
        self.type, self.choices, self.const = type, choices, const


_TABLE_CACHE: Dict[Tuple, Dict[str, FlagAction]] = {}


def flag_actions() -> Dict[str, FlagAction]:
    """Every flag spelling -> its action (the table is rebuilt when a plugin adds choices)."""
    from . import choices as c
    key = tuple((k, tuple(v)) for k, v in sorted(c._REGISTRY.items()))
    table = _TABLE_CACHE.get(key)
    if table is None:
        _TABLE_CACHE.clear()
        table = _TABLE_CACHE[key] = _build_table()
    return table


def _build_table() -> Dict[str, FlagAction]:
    table: Dict[str, FlagAction] = {}
    for fi in FIELDS.values():
        for spec in field_actions(fi):
            kind = spec.action
            if kind in ("store_true", "deprecated_store_true", "boolean_optional"):
                nargs, tfunc, choices = 0, None, None
            else:
                nargs = None if kind == "deprecated_store_const" else spec.nargs
                tfunc = None if kind == "deprecated_store_const" else VALUE_PARSERS.get(spec.parser or "str", str)
                choices = list(spec.choices) if spec.choices else None
            act = FlagAction(tuple(spec.flags), fi.name, kind, nargs, tfunc, choices, spec.const)
            for flag in spec.flags:
                table.setdefault(flag, act)
    table["--config"] = FlagAction(("--config",), "config", "config", None, str, None, None)
    return table


def _problem(action: FlagAction, flag: str, message: str) -> Problem:
    fi = FIELDS.get(action.dest)
    key = fi.key if fi else action.dest
    return Problem(key, flag, message, source=flag)


_KIND = {int: "an integer", float: "a number", human_readable_int: "an integer (suffixes k/M/G/T, Ki/Mi/Gi/Ti allowed)",
         _json_loads: "JSON text", json_list_type: "a JSON list", cuda_graph_config: "a JSON object of phase settings"}


def _convert(action: FlagAction, flag: str, raw: str) -> Tuple[Any, Optional[Problem]]:
    func = action.type or str
    try:
        value = func(raw)
    except argparse.ArgumentTypeError as exc:
        return None, _problem(action, flag, f"argument {flag}: {exc}")
    except (TypeError, ValueError):
        name = getattr(func, "__name__", repr(func))
        want = _KIND.get(func)
        tail = f"; expected {want}" if want else ""
        return None, _problem(action, flag, f"argument {flag}: invalid {name} value: {raw!r}{tail}")
    if action.choices is not None and value not in action.choices:
        allowed = ", ".join(repr(c) for c in action.choices)
        return None, _problem(action, flag, f"argument {flag}: invalid choice: {value!r} (choose from {allowed})")
    return value, None


def _long_hydra_flags() -> List[str]:
    return [f for f in HYDRA_FLAGS if f.startswith("--")]


def match_flag(flag: str, actions: Dict[str, FlagAction]) -> Tuple[Optional[str], Optional[str]]:
    """``(full flag, None)`` for an exact flag or an unambiguous prefix of one (as argparse
    accepts ``--tp`` for ``--tp-size``), else ``(None, why)``; ``why`` is None when nothing matches."""
    if flag in actions:
        return flag, None
    if not flag.startswith("--") or len(flag) < 3:
        return None, None
    ours = [f for f in actions if f.startswith(flag) and f.startswith("--") and f != "--help"]
    hydra = [f for f in _long_hydra_flags() if f.startswith(flag)]
    if ours and hydra:
        return None, (f"{flag} abbreviates both Hydra's own flag{'s' if len(hydra) > 1 else ''} "
                      f"{', '.join(hydra)} and the reference flag{'s' if len(ours) > 1 else ''} "
                      f"{', '.join(sorted(ours)[:6])}; spell the flag out")
    if hydra and not ours:
        return None, f"{flag} abbreviates Hydra's own flag {', '.join(hydra)}; Hydra's flags must be spelled out"
    if len(ours) == 1:
        return ours[0], None
    if len(ours) > 1:
        shown = ", ".join(sorted(ours)[:8]) + (" ..." if len(ours) > 8 else "")
        return None, f"ambiguous flag {flag}: could be {shown}"
    return None, None


def _takes_value(tok: str) -> bool:
    return not tok.startswith("-") or _is_number(tok)


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
            if flag in HYDRA_FLAGS:
                out.hydra_flags.append(tok)
                continue
            full, why = match_flag(flag, actions) if flag != "--help" else (None, None)
            if full == "--config":
                full, why = None, f"{flag} abbreviates --config; spell it out"
            if full is None:
                if why is None:
                    close = difflib.get_close_matches(flag, [a for a in actions if a.startswith("--")], n=1)
                    why = f"unrecognized flag {flag}" + (f"; did you mean {close[0]}?" if close else "")
                out.problems.append(Problem("", flag, why, source=flag))
                if not eq:
                    i = _skip_values(argv, i)  # so its values are not mistaken for overrides
                continue
            action = actions[full]
            flag = full
            if action.kind == "boolean_optional" or action.nargs == 0:  # switches (store_true, --x/--no-x)
                if eq:
                    out.problems.append(_problem(action, flag, f"argument {flag}: ignored explicit argument {inline!r}"))
                elif i < len(argv) and _is_stray_word(argv[i]):
                    out.problems.append(_problem(action, flag, _switch_given_value(action, flag, argv[i])))
                    i += 1
                else:
                    on = not flag.startswith("--no-") if action.kind == "boolean_optional" else True
                    out.settings.append((pos, Setting(action.dest, on, flag)))
                continue
            if action.nargs in ("+", "*"):
                raws = [inline] if eq else []
                while not eq and i < len(argv) and _takes_value(argv[i]) and not is_hydra_override(argv[i]):
                    raws.append(argv[i])  # NAME=PATH items (--lora-paths a=/x) are values, as in the reference
                    i += 1
                if not raws and action.nargs == "+":
                    out.problems.append(_problem(action, flag, _missing_value(flag, "at least one value", argv, i)))
                    continue
                values, bad = [], False
                for r in raws:
                    v, prob = _convert(action, flag, r)
                    if prob:
                        out.problems.append(prob)
                        bad = True
                    values.append(v)
                if bad:
                    continue
                if action.kind == "lora_paths":
                    try:
                        values = lora_path_items(values)
                    except (ValueError, json.JSONDecodeError) as exc:
                        out.problems.append(_problem(action, flag, f"argument {flag}: {exc}"))
                        continue
                out.settings.append((pos, Setting(action.dest, values, flag)))
                continue
            if action.nargs == "?":
                if eq:
                    raw = inline
                elif i < len(argv) and _takes_value(argv[i]) and not is_hydra_override(argv[i]):
                    raw = argv[i]
                    i += 1
                else:
                    out.settings.append((pos, Setting(action.dest, action.const, flag)))
                    continue
            elif eq:
                raw = inline
            elif i < len(argv) and _takes_value(argv[i]) and not is_hydra_override(argv[i]):
                raw = argv[i]
                i += 1
            else:
                out.problems.append(_problem(action, flag, _missing_value(flag, "a value", argv, i)))
                continue
            v, prob = _convert(action, flag, raw)
            if prob:
                out.problems.append(prob)
            elif action.kind == "deprecated_store_const":
                out.settings.append((pos, Setting(action.dest, action.const, flag)))
            else:
                out.settings.append((pos, Setting(action.dest, v, flag)))
            continue
        if tok.startswith("-") and not _looks_like_override(tok):
            name, eq, _ = tok.partition("=")
            out.problems.append(Problem("", name, _single_dash_text(name, actions), source=name))
            if not eq:
                i = _skip_values(argv, i)
            continue
        out.overrides.append((pos, tok))
    return out


def _looks_like_override(tok: str) -> bool:
    return bool(_OVERRIDE_RE.match(tok))


# First segments of a Hydra override besides the record's namespaces: job, hardware and Hydra's
# own settings, and the deployment keys (deploy=pd, prefill.*, decode.*).
_OVERRIDE_ROOTS = frozenset({"job", "hardware", "hydra", "deploy", "prefill", "decode"})


def is_hydra_override(tok: str) -> bool:
    """Whether a token after a valued flag is a Hydra override rather than the flag's value.

    Only ``key=value`` text whose key starts with a config group or namespace (``memory.x=1``,
    ``job=resolve``, ``hydra.run.dir=d``) or that adds/removes a key (``+x=1``, ``~x``) is
    an override; other ``NAME=VALUE`` text is a value, as the reference reads it
    (``--lora-paths a=/x b=/y``)."""
    from .fields import NAMESPACES
    if not _looks_like_override(tok):
        return False
    if tok[0] in "+~":
        return True
    key = tok.partition("=")[0]
    root = re.split(r"[./@]", key, maxsplit=1)[0]
    return root in NAMESPACES or root in _OVERRIDE_ROOTS


def _is_stray_word(tok: str) -> bool:
    """A bare word right after a switch: neither a flag nor an override (``--enable-metrics yes``)."""
    return not tok.startswith(("-", "+", "~")) and not _looks_like_override(tok)


def _switch_given_value(action: FlagAction, flag: str, word: str) -> str:
    if action.kind == "boolean_optional":
        spelled = f"give {flag} for on or --no-{flag[2:].removeprefix('no-')} for off"
    else:
        spelled = f"give {flag} to turn it on, leave it out for off"
    fi = FIELDS.get(action.dest)
    key = f"; or set {fi.key}=true/false" if fi is not None and not fi.arg.no_cli else ""
    return f"{flag} is a switch and takes no value, got {word!r}: {spelled}{key}"


def _missing_value(flag: str, what: str, argv: Sequence[str], i: int) -> str:
    if i < len(argv) and is_hydra_override(argv[i]):
        return f"argument {flag}: expects {what}; the next token {argv[i]!r} is a Hydra override, not its value"
    return f"argument {flag}: expects {what}"


def _skip_values(argv: Sequence[str], i: int) -> int:
    """Past the value tokens of a flag we do not know (its arity is unknown, so all of them)."""
    while i < len(argv) and _takes_value(argv[i]) and not _looks_like_override(argv[i]):
        i += 1
    return i


def _single_dash_text(tok: str, actions: Dict[str, FlagAction]) -> str:
    """``-tp``: the reference has no single-dash flags; name the ``--`` flag it was meant to be."""
    text = f"unrecognized flag {tok}"
    if tok.startswith("--") or len(tok) < 3:
        return text
    double = "-" + tok
    full, why = match_flag(double, actions)
    if full is not None:
        shown = double if full == double else f"{double} ({full})"
        return f"{text}; did you mean {shown}? (flags take two dashes)"
    close = difflib.get_close_matches(double, [a for a in actions if a.startswith("--")], n=1)
    return text + (f"; did you mean {close[0]}?" if close else "")


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


class _FlagNames(dict):
    """Flag spelling (no dashes) -> field; ``get`` also takes an unambiguous prefix, as the
    reference does for a --config file (it replays each key as ``--key`` through argparse)."""

    def get(self, key, default=None):
        if key in self:
            return self[key]
        if not isinstance(key, str) or not key:
            return default
        full, _ = match_flag("--" + key, flag_actions())
        return self[full[2:]] if full and full[2:] in self else default


def flag_to_field() -> Dict[str, str]:
    """Every legacy spelling (without leading dashes) -> field name; used for --config files."""
    out: Dict[str, str] = _FlagNames()
    for flag, action in flag_actions().items():
        if action.kind == "boolean_optional" and flag.startswith("--no-"):
            continue  # in a file the positive spelling takes true/false
        if flag.startswith("--") and action.dest in FIELDS:
            out[flag[2:]] = action.dest
    return out


def to_argv(values: Dict[str, Any], defaults: Dict[str, Any]) -> List[str]:
    """Reference launch flags for every field whose value differs from its default.

    Values that no flag can spell (False for a plain store_true flag, None for a valued flag
    whose default is set, an empty list for a ``nargs='+'`` flag) are left out."""
    out: List[str] = []
    for fi in cli_fields():
        v = values.get(fi.name)
        if v == defaults.get(fi.name) and fi.name != "model_path":  # the reference requires --model-path
            continue
        out += flag_tokens(fi, v)
    return out


def flag_tokens(fi: FieldInfo, v: Any) -> List[str]:
    """The tokens that make the reference parse ``v`` for this field ([] when no flag can)."""
    acts = field_actions(fi)
    usable = [a for a in acts if not a.action.startswith("deprecated")] or list(acts)
    act = usable[0]
    flag = act.flags[0]
    if act.action in ("store_true", "deprecated_store_true"):
        return [flag] if v is True else []
    if act.action == "boolean_optional":
        if v is None:
            return []
        return [flag] if v else ["--no-" + flag[2:]]
    if act.action == "deprecated_store_const":
        return [flag, str(act.choices[0])] if v == act.const and act.choices else []
    if v is None:
        return [flag, "None"] if act.parser == "nullable_str" else []
    if act.parser in ("json", "json_list", "cuda_graph_config"):
        return [f"{flag}={json.dumps(v, separators=(',', ':'))}"]
    if act.action == "lora_paths" or act.nargs in ("+", "*"):
        items = v if isinstance(v, list) else [v]
        if not items:
            return [flag] if act.nargs == "*" or act.action == "lora_paths" else []
        toks = [json.dumps(x) if isinstance(x, dict) else _scalar_text(x) for x in items]
        clash = [t for t in toks if (t.startswith("-") and not _is_number(t)) or is_hydra_override(t)]
        if clash and len(toks) == 1:
            return [f"{flag}={toks[0]}"]  # one item that reads as a flag or an override: attach it
        if clash and act.action == "lora_paths":
            toks = [_lora_item_as_json(t) if t in clash else t for t in toks]
        elif clash:
            return []  # argparse would read such an item as a flag (or we as an override)
        return [flag, *toks]
    if act.nargs == "?" and v == act.const:
        return [flag]
    text = _scalar_text(v)
    if act.parser == "nullable_str" and (text == "" or text == "None"):
        return []  # the reference reads both as unset
    # attached when the value would read as a flag or (key=value of a group) a Hydra override
    return [f"{flag}={text}"] if text.startswith("-") or text == "" or is_hydra_override(text) else [flag, text]


def _lora_item_as_json(item: str) -> str:
    """``NAME=PATH`` (or a bare path) as the JSON object the engine reads the same way; used
    when the text form would be read as a flag or a Hydra override on one command line."""
    name, eq, path = item.partition("=")
    if not eq:
        name = path = item
    return json.dumps({"lora_name": name, "lora_path": path})


def _scalar_text(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    return str(v)
