"""``schedule``: how many tokens and requests the device pool holds, and in what pages."""
from __future__ import annotations

from typing import Optional

from ..schema_snapshot import build_namespace
from ..spec import arg


class _ScheduleRules:
    page_size: Optional[int] = arg(
        None, "Tokens per KV page, the unit of allocation, matching and eviction. Unset: 1.",
        resolvable=True, ge=1)
    mem_fraction_static: Optional[float] = arg(
        None, "Share of device memory for weights and the KV pool. Unset: a size-based default.",
        gt=0.0, le=1.0)
    max_total_tokens: Optional[int] = arg(
        None, "Upper bound on the device KV pool, in tokens.", ge=1)
    max_running_requests: Optional[int] = arg(None, "Most requests running at once.", ge=1)
    chunked_prefill_size: Optional[int] = arg(
        None, "Largest prefill chunk in tokens; -1 disables chunking.")
    max_prefill_tokens: int = arg(16384, "Token budget of one prefill batch.", ge=1)
    enable_priority_scheduling: bool = arg(False, "Schedule requests by their priority field.")
    disable_priority_preemption: bool = arg(
        False, "With priority scheduling, never preempt a running request for a higher-priority one.")
    prefill_only_disable_kv_cache: bool = arg(
        False, "Prefill-only serving that never keeps KV after the request.")
    enable_mixed_chunk: bool = arg(False, "Mix prefill chunks and decode steps in one batch.")
    disable_overlap_schedule: bool = arg(False, "Run the scheduler and the model one after the other.", resolvable=True)
    swa_full_tokens_ratio: Optional[float] = arg(
        None, "Sliding-window pool size relative to the full-attention pool (hybrid models); unset: 0.8.",
        resolvable=True)
    _swa_full_tokens_ratio_explicitly_set: Optional[bool] = arg(
        None, "Whether the sliding-window ratio was given explicitly.", no_cli=True)
    swa_prefix_tails: Optional[int] = arg(None, "Sliding-window prefix tails kept per request.")


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Schedule = build_namespace("schedule", _ScheduleRules)
