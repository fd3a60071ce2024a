"""``exec``: kernel and execution choices that decide whether caching features can run.

Only the settings that the memory and disaggregation rules read are declared here
(attention backends, deterministic inference, multi-item scoring, diffusion LLMs ...).
"""
from __future__ import annotations

from typing import Optional

from ..schema_snapshot import build_namespace
from ..spec import arg

ATTENTION_BACKENDS = (
    "triton", "torch_native", "flex_attention", "flashinfer", "fa3", "fa4", "flashmla", "cutlass_mla",
    "trtllm_mla", "trtllm_mha", "cutedsl_mla", "aiter", "wave", "ascend", "intel_amx", "intel_xpu",
    "dual_chunk_flash_attn", "nsa",
)


class _ExecRules:
    attention_backend: Optional[str] = arg(None, "Attention kernels for both phases.", choices=ATTENTION_BACKENDS)
    prefill_attention_backend: Optional[str] = arg(None, "Attention kernels for prefill only.", choices=ATTENTION_BACKENDS)
    decode_attention_backend: Optional[str] = arg(None, "Attention kernels for decode only.", choices=ATTENTION_BACKENDS)
    enable_deterministic_inference: bool = arg(False, "Make results independent of batching.")
    enable_mis: bool = arg(False, "Multi-item scoring in one forward pass (needs the radix cache off).")
    dllm_algorithm: Optional[str] = arg(None, "Diffusion LLM decoding algorithm.")
    enable_two_batch_overlap: bool = arg(False, "Overlap two micro-batches.")
    mamba_backend: str = arg("triton", "Kernels for Mamba state updates.")
    linear_attn_backend: str = arg("triton", "Kernels for linear attention.")
    linear_attn_decode_backend: Optional[str] = arg(None, "Linear-attention kernels for decode.")
    linear_attn_prefill_backend: Optional[str] = arg(None, "Linear-attention kernels for prefill.")
    moe_a2a_backend: str = arg("none", "MoE all-to-all backend.",
                               choices=("none", "deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer"))
    ep_join_mode: Optional[str] = arg(None, "Elastic EP join mode.", choices=("scale", "recover"))


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Exec = build_namespace("exec", _ExecRules)
