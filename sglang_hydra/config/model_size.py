"""How many parameters a checkpoint has, estimated from its ``config.json`` alone.

A plan for a target GPU subtracts the weights from the device memory before sizing the
KV pool, so it needs ``model.num_parameters``.  Presets state it; for a local checkpoint
directory it is counted here from the shapes in ``config.json`` (nothing is downloaded and
no weight file is opened).  Only dense decoder models of the Llama/Qwen/Mistral family are
counted: for mixtures of experts, MLA or anything unrecognised the answer is None and the
user states ``model.num_parameters`` instead of getting a wrong number.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

# config.json keys whose presence means the simple dense count would be wrong.
_NOT_DENSE = ("num_local_experts", "n_routed_experts", "num_experts", "moe_intermediate_size",
              "kv_lora_rank", "q_lora_rank")


def estimate_num_parameters(hf: Dict[str, Any]) -> Optional[int]:
    """Parameters of a dense decoder from its config, or None when it cannot be counted.

    embeddings (vocab x hidden, twice unless tied) + per layer: q/o projections
    (hidden x heads*head_dim each), k/v projections (hidden x kv_heads*head_dim each, plus
    biases when ``attention_bias`` or Qwen2), a gated MLP (3 x hidden x intermediate) and two
    norms; plus the final norm.
    """
    if not isinstance(hf, dict) or any(hf.get(k) for k in _NOT_DENSE):
        return None
    try:
        hidden = int(hf["hidden_size"])
        layers = int(hf["num_hidden_layers"])
        heads = int(hf["num_attention_heads"])
        inter = int(hf["intermediate_size"])
        vocab = int(hf["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    head_dim = int(hf.get("head_dim") or hidden // heads)
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    attn = hidden * q_out * 2 + hidden * kv_out * 2
    if hf.get("attention_bias") or hf.get("model_type") == "qwen2":
        attn += q_out + 2 * kv_out
    per_layer = attn + 3 * hidden * inter + 2 * hidden
    embed = vocab * hidden * (1 if hf.get("tie_word_embeddings") else 2)
    return embed + layers * per_layer + hidden


__all__ = ["estimate_num_parameters"]
