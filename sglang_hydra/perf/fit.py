"""Fit the pass-time model's per-class efficiencies to kernel timings (pure Python).

``job=calibrate`` times GEMMs, prefill attention and decode attention on a lent GPU and
fits each class's free factors here.  The three cost functions below are exactly the ones
:class:`~sglang_hydra.perf.pass_time.PassModel` evaluates for one kernel (tests/perf checks
they agree to the last bit on every GEMM of a model); ``scripts/fit_pass_model.py`` fits the
same formulas to aiconfigurator's measured tables with numpy.  Every fit minimises the squared
log error, so a 10 % miss costs the same on a 10 us kernel as on a 10 ms one.

Physical ranges: an efficiency is a share of a datasheet peak and is kept strictly below its
bound (:data:`EFFICIENCY_MAX`), and a coefficient the data do not support is not left at a
vanishing value (1e-19 means "no such term" but reads like a measurement): a term whose
removal costs less than :data:`NEGLIGIBLE_RMS` of rms log error is dropped (exactly 0) and the
rest refitted (:func:`fit_dropping_negligible`).
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence, Tuple

__all__ = ["gemm_s", "prefill_attention_s", "decode_attention_s", "fit_gemm", "fit_prefill_attention",
           "fit_decode_attention", "minimise", "fit_dropping_negligible", "EFFICIENCY_MAX", "NEGLIGIBLE_RMS"]

US = 1e-6
ACT_BYTES = 2.0          # activations are bf16 (PassModel's ACT_BYTES)
#: the highest share of a datasheet peak a fitted efficiency may take: compute peaks (GEMM,
#: prefill attention) 0.95; HBM reads 0.92 (no streaming kernel reaches more of the datasheet
#: bandwidth on H100/H200/A100-class HBM: measured copy rates stay near 0.9 of it)
EFFICIENCY_MAX = {"compute": 0.95, "memory": 0.92}
#: a term is kept only if dropping it raises the fit's rms log error by at least this much
NEGLIGIBLE_RMS = 0.002


def gemm_s(m: int, n: int, k: int, peak: float, bw: float, itemsize: float,
           eff: float, half: float, mem_eff: float, floor_us: float,
           half_outputs: float = 0.0, k_overhead: float = 0.0) -> float:
    """One ``[m, k] x [k, n]`` GEMM as PassModel costs it: the longest of compute
    (``2nk (m + half + half_outputs / n) (1 + k_overhead / k)`` FLOPs at ``peak * eff``), memory
    traffic (weights plus bf16 activations at ``bw * mem_eff``) and the kernel floor."""
    compute = 2.0 * k * n * (1.0 + k_overhead / k) / (peak * eff) * (m + (half + half_outputs / n))
    memory = itemsize * k * n / (bw * mem_eff) + ACT_BYTES * (k + n) / (bw * mem_eff) * m
    return max(compute, memory, floor_us * US)


def prefill_attention_s(seqs: int, seq_len: int, heads: int, head_dim: int, peak: float,
                        eff: float, extra_pairs: float, floor_us: float) -> float:
    """Causal self-attention of ``seqs`` sequences of ``seq_len`` tokens (QK and PV products),
    one layer, as PassModel costs the kernel (its per-layer ``attention_prefill_layer_us`` is not
    a kernel's: scripts/refine_pass_model.py fits it end to end)."""
    pairs = seqs * seq_len * (seq_len + 1) / 2.0
    return max((pairs + extra_pairs * seqs * seq_len) * heads * 4.0 * head_dim / (peak * eff), floor_us * US)


def decode_attention_s(seqs: int, kv_tokens: int, kv_bytes_per_token: float, bw: float,
                       eff: float, seq_us: float, floor_us: float, half_ctas: float = 0.0, kv_heads: int = 1,
                       layer_us: float = 0.0, split_below: float = 0.0, split_ctas: float = 0.0) -> float:
    """One layer's decode attention as PassModel costs it: read every sequence's KV at ``bw * eff``,
    slower while few blocks (sequences x KV heads) occupy the GPU (``1 + half_ctas / blocks``; a
    batch of fewer than ``split_below`` blocks is split along the context and occupies the GPU like
    ``split_ctas`` blocks), plus ``seq_us`` per sequence and ``layer_us``, never below the floor."""
    blocks = seqs * kv_heads
    occ = split_ctas if (split_ctas > 0 and blocks < split_below) else blocks
    read = kv_tokens * kv_bytes_per_token / (bw * eff) * (1.0 + half_ctas / occ)
    return max(read + seqs * seq_us * US + layer_us * US, floor_us * US)


def minimise(loss: Callable[[List[float]], float], x0: Sequence[float], steps: int = 600) -> List[float]:
    """Nelder-Mead on ``loss`` (a handful of parameters; no numpy needed)."""
    n = len(x0)
    simplex = [list(x0)]
    for i in range(n):
        x = list(x0)
        x[i] = x[i] + (0.5 if x[i] == 0 else 0.25 * abs(x[i]))
        simplex.append(x)
    values = [loss(x) for x in simplex]
    for _ in range(steps):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        centroid = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        refl = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = loss(refl)
        if fr < values[0]:
            exp = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = loss(exp)
            simplex[-1], values[-1] = (exp, fe) if fe < fr else (refl, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = refl, fr
        else:
            con = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = loss(con)
            if fc < values[-1]:
                simplex[-1], values[-1] = con, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, xs)] for xs in simplex[1:]]
                values = [values[0]] + [loss(x) for x in simplex[1:]]
        if max(values) - min(values) < 1e-12:
            break
    return simplex[min(range(n + 1), key=values.__getitem__)]


