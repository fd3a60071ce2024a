"""Composition entry points (temporary minimal version; full pipeline lands next)."""
from __future__ import annotations

from typing import Any, Dict

from .record import FIELDS, finalize


def record_from_values(values: Dict[str, Any]):
    unknown = [k for k in values if k not in FIELDS]
    if unknown:
        raise KeyError(f"unknown fields {unknown}")
    merged = {n: fi.default_value() for n, fi in FIELDS.items()}
    merged.update(values)
    raw = dict(merged)
    if merged["page_size"] is None:
        merged["page_size"] = 1
    if merged["device"] is None:
        merged["device"] = "cpu"
    if merged["hicache_ratio"] is None and merged["disaggregation_mode"] != "decode":
        merged["hicache_ratio"] = 1.2 if merged["hicache_host_memory_mode"] == "buffer_only" else 2.0
    return finalize(merged, raw=raw, explicit=frozenset(values), log=())
