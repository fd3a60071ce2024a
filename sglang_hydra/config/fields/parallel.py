"""``parallel``: how the model is split over devices; the KV pool holds one rank's share.

Flags and aliases (``--tp``/``--tensor-parallel-size`` ...) come from the reference schema."""
from __future__ import annotations

from typing import Optional

from ..schema_snapshot import build_namespace
from ..spec import arg


class _ParallelRules:
    tp_size: int = arg(1, "Tensor parallel degree.", ge=1)
    pp_size: int = arg(1, "Pipeline parallel degree.", ge=1)
    dp_size: int = arg(1, "Data parallel degree.", ge=1)
    attn_dp_size: int = arg(1, "Data parallel degree of attention.", ge=1)
    attn_cp_size: int = arg(1, "Context parallel degree of attention.", ge=1)
    dcp_size: int = arg(1, "Decode context parallel degree.", ge=1)
    ep_size: int = arg(1, "Expert parallel degree.", ge=1)
    enable_dp_attention: bool = arg(
        False, "Deprecated switch for attention data parallelism. As input, true folds --dp-size into "
        "--attn-dp-size (when that is 1); the resolved record reports whether attention DP runs "
        "(attn_dp_size > 1), as the engine's resolved config does, so a printed record reads back the same.")
    enable_dp_attention_local_control_broadcast: bool = arg(
        False, "Broadcast DP-attention control messages locally.")
    nnodes: int = arg(1, "Number of nodes the server spans.", ge=1)
    dist_init_addr: Optional[str] = arg(None, "Address for distributed initialisation.")
    enable_prefill_cp: bool = arg(False, "Context parallelism for prefill.")
    enable_kv_cache_sharding: bool = arg(False, "Shard the KV cache over prefill ranks.")


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Parallel = build_namespace("parallel", _ParallelRules)
