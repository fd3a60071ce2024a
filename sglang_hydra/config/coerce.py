"""Turn a value from any source (YAML, Hydra override, legacy flag, Python) into the
field's declared type, or say precisely why it cannot be."""
from __future__ import annotations

import argparse
import json
import math
import re
import typing
from collections.abc import Mapping
from typing import Any, List, Optional, Tuple

from . import choices as choice_lists
from .record import FieldInfo

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")


def human_readable_int(text: str) -> int:
    """An integer with an optional SI (1k, 2.5M) or IEC (1Ki, 4Gi) suffix; suffixes are case-sensitive."""
    from decimal import Decimal
    text = text.strip()
    m = _SUFFIXED.fullmatch(text)
    if m:
        number, suffix = m.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(f"{text!r}: an IEC suffix ({suffix}) takes a whole number")
            return int(number) * _IEC[suffix]
        return int(Decimal(number) * _SI[suffix])
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid integer {text!r}: use digits, optionally with k/M/G/T or Ki/Mi/Gi/Ti") from None


def cuda_graph_backend(text: str) -> str:
    if text == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise no longer exists; use breakable, full or disabled")
    return text


def cuda_graph_config(text: str):
    """A JSON object of phase -> settings; phases and keys as the reference allows them."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {exc}")
    return cuda_graph_settings(parsed)


def cuda_graph_settings(parsed: Any) -> dict:
    """Check an already-parsed ``--cuda-graph-config`` value (a Hydra ``{decode: {...}}`` value
    or the flag's JSON) the way the reference's value parser checks the flag's JSON, so a value
    accepted on either side is one the reference accepts."""
    from .schema_snapshot import load_snapshot
    facts = load_snapshot().get("parser_facts", {}).get("cuda_graph_config", {})
    phases, keys = facts.get("phases", ()), facts.get("keys", {})
    if not isinstance(parsed, Mapping):
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be a JSON object, got {_json_kind(parsed)}")
    out = {}
    for phase, settings in parsed.items():
        phase = str(phase)
        if phases and phase not in phases:
            raise argparse.ArgumentTypeError(f"--cuda-graph-config: unknown phase {phase!r}; allowed: {', '.join(phases)}")
        if not isinstance(settings, Mapping):
            raise argparse.ArgumentTypeError(
                f"--cuda-graph-config[{phase!r}] must be a JSON object, got {_json_kind(settings)}")
        if "backend" in settings:
            cuda_graph_backend(settings["backend"])
        allowed = keys.get(phase)
        for k in settings:
            if allowed is not None and k not in allowed:
                raise argparse.ArgumentTypeError(
                    f"--cuda-graph-config[{phase!r}]: unknown key {k!r}; allowed: {', '.join(allowed)}")
        out[phase] = dict(settings)
    return out


def _json_kind(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "a list"
    if isinstance(v, Mapping):
        return "an object"
    return type(v).__name__


def allowed_choices(fi: FieldInfo) -> Optional[List[Any]]:
    c = fi.arg.choices
    if c is None and fi.arg.actions:
        c = next((a.choices for a in fi.arg.actions if a.choices and a.action == "store"), None)
    if c is None:
        return None
    if isinstance(c, str):
        return list(choice_lists.choices(c))
    return list(c)


def _unwrap_optional(tp) -> Tuple[Any, bool]:
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def base_type(fi: FieldInfo) -> Tuple[Any, bool]:
    """(inner type, is Optional)."""
    return _unwrap_optional(fi.type)


def _describe(tp) -> str:
    origin = typing.get_origin(tp)
    if origin in (list, List):
        return "a list"
    if origin in (dict, typing.Dict):
        return "a JSON object (mapping)"
    return {bool: "a boolean (true/false)", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def coerce(fi: FieldInfo, value: Any) -> Tuple[Any, Optional[str]]:
    """Return ``(converted, None)`` or ``(None, message)``."""
    tp, optional = base_type(fi)
    opts = allowed_choices(fi)
    if tp is Any:
        if _value_parser(fi) == "cuda_graph_config" and value is not None:
            try:
                value = cuda_graph_config(value) if isinstance(value, str) else cuda_graph_settings(value)
            except argparse.ArgumentTypeError as exc:
                return None, str(exc)
        return _to_any(value, fi), None
    if value is None:
        if optional:
            return None, None
        if opts and "null" in opts:  # Hydra reads a bare `null` as None; the choice is the string.
            return "null", None
        return None, f"may not be null; expected {_describe(tp)}"
    origin = typing.get_origin(tp)
    try:
        if tp is bool:
            out = _to_bool(value)
        elif tp is int:
            out = _to_int(value, suffixes=_value_parser(fi) == "human_readable_int")
        elif tp is float:
            out = _to_float(value)
        elif tp is str:
            out = _to_str(value)
        elif origin in (list, List):
            out = _to_list(value, fi)
        elif origin in (dict, typing.Dict):
            out = _to_dict(value)
        else:  # pragma: no cover - every declared type is handled above
            out = value
    except _ItemError as exc:
        return None, f"{value!r}: {exc}"
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        return None, f"{value!r} is not {_describe(tp)}{': ' + str(exc) if str(exc) else ''}"
    if opts is not None:
        items = out if isinstance(out, list) else [out]
        bad = [x for x in items if x not in opts]
        if bad:
            return None, f"{bad[0]!r} is not one of the allowed values: {', '.join(map(str, opts))}"
    a = fi.arg
    if isinstance(out, float) and not math.isfinite(out):
        # The reference's float() takes 'nan'/'inf', but NaN slips past every bound check and
        # infinity breaks every size computed from the value, so neither is a usable setting.
        return None, f"{out!r} is not a finite number; allowed: {_range_text(a)}"
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        if a.ge is not None and out < a.ge:
            return None, f"{out!r} is below the minimum {a.ge:g}"
        if a.gt is not None and out <= a.gt:
            return None, f"{out!r} must be greater than {a.gt:g}"
        if a.le is not None and out > a.le:
            return None, f"{out!r} is above the maximum {a.le:g}"
    return out, None


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE | _FALSE:
        return v.strip().lower() in _TRUE
    raise ValueError("")


def _range_text(a) -> str:
    """The allowed range of a numeric field in words (``a finite number > 0 and <= 1``)."""
    parts = [f"{op} {bound:g}" for op, bound in ((">=", a.ge), (">", a.gt), ("<=", a.le)) if bound is not None]
    return "a finite number" + (" " + " and ".join(parts) if parts else "")


class _ItemError(ValueError):
    """One element of a list value cannot be converted; the message names it."""


def _to_int(v: Any, suffixes: bool = False) -> int:
    if isinstance(v, bool):
        raise ValueError("")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if v.is_integer():
            return int(v)
        raise ValueError("")
    if isinstance(v, str):
        if suffixes:  # the flag's value parser takes 32k / 4Gi, so the same field's key does too
            return human_readable_int(v)
        return int(v.strip(), 10)
    raise ValueError("")


def _to_float(v: Any) -> float:
    if isinstance(v, bool):
        raise ValueError("")
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        return float(v.strip())
    raise ValueError("")


def _to_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    raise ValueError("")


def _element_converter(fi: FieldInfo):
    tp, _ = base_type(fi)
    (elem,) = typing.get_args(tp) or (str,)
    if elem is int and _value_parser(fi) == "human_readable_int":
        return lambda x: _to_int(x, suffixes=True), "an integer"
    conv = {int: _to_int, float: _to_float, str: _to_str}.get(elem)
    if conv is None:
        return (lambda x: x), "a value"
    return conv, _describe(elem)


def _value_parser(fi: FieldInfo) -> Optional[str]:
    if fi.arg.parser:
        return fi.arg.parser
    return fi.arg.actions[0].parser if fi.arg.actions else None


def _to_list(v: Any, fi: FieldInfo) -> list:
    if isinstance(v, str) and _value_parser(fi) == "json_list":
        v = json.loads(v)
    conv, kind = _element_converter(fi)
    if isinstance(v, Mapping):
        raise ValueError("")
    if not isinstance(v, (list, tuple)):
        # A single value is a one-item list, as the flag form (nargs '+'/'*') reads one token.
        v = [v]
    out = []
    for i, x in enumerate(v, 1):
        try:
            out.append(conv(x))
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise _ItemError(f"item {i} ({x!r}) is not {kind}") from None
        if isinstance(out[-1], float) and not math.isfinite(out[-1]):
            raise _ItemError(f"item {i} ({x!r}) is not a finite number")
    return out


def _to_any(v: Any, fi: FieldInfo) -> Any:
    """Fields the reference parses as arbitrary JSON keep the value as given: a legacy flag
    has parsed its JSON text already, and a Hydra override spells the structure itself
    (``key={a:1}``), so converting again here would turn the JSON string '"1"' into 1."""
    return v


def _to_dict(v: Any) -> dict:
    if isinstance(v, str):
        v = json.loads(v)
    if isinstance(v, dict):
        return {str(k): val for k, val in v.items()}
    raise ValueError("")
