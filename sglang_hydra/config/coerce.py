"""Turn a value from any source (YAML, Hydra override, legacy flag, Python) into the
field's declared type, or say precisely why it cannot be."""
from __future__ import annotations

import json
import typing
from typing import Any, List, Optional, Tuple

from . import choices as choice_lists
from .record import FieldInfo

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


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
            out = _to_int(value)
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
    except (TypeError, ValueError) as exc:
        return None, f"{value!r} is not {_describe(tp)}{': ' + str(exc) if str(exc) else ''}"
    if opts is not None:
        items = out if isinstance(out, list) else [out]
        bad = [x for x in items if x not in opts]
        if bad:
            return None, f"{bad[0]!r} is not one of the allowed values: {', '.join(map(str, opts))}"
    a = fi.arg
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


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("")
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if v.is_integer():
            return int(v)
        raise ValueError("")
    if isinstance(v, str):
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
    return {int: _to_int, float: _to_float, str: _to_str}.get(elem, lambda x: x)


def _value_parser(fi: FieldInfo) -> Optional[str]:
    if fi.arg.parser:
        return fi.arg.parser
    return fi.arg.actions[0].parser if fi.arg.actions else None


def _to_list(v: Any, fi: FieldInfo) -> list:
    if isinstance(v, str) and _value_parser(fi) == "json_list":
        v = json.loads(v)
    conv = _element_converter(fi)
    if isinstance(v, (list, tuple)):
        return [conv(x) for x in v]
    if isinstance(v, str):
        return [conv(v)]
    raise ValueError("")


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
