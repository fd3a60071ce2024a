"""``model``: what is served, as far as KV memory is concerned.

Besides the reference engine's model flags this namespace carries the KV geometry of the
model (layers, KV heads, head dims, MHA or MLA).  The reference reads that geometry from
the checkpoint; here it comes from a preset (``model=tiny``, ``model=llama3_8b`` ...) or
from a local ``config.json`` when ``model_path`` is a directory.  Geometry fields have no
legacy flag because the reference engine has none.
"""
from __future__ import annotations

from typing import Optional

from ..schema_snapshot import build_namespace
from ..spec import arg


class _ModelRules:
    model_path: str = arg(
        "tiny", "Checkpoint directory (its config.json supplies the KV geometry) or a preset name.",
        )
    kv_cache_dtype: str = arg(
        "auto", "Element type of the KV cache; 'auto' follows --dtype.", resolvable=True)
    dtype: str = arg(
        "auto", "Activation and weight type; 'auto' means bfloat16 here.")
    context_length: Optional[int] = arg(
        None, "Longest sequence a request may reach; unset: the model's own limit.", ge=1)
    is_embedding: bool = arg(False, "Serve an embedding model (no decoding).")
    # --- KV geometry (no legacy flags) ---
    architecture: str = arg("LlamaForCausalLM", "Architecture name, as in config.json.", hydra_only=True)
    attention_arch: str = arg(
        "mha", "mha: per-layer K and V buffers; mla: one latent buffer per layer.",
        choices=("mha", "mla"), hydra_only=True)
    num_hidden_layers: int = arg(2, "Transformer layers holding KV.", hydra_only=True, ge=1)
    num_key_value_heads: int = arg(2, "KV heads of the whole model (split over TP ranks).", hydra_only=True, ge=1)
    head_dim: int = arg(16, "Dimension of one K head.", hydra_only=True, ge=1)
    v_head_dim: Optional[int] = arg(None, "Dimension of one V head; unset: same as head_dim.", hydra_only=True, ge=1)
    kv_lora_rank: int = arg(0, "MLA latent (compressed KV) width.", hydra_only=True, ge=0)
    qk_rope_head_dim: int = arg(0, "MLA rotary part stored beside the latent.", hydra_only=True, ge=0)
    hybrid: str = arg(
        "none", "Hybrid layer mix: sliding-window layers beside full attention (swa), only "
        "sliding-window layers (pure_swa), or state-space layers (mamba).",
        choices=("none", "swa", "pure_swa", "mamba"), hydra_only=True)
    model_type: str = arg("llama", "HF model_type, as in config.json.", hydra_only=True)
    max_position_embeddings: int = arg(4096, "The model's own context limit.", hydra_only=True, ge=1)
    # --- size (no legacy flags): what a plan for a target GPU subtracts as weights, and what
    # compute estimates need.  From the preset, or config.json for a checkpoint directory.
    # Defaults are model=tiny's (the default preset equals the field defaults); a checkpoint
    # directory replaces them, with None where its config.json cannot say.
    num_parameters: Optional[int] = arg(
        4219200, "Parameters of the whole model (all experts); with dtype it gives the weight bytes "
        "a target GPU holds before the KV pool. null: unknown (plans for a GPU then stop and ask for it).",
        hydra_only=True, ge=1)
    hidden_size: Optional[int] = arg(64, "Width of the residual stream (config.json hidden_size).",
                                     hydra_only=True, ge=1)
    num_attention_heads: Optional[int] = arg(4, "Query heads of the whole model (config.json "
                                             "num_attention_heads).", hydra_only=True, ge=1)
    # --- shapes the pass-time model (sglang_hydra.perf) costs; config.json names in brackets.
    # Defaults are model=tiny's; a checkpoint directory replaces them (None where it cannot say).
    intermediate_size: Optional[int] = arg(256, "Width of a dense layer's MLP (config.json intermediate_size).",
                                           hydra_only=True, ge=1)
    vocab_size: Optional[int] = arg(32000, "Vocabulary size: the width of the LM head (config.json vocab_size).",
                                    hydra_only=True, ge=1)
    num_experts: int = arg(0, "Routed experts per MoE layer; 0: a dense model (config.json n_routed_experts "
                           "or num_experts).", hydra_only=True, ge=0)
    num_experts_per_tok: int = arg(0, "Routed experts each token runs through (config.json "
                                   "num_experts_per_tok).", hydra_only=True, ge=0)
    moe_intermediate_size: Optional[int] = arg(None, "MLP width of one expert (config.json "
                                               "moe_intermediate_size).", hydra_only=True, ge=1)
    num_shared_experts: int = arg(0, "Experts every token runs through beside the routed ones (config.json "
                                  "n_shared_experts).", hydra_only=True, ge=0)
    first_dense_layers: int = arg(0, "Leading layers with a dense MLP instead of experts (config.json "
                                  "first_k_dense_replace).", hydra_only=True, ge=0)
    q_lora_rank: int = arg(0, "MLA: width of the compressed query; 0: queries are projected directly "
                           "(config.json q_lora_rank).", hydra_only=True, ge=0)


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Model = build_namespace("model", _ModelRules)
