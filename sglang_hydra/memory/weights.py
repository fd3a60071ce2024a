"""Model weight bytes, for plans that size the KV pool on a GPU the weights also occupy.

The reference engine measures free GPU memory after loading the weights; a plan for a
machine we are not on has to subtract them instead.  Pure Python (no torch).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

#: bytes per stored weight element; 4-bit formats pack two values per byte
WEIGHT_ITEMSIZE = {
    "float32": 4.0, "fp32": 4.0, "float": 4.0,
    "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "half": 2.0, "auto": 2.0,
    "fp8": 1.0, "float8_e4m3fn": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "int8": 1.0, "w8a8_int8": 1.0,
    "int4": 0.5, "fp4": 0.5, "nvfp4": 0.5, "mxfp4": 0.5, "awq": 0.5, "gptq": 0.5,
}

#: presets whose public checkpoint ships quantized weights (the model card's format)
PRESET_WEIGHT_DTYPE = {
    "deepseek-ai/DeepSeek-V3": "fp8",   # released in FP8 (block-wise scales); model=deepseek_v3
}


def weight_bytes(num_parameters: int, dtype: str = "bfloat16") -> int:
    """Bytes of ``num_parameters`` weights stored as ``dtype`` (bf16 2 B, fp8 1 B, fp4 0.5 B)."""
    key = str(dtype or "auto").lower()
    if key not in WEIGHT_ITEMSIZE:
        raise ValueError(f"unknown weight dtype {dtype!r}; known: {', '.join(sorted(WEIGHT_ITEMSIZE))}")
    return int(round(int(num_parameters) * WEIGHT_ITEMSIZE[key]))


def weight_dtype(record: Any) -> tuple:
    """(dtype name, why) the weights are stored in on the GPU.

    The model ``dtype`` unless the checkpoint is quantized: a local ``config.json`` with a
    ``quantization_config``, or a preset whose public checkpoint is (DeepSeek-V3: fp8).
    """
    path = str(getattr(record, "model_path", "") or "")
    cj = Path(path) / "config.json"
    if cj.is_file():
        try:
            qc = json.loads(cj.read_text(encoding="utf-8")).get("quantization_config") or {}
        except (OSError, ValueError, AttributeError):
            qc = {}
        method = str(qc.get("quant_method") or "").lower()
        if method in ("fp8", "fbgemm_fp8"):
            return "fp8", f"config.json quantization_config {method}"
        if method in ("awq", "gptq", "mxfp4", "nvfp4") or qc.get("bits") == 4:
            return "int4", f"config.json quantization_config {method or '4-bit'}"
    if path in PRESET_WEIGHT_DTYPE:
        return PRESET_WEIGHT_DTYPE[path], f"the {path} checkpoint ships {PRESET_WEIGHT_DTYPE[path]} weights"
    dt = str(getattr(record, "dtype", "auto") or "auto").lower()
    name = "bfloat16" if dt == "auto" else dt
    return name, f"model dtype {dt}" + (" (bfloat16)" if dt == "auto" else "")


@dataclass(frozen=True)
class RankWeights:
    bytes: Optional[int]      # None: the model's size is unknown
    total_bytes: Optional[int]
    dtype: str
    reason: str


def weights_per_rank(record: Any) -> RankWeights:
    """Weight bytes one GPU holds: the whole model split evenly over tp x pp ranks.

    An approximation (embeddings and norms are in fact replicated or unevenly split); it is
    what the plan subtracts from each GPU before the KV pool.
    """
    dtype, why = weight_dtype(record)
    n = getattr(record, "num_parameters", None)
    if not n:
        return RankWeights(None, None, dtype, "model.num_parameters is unknown")
    total = weight_bytes(n, dtype)
    ranks = max(1, int(getattr(record, "tp_size", 1) or 1)) * max(1, int(getattr(record, "pp_size", 1) or 1))
    per = -(-total // ranks)
    reason = f"{n / 1e9:.2f}B parameters x {WEIGHT_ITEMSIZE[dtype]:g} B ({why})"
    if ranks > 1:
        reason += f" / {ranks} ranks (tp x pp)"
    return RankWeights(per, total, dtype, reason)


__all__ = ["weight_bytes", "weight_dtype", "weights_per_rank", "RankWeights", "WEIGHT_ITEMSIZE",
           "PRESET_WEIGHT_DTYPE"]
