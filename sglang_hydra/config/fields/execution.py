"""``exec``: kernel and execution choices that decide whether caching features can run.

Declared here: the settings the memory and disaggregation rules read (attention backends,
deterministic inference, multi-item scoring, diffusion LLMs ...).  Flags, aliases and choices
of every field come from the reference schema snapshot; so do all other ``exec.*`` fields.
"""
from __future__ import annotations

from typing import Optional

from ..schema_snapshot import build_namespace
from ..spec import arg



class _ExecRules:
    attention_backend: Optional[str] = arg(None, "Attention kernels for both phases.")
    prefill_attention_backend: Optional[str] = arg(None, "Attention kernels for prefill only.")
    decode_attention_backend: Optional[str] = arg(None, "Attention kernels for decode only.")
    enable_deterministic_inference: bool = arg(False, "Make results independent of batching.")
    enable_mis: bool = arg(False, "Multi-item scoring in one forward pass (needs the radix cache off).")
    dllm_algorithm: Optional[str] = arg(None, "Diffusion LLM decoding algorithm.")
    enable_two_batch_overlap: bool = arg(False, "Overlap two micro-batches.")
    mamba_backend: str = arg("triton", "Kernels for Mamba state updates.")
    linear_attn_backend: str = arg("triton", "Kernels for linear attention.")
    linear_attn_decode_backend: Optional[str] = arg(None, "Linear-attention kernels for decode.")
    linear_attn_prefill_backend: Optional[str] = arg(None, "Linear-attention kernels for prefill.")
    moe_a2a_backend: str = arg("none", "MoE all-to-all backend.")
    ep_join_mode: Optional[str] = arg(None, "Elastic EP join mode (--elastic-ep-join-mode).")


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Exec = build_namespace("exec", _ExecRules)