def _squash(x: float, lo: float, hi: float) -> float:
    """An unconstrained number mapped into (lo, hi) (keeps efficiencies below their bound)."""
    return lo + (hi - lo) / (1.0 + math.exp(-max(-700.0, min(700.0, x))))


def _unsquash(v: float, lo: float, hi: float) -> float:
    v = min(max(v, lo + 1e-9 * (hi - lo)), hi - 1e-9 * (hi - lo))
    return -math.log((hi - lo) / (v - lo) - 1.0)


def _rms(errors: List[float]) -> float:
    return math.sqrt(sum(e * e for e in errors) / max(1, len(errors)))


def _fit_bounded(errs: Callable[[Dict[str, float]], List[float]], start: Dict[str, float],
                 bounds: Dict[str, Tuple[float, float]], fixed: Dict[str, float]) -> Tuple[Dict[str, float], float]:
    names = [n for n in start if n not in fixed]

    def params(x):
        out = dict(fixed)
        out.update({n: _squash(v, *bounds[n]) for n, v in zip(names, x)})
        return out

    x = minimise(lambda x: sum(e * e for e in errs(params(x))), [_unsquash(start[n], *bounds[n]) for n in names])
    x = minimise(lambda x: sum(e * e for e in errs(params(x))), x)      # a restart escapes a collapsed simplex
    p = params(x)
    return {n: p[n] for n in start}, _rms(errs(p))


def fit_dropping_negligible(errs: Callable[[Dict[str, float]], List[float]], start: Dict[str, float],
                            bounds: Dict[str, Tuple[float, float]], optional: Sequence[str] = ()
                            ) -> Tuple[Dict[str, float], float, List[str]]:
    """Fit ``start``'s factors within ``bounds`` (squared log error of ``errs``), then drop each
    ``optional`` term (fix it at exactly 0) whose removal raises the rms by less than
    :data:`NEGLIGIBLE_RMS`.  Returns the factors, the rms and the dropped names."""
    fixed: Dict[str, float] = {}
    p, rms = _fit_bounded(errs, start, bounds, fixed)
    dropped: List[str] = []
    for name in optional:
        trial_fixed = dict(fixed, **{name: 0.0})
        q, r = _fit_bounded(errs, dict(p), bounds, trial_fixed)
        if r - rms < NEGLIGIBLE_RMS:
            fixed, p, rms = trial_fixed, q, r
            dropped.append(name)
    return p, rms, dropped


