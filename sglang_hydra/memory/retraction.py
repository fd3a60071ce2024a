"""Where a decode server keeps the KV of requests it retracts (RT-1).

A PD decode server that runs out of device pages retracts requests and must keep their KV
somewhere to resume them: in plain CPU tensors (``cpu_tensor``) or in a host KV pool
(``host_pool``), which is faster to load back but only works for some pool kinds.  The
choice depends on the device pool that gets built, so it is made with the memory plan,
not when the record is resolved; the record keeps what the user asked for.

The host-pool ratio of a decode server is settled here too: the record leaves
``hicache_ratio`` unset for decode servers (M-HR2).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .geometry import KVGeometry

#: host pool size, as a share of the device pool, when it only backs up retracted requests
BACKUP_ONLY_RATIO = 0.2
DEFAULT_RATIO = 2.0


@dataclass(frozen=True)
class RetractionChoice:
    backend: Optional[str]     # None when the server is not a PD decode server
    reason: str


def choose_backup(record: Any, geo: KVGeometry) -> RetractionChoice:
    """The retraction backup backend for ``record`` (an explicit value is kept)."""
    explicit = getattr(record, "disaggregation_decode_retraction_backup", None)
    if explicit is not None:
        return RetractionChoice(explicit, "set explicitly")
    if getattr(record, "disaggregation_mode", "null") != "decode":
        return RetractionChoice(None, "not a decode server")
    blockers = []
    if str(getattr(record, "device", "")).startswith("hip"):
        blockers.append("ROCm device")
    if (getattr(record, "dcp_size", 1) or 1) > 1:
        blockers.append("decode context parallelism")
    if getattr(record, "disaggregation_decode_enable_radix_cache", False):
        blockers.append("decode radix cache")
    if getattr(record, "disaggregation_decode_enable_offload_kvcache", False):
        blockers.append("decode KV offload")
    if getattr(record, "enable_priority_scheduling", False) and not getattr(record, "disable_priority_preemption", False):
        blockers.append("priority preemption")
    unified = getattr(record, "enable_unified_memory", False)
    hybrid = getattr(record, "hybrid", None)
    spec = (getattr(record, "speculative_algorithm", None) or "").upper()
    if unified and spec and spec != "DSPARK":
        blockers.append("unified memory with draft pools")
    if unified and hybrid == "swa":
        blockers.append("unified memory with sliding-window layers")
    if hybrid == "mamba":
        blockers.append("recurrent (SSM) state")
    if geo.is_mla:
        blockers.append("MLA pool (only MHA pools have a host mirror for retraction)")
    if blockers:
        return RetractionChoice("cpu_tensor", "host_pool unavailable: " + ", ".join(blockers))
    return RetractionChoice("host_pool", "decode server whose MHA pool can be mirrored on the host")


def decode_host_ratio(record: Any, backend: Optional[str], device_tokens: int, page_size: int,
                      max_context_len: int) -> tuple:
    """(ratio, why) for a decode server whose ``hicache_ratio`` is still unset.

    A backup-only host pool is small (0.2 of the device pool) but must still hold one
    longest request, twice when decode buffers incoming KV on the host (threshold < 1).
    """
    hicache = bool(getattr(record, "enable_hierarchical_cache", False))
    if backend != "host_pool" or hicache:
        return DEFAULT_RATIO, f"decode default {DEFAULT_RATIO:g}"
    ratio = BACKUP_ONLY_RATIO
    why = f"backup-only host pool {BACKUP_ONLY_RATIO:g}"
    if not getattr(record, "hicache_size", 0) and device_tokens > 0:
        longest = min(max(max_context_len - 1, 1), device_tokens)
        min_tokens = -(-longest // page_size) * page_size
        if float(getattr(record, "disaggregation_decode_host_receive_threshold", 1.0)) < 1:
            min_tokens *= 2
        floor = min_tokens / device_tokens
        if floor > ratio:
            ratio = floor
            why += f", raised to {floor:.3f} so {min_tokens:,} tokens (one longest request) fit"
    return ratio, why


__all__ = ["RetractionChoice", "choose_backup", "decode_host_ratio", "BACKUP_ONLY_RATIO", "DEFAULT_RATIO"]
