"""A seeded grid of static-batch points for the pass-model differential against aiconfigurator.

Pure Python (no aiconfigurator import): the CI test, ``scripts/fit_pass_model.py`` and
``scripts/bench_pass_model.py`` draw the same points from the same seed.  Every point says
which of the two figures it checks (``want``: ``ttft_ms`` from ``static_ctx`` or ``tpot_ms``
from ``static_gen``), so each costs one aiconfigurator call.

Ranges (issue 18): H100, H200, A100, L40S; Llama-3.1 8B/70B and Qwen3 8B/32B; ISL 512-32k;
prefix 0-75 % of the prompt; decode batch 1-256; TP 1/2/4/8 where the model fits (weights
plus the batch's KV within 85 % of the GPU's memory).
"""
from __future__ import annotations

import math
import random
from typing import Dict, List

#: our hardware preset -> (aiconfigurator system, GPU memory GB)
SYSTEMS = {"h100_80gb": ("h100_sxm", 80.0), "h200_141gb": ("h200_sxm", 141.0),
           "a100_80gb": ("a100_sxm", 80.0), "l40s_48gb": ("l40s", 48.0)}
#: our model preset -> (Hugging Face id, parameters, KV bytes per token (bf16, all layers), context)
MODELS = {
    "llama3_1_8b": ("meta-llama/Meta-Llama-3.1-8B", 8.03e9, 32 * 2 * 8 * 128 * 2, 131072),
    "llama3_1_70b": ("meta-llama/Meta-Llama-3.1-70B", 70.55e9, 80 * 2 * 8 * 128 * 2, 131072),
    "qwen3_8b": ("Qwen/Qwen3-8B", 8.19e9, 36 * 2 * 8 * 128 * 2, 40960),
    "qwen3_32b": ("Qwen/Qwen3-32B", 32.76e9, 64 * 2 * 8 * 128 * 2, 40960),
}
TPS = (1, 2, 4, 8)


def _fits(model: str, hw: str, tp: int, batch: int, tokens: int) -> bool:
    _id, params, kv, _ctx = MODELS[model]
    mem = SYSTEMS[hw][1] * 1e9
    kv_per_gpu = kv / min(tp, 8)      # 8 KV heads: split up to TP 8
    return params * 2 / tp + batch * tokens * kv_per_gpu <= 0.85 * mem


def _log_uniform_int(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def grid(seed: int, n: int) -> List[Dict]:
    """``n`` points drawn with ``seed`` (alternating TTFT and TPOT points)."""
    rng = random.Random(seed)
    points: List[Dict] = []
    tries = 0
    while len(points) < n:
        tries += 1
        if tries > 100 * n:
            raise RuntimeError("cannot draw enough points that fit")
        want = "ttft_ms" if len(points) % 2 == 0 else "tpot_ms"
        hw = rng.choice(sorted(SYSTEMS))
        model = rng.choice(sorted(MODELS))
        tp = rng.choice(TPS)
        isl = _log_uniform_int(rng, 512, 32768) // 64 * 64
        prefix = int(isl * rng.uniform(0.0, 0.75)) // 64 * 64 if rng.random() < 0.7 else 0
        if want == "ttft_ms":
            batch = rng.choice([1, 1, 1, 2, 4, 8])
            while batch > 1 and batch * (isl - prefix) > 65536:
                batch //= 2
            osl = 2
        else:
            batch = _log_uniform_int(rng, 1, 256)
            osl = rng.choice([64, 128, 256, 512, 1024])
        if isl + osl > MODELS[model][3] or not _fits(model, hw, tp, batch, isl + osl):
            continue
        points.append(dict(hardware=hw, system=SYSTEMS[hw][0], preset=model, model=MODELS[model][0],
                           tp=tp, isl=isl, osl=osl, batch_size=batch, prefix=prefix, want=[want]))
    return points


__all__ = ["grid", "SYSTEMS", "MODELS"]
