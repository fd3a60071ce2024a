"""The rule registry and the live state rules work on.

Kept apart from :mod:`.resolve` so that ``rules/<namespace>.py`` (which register here) and
``resolve`` (which imports those modules and runs the rules) do not import each other.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional

from .errors import SOURCE_TITLES, problem_for
from .record import FIELDS


@dataclass(frozen=True)
class Rule:
    step: float
    rule_id: str
    fn: Callable[["Resolving"], None]


RULES: List[Rule] = []

# Every rule code in words; a problem line shows the code in brackets followed by this.
RULE_TITLES: Dict[str, str] = {
    "model-geometry": "model geometry taken from a local checkpoint's config.json",
    "X-DP": "attention data-parallel settings",
    "M-HR": "host-memory size of the hierarchical cache",
    "X-RS": "response store versus PD disaggregation",
    "device-default": "device detection",
    "D-PD": "prefill/decode disaggregation settings",
    "X-POD": "prefill-only server without a KV cache",
    "X-NPU": "Ascend NPU defaults",
    "X-CPU": "defaults for a CPU device",
    "X-DRC": "cases that turn the radix cache off",
    "page-size-default": "default page size",
    "M-HC": "hierarchical cache (HiCache) settings",
    "D-SPEC": "speculative decoding with PD disaggregation",
    "D-ENC": "encoder disaggregation settings",
    "M-CC": "cache features that cannot be combined",
    "M-PM": "page-major KV layout",
    "M-UM": "unified memory settings",
    "X-DLLM": "diffusion language model settings",
    "D-OPT": "optimistic prefill",
    "RT-5": "the storage backend's extra config (JSON or @file)",
    "RT-8": "the hisparse config",
}


def rule_title(fn: Callable) -> str:
    """A rule's explanation: the whole first paragraph of its docstring on one line (a
    docstring's first line may end mid-sentence), else its function name in words."""
    import inspect
    paragraph = inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0]
    return " ".join(paragraph.split()).rstrip(".") or fn.__name__.replace("_", " ")


def rule(step: float, rule_id: str):
    """Register a resolution rule to run at ``step`` (lower runs first)."""
    def deco(fn):
        if rule_id not in SOURCE_TITLES:
            SOURCE_TITLES[rule_id] = RULE_TITLES.get(rule_id) or rule_title(fn)
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
            if old != v and not k.startswith("_"):   # internal bookkeeping fields stay out of the log
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
