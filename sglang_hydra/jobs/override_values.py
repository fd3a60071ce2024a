"""A point's overrides as ``{key: value}`` with the values a person wrote, not Hydra's quoting.

Overrides generated from a file or a search (``render_override``) quote every string
(``job.trace='conversation'``); the outputs store the value (``conversation``), so a column or
a ``settings`` entry never carries quotes inside."""
from __future__ import annotations

import functools
from typing import Any, Dict, Iterable


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser
    return OverridesParser.create()


def override_value(text: str) -> Any:
    """The typed value of one override's right-hand side (``'a'`` -> ``a``, ``4`` -> 4); the
    text itself when Hydra's grammar does not read it as one value (a sweep list)."""
    text = str(text)
    try:
        parsed = _parser().parse_override(f"k={text}")
    except Exception:  # noqa: BLE001 - not one plain value: keep what was written
        return text
    if parsed.is_sweep_override():
        return text
    return parsed.value()


def override_text(text: str) -> str:
    """The value as a table cell: a string without its quotes; anything else as written."""
    value = override_value(text)
    return value if isinstance(value, str) else str(text)


def plain_overrides(overrides: Iterable[Any]) -> Dict[str, str]:
    """``["+job.trace='conversation'", "schedule.page_size=64"]`` -> ``{"job.trace": "conversation",
    "schedule.page_size": "64"}`` (the last occurrence of a key wins, as on the command line)."""
    out: Dict[str, str] = {}
    for ov in overrides or ():
        key, _, value = str(ov).partition("=")
        out[key.lstrip("+~")] = override_text(value)
    return out


def typed_overrides(overrides: Iterable[Any]) -> Dict[str, Any]:
    """``{key: typed value}`` (``'1'`` stays the string ``"1"``, ``4`` is the int 4): what a
    ``--config`` file must hold to give the same settings."""
    out: Dict[str, Any] = {}
    for ov in overrides or ():
        key, _, value = str(ov).partition("=")
        out[key.lstrip("+~")] = override_value(value)
    return out

