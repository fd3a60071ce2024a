"""One way to read an environment knob.

Flags accept the usual spellings (1/0, true/false, yes/no, on/off, any case); anything else is
an error that names the variable, instead of silently meaning "off".
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

TRUE_WORDS = frozenset({"1", "true", "yes", "on", "y", "t"})
FALSE_WORDS = frozenset({"0", "false", "no", "off", "n", "f"})


class EnvValueError(ValueError):
    """An environment variable holds a value its reader cannot use."""

    def __init__(self, name: str, raw: str, expected: str):
        super().__init__(f"environment variable {name}={raw!r} is not {expected}")
        self.name, self.raw, self.expected = name, raw, expected


def _raw(name: str, environ: Optional[Mapping[str, str]]) -> Optional[str]:
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip()


def env_flag(name: str, default: bool = False, environ: Optional[Mapping[str, str]] = None) -> bool:
    raw = _raw(name, environ)
    if raw is None:
        return default
    word = raw.lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise EnvValueError(name, raw, "a boolean (one of 1/0, true/false, yes/no, on/off)")


def env_float(name: str, default: float, environ: Optional[Mapping[str, str]] = None) -> float:
    raw = _raw(name, environ)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise EnvValueError(name, raw, "a number") from None


def env_int(name: str, default: int, environ: Optional[Mapping[str, str]] = None) -> int:
    raw = _raw(name, environ)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvValueError(name, raw, "an integer") from None


def env_str(name: str, default: Optional[str] = None, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    raw = _raw(name, environ)
    return default if raw is None else raw
