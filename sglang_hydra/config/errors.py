"""One error type for everything a user can get wrong.

A :class:`ConfigError` carries *all* problems found in one command, each naming the Hydra
key, the reference engine's flag, and what went wrong, so the CLI can print them together
and exit with status 2 instead of a traceback.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence


@dataclass(frozen=True)
class Problem:
    key: str                 # dotted key, e.g. "memory.hicache_ratio" ("" when not about one field)
    flag: Optional[str]      # legacy flag, e.g. "--hicache-ratio" (None when the field has none)
    message: str             # what is wrong and what is allowed
    source: str = ""         # where the value came from (override, flag, file, preset, rule id)

    def __str__(self) -> str:
        if self.key:
            where = f"{self.key} ({self.flag})" if self.flag else self.key
        else:   # about a flag that names no field (unknown, misspelt), or the command as a whole
            where = self.flag or "config"
        src = f" [{describe_source(self.source)}]" if self.source and self.source != self.flag else ""
        return f"{where}: {self.message}{src}"


# What the short source codes in a problem line mean, in words.  Resolution rules add their
# own codes here when they register (see resolve.RULE_TITLES).
SOURCE_TITLES: Dict[str, str] = {
    "override": "a command-line override",
    "preset": "a preset from conf/",
    "hydra": "Hydra's composition",
    "job": "the job selection",
    "setup": "found while setting up the memory",
    "trace": "found while reading the trace",
    "replay": "found while replaying",
    "python": "a value given from Python",
    "environment": "an environment variable",
}


def describe_source(source: str) -> str:
    """``CODE: what it means`` for a known code, else the source unchanged."""
    title = SOURCE_TITLES.get(source)
    return f"{source}: {title}" if title else source


class ConfigError(ValueError):
    """All problems of one command. Iterate it, or read ``.problems``."""

    def __init__(self, problems: Iterable[Problem]):
        self.problems: List[Problem] = list(problems)
        super().__init__(self.render())

    # The first problem's fields, for callers that expect a single error.
    @property
    def key(self) -> str:
        return self.problems[0].key if self.problems else ""

    @property
    def flag(self) -> Optional[str]:
        return self.problems[0].flag if self.problems else None

    @property
    def message(self) -> str:
        return self.problems[0].message if self.problems else ""

    def __iter__(self):
        return iter(self.problems)

    def __len__(self) -> int:
        return len(self.problems)

    def render(self) -> str:
        n = len(self.problems)
        head = f"{n} configuration problem{'s' if n != 1 else ''}:"
        return "\n".join([head] + [f"  - {p}" for p in self.problems])


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``; did you mean 'x'?`` for the closest candidate, or "" when none is close: the tail
    of an "unknown key/preset/setting" message."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def problem_for(name: str, message: str, source: str = "") -> Problem:
    """A problem about record field ``name`` with its key and flag filled in."""
    from .record import FIELDS
    from .spec import primary_flag

    fi = FIELDS.get(name)
    if fi is None:
        return Problem(name, None, message, source)
    flag = None if (fi.arg.no_cli or fi.arg.hydra_only) else primary_flag(name, fi.arg)
    return Problem(fi.key, flag, message, source)


def raise_if(problems: Sequence[Problem]) -> None:
    if problems:
        raise ConfigError(problems)