def fit_gemm(samples: Sequence[Tuple[int, int, int, float]], peak: float, bw: float, itemsize: float
             ) -> Tuple[Dict[str, float], float]:
    """``samples``: (m, n, k, seconds).  Returns PassModel's six GEMM factors and the rms log error."""
    bounds = {"gemm_efficiency": (0.02, EFFICIENCY_MAX["compute"]), "gemm_half_tokens": (0.0, 4096.0),
              "memory_efficiency": (0.02, EFFICIENCY_MAX["memory"]), "kernel_floor_us": (0.0, 200.0),
              "gemm_half_outputs": (0.0, 1e6), "gemm_k_overhead": (0.0, 1e4)}
    start = {"gemm_efficiency": 0.6, "gemm_half_tokens": 64.0, "memory_efficiency": 0.7, "kernel_floor_us": 5.0,
             "gemm_half_outputs": 1e4, "gemm_k_overhead": 50.0}

    def errs(p):
        return [math.log(gemm_s(m, n, k, peak, bw, itemsize, p["gemm_efficiency"], p["gemm_half_tokens"],
                                p["memory_efficiency"], p["kernel_floor_us"], p["gemm_half_outputs"],
                                p["gemm_k_overhead"]) / s) for m, n, k, s in samples]

    p, rms, _ = fit_dropping_negligible(errs, start, bounds,
                                        ("gemm_half_outputs", "gemm_k_overhead", "gemm_half_tokens"))
    return p, rms


def fit_prefill_attention(samples: Sequence[Tuple[int, int, int, int, float]], peak: float, floor_us: float
                          ) -> Tuple[Dict[str, float], float]:
    """``samples``: (seqs, seq_len, heads, head_dim, seconds)."""
    bounds = {"attention_prefill_efficiency": (0.02, EFFICIENCY_MAX["compute"]),
              "attention_prefill_extra_pairs": (0.0, 8192.0)}

    def errs(p):
        return [math.log(prefill_attention_s(b, s, h, d, peak, p["attention_prefill_efficiency"],
                                             p["attention_prefill_extra_pairs"], floor_us) / t)
                for b, s, h, d, t in samples]

    p, rms, _ = fit_dropping_negligible(errs, {"attention_prefill_efficiency": 0.5,
                                               "attention_prefill_extra_pairs": 100.0},
                                        bounds, ("attention_prefill_extra_pairs",))
    return p, rms


def fit_decode_attention(samples: Sequence[Tuple[int, int, float, float]], bw: float, floor_us: float,
                         kv_heads: int = 1) -> Tuple[Dict[str, float], float]:
    """``samples``: (seqs, total KV tokens, KV bytes per token, seconds) of one layer's decode
    attention.  Fits efficiency, per-sequence, occupancy and per-layer terms (the split-KV
    occupancy of small batches needs more shapes than a calibration runs: not fitted here)."""
    bounds = {"attention_decode_efficiency": (0.02, EFFICIENCY_MAX["memory"]),
              "attention_decode_seq_us": (0.0, 100.0), "attention_decode_half_ctas": (0.0, 4096.0),
              "attention_decode_layer_us": (0.0, 500.0)}
    start = {"attention_decode_efficiency": 0.6, "attention_decode_seq_us": 0.1,
             "attention_decode_half_ctas": 8.0, "attention_decode_layer_us": 5.0}

    def errs(p):
        return [math.log(decode_attention_s(b, kv, kvb, bw, p["attention_decode_efficiency"],
                                            p["attention_decode_seq_us"], floor_us,
                                            p["attention_decode_half_ctas"], kv_heads,
                                            p["attention_decode_layer_us"]) / t)
                for b, kv, kvb, t in samples]

    p, rms, _ = fit_dropping_negligible(errs, start, bounds, ("attention_decode_seq_us", "attention_decode_half_ctas",
                                                              "attention_decode_layer_us"))
    return p, rms
