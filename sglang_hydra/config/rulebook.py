"""The rule registry and the live state rules work on.

Kept apart from :mod:`.resolve` so that ``rules/<namespace>.py`` (which register here) and
``resolve`` (which imports those modules and runs the rules) do not import each other.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from .errors import problem_for
from .record import FIELDS


@dataclass(frozen=True)
class Rule:
    step: float
    rule_id: str
    fn: Callable[["Resolving"], None]


RULES: List[Rule] = []


def rule(step: float, rule_id: str):
    """Register a resolution rule to run at ``step`` (lower runs first)."""
    def deco(fn):
        RULES.append(Rule(step, rule_id, fn))
        RULES.sort(key=lambda r: r.step)
        return fn
    return deco


class Resolving:
    """The live state rules read and write.  ``cfg.hicache_ratio`` reads the current value."""

    def __init__(self, values: Dict[str, Any], explicit: frozenset, env: Mapping[str, str],
                 host: Optional[Dict[str, Any]] = None):
        object.__setattr__(self, "values", dict(values))
        object.__setattr__(self, "raw", dict(values))
        object.__setattr__(self, "explicit", explicit)
        object.__setattr__(self, "env", env)
        object.__setattr__(self, "host", host or {})
        object.__setattr__(self, "log", [])
        object.__setattr__(self, "problems", [])
        object.__setattr__(self, "notes", [])
        object.__setattr__(self, "current_rule", "")

    def __getattr__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(f"no record field {name!r}") from None

    def __setattr__(self, name, value):
        raise AttributeError("resolution writes through declare(), never by assignment")

    def declare(self, *, warn: Optional[str] = None, **fields: Any) -> None:
        for k, v in fields.items():
            if k not in FIELDS:
                raise AttributeError(f"{self.current_rule}: {k!r} is not a record field")
            old = self.values[k]
            self.values[k] = v
            self.log.append((self.current_rule, k, old, v))
            if old != v:
                text = f"{FIELDS[k].key}: {old!r} -> {v!r} ({self.current_rule})"
                if warn:
                    text += f": {warn}"
                self.notes.append((logging.WARNING if warn else logging.INFO, text))

    def error(self, field: str, message: str) -> None:
        self.problems.append(problem_for(field, message, self.current_rule))

    def warn(self, message: str) -> None:
        self.notes.append((logging.WARNING, f"{message} ({self.current_rule})"))

    def info(self, message: str) -> None:
        self.notes.append((logging.INFO, f"{message} ({self.current_rule})"))

    def getenv_flag(self, name: str) -> bool:
        return str(self.env.get(name, "")).strip().lower() in ("1", "true", "yes", "on")

    # Derived helpers the rules share.
    @property
    def mode(self) -> str:
        return self.values["disaggregation_mode"]

    @property
    def backend(self) -> str:
        return self.values["disaggregation_transfer_backend"]

    def attn_dp_enabled(self) -> bool:
        return self.values["attn_dp_size"] > 1 or self.values["ep_join_mode"] == "scale"

    def use_mla(self) -> bool:
        return self.values["attention_arch"] == "mla"
