"""Helpers for tests of later stages: a resolved record from plain keyword fields."""
from __future__ import annotations

from typing import Any


def make_record(**fields: Any):
    """A resolved ``ServerArgs`` with ``fields`` set explicitly (flat field names).

    Goes through the same resolution as the CLI, so tests of memory/cache/disagg see the
    values a user would get (page_size defaulted, device detected, rules applied).
    """
    from .compose import record_from_values

    return record_from_values(fields)
