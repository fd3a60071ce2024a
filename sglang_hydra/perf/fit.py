"""Fit the pass-time model's per-class efficiencies to kernel timings (pure Python).

``job=calibrate`` times GEMMs, prefill attention and decode attention on a lent GPU and
fits each class's free factors here, with the same cost formulas :class:`PassModel` uses
(``scripts/fit_pass_model.py`` does the same for aiconfigurator's measured tables, with
numpy).  Every fit minimises the squared log error, so a 10 % miss costs the same on a
10 us kernel as on a 10 ms one.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Sequence, Tuple

__all__ = ["gemm_s", "prefill_attention_s", "decode_attention_s", "fit_gemm", "fit_prefill_attention",
           "fit_decode_attention", "minimise"]

US = 1e-6


def gemm_s(m: int, n: int, k: int, peak: float, bw: float, itemsize: float,
           eff: float, half: float, mem_eff: float, floor_us: float) -> float:
    """One ``[m, k] x [k, n]`` GEMM: the longest of compute, memory traffic and the kernel floor."""
    compute = 2.0 * n * k * (m + half) / (peak * eff)
    memory = (itemsize * n * k + 2.0 * m * (n + k)) / (bw * mem_eff)
    return max(compute, memory, floor_us * US)


def prefill_attention_s(seqs: int, seq_len: int, heads: int, head_dim: int, peak: float,
                        eff: float, extra_pairs: float, floor_us: float) -> float:
    """Causal self-attention of ``seqs`` sequences of ``seq_len`` tokens (QK and PV products)."""
    pairs = seqs * seq_len * (seq_len + 1) / 2.0
    return max((pairs + extra_pairs * seqs * seq_len) * heads * 4.0 * head_dim / (peak * eff), floor_us * US)


def decode_attention_s(seqs: int, kv_tokens: int, kv_bytes_per_token: float, bw: float,
                       eff: float, seq_us: float, floor_us: float, half_ctas: float = 0.0, kv_heads: int = 1) -> float:
    """One decode step's attention: read every sequence's KV (slower while few sequences x KV
    heads occupy the GPU), plus a per-sequence cost."""
    read = kv_tokens * kv_bytes_per_token / (bw * eff) * (1.0 + half_ctas / (seqs * kv_heads))
    return max(read + seqs * seq_us * US, floor_us * US)


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
    """An unconstrained number mapped into [lo, hi] (keeps efficiencies within (0, 1])."""
    return lo + (hi - lo) / (1.0 + math.exp(-x))


def _unsquash(v: float, lo: float, hi: float) -> float:
    v = min(max(v, lo + 1e-9), hi - 1e-9)
    return -math.log((hi - lo) / (v - lo) - 1.0)


def _rms(errors: List[float]) -> float:
    return math.sqrt(sum(e * e for e in errors) / max(1, len(errors)))


def fit_gemm(samples: Sequence[Tuple[int, int, int, float]], peak: float, bw: float, itemsize: float
             ) -> Tuple[Dict[str, float], float]:
    """``samples``: (m, n, k, seconds).  Returns the four GEMM factors and the rms log error."""
    bounds = ((0.02, 1.0), (0.0, 4096.0), (0.02, 1.0), (0.0, 200.0))

    def params(x):
        return [_squash(v, lo, hi) for v, (lo, hi) in zip(x, bounds)]

    def errs(p):
        return [math.log(gemm_s(m, n, k, peak, bw, itemsize, *p) / s) for m, n, k, s in samples]

    x = minimise(lambda x: sum(e * e for e in errs(params(x))),
                 [_unsquash(v, lo, hi) for v, (lo, hi) in zip((0.6, 64.0, 0.7, 5.0), bounds)])
    p = params(x)
    return dict(gemm_efficiency=p[0], gemm_half_tokens=p[1], memory_efficiency=p[2], kernel_floor_us=p[3]), \
        _rms(errs(p))


def fit_prefill_attention(samples: Sequence[Tuple[int, int, int, int, float]], peak: float, floor_us: float
                          ) -> Tuple[Dict[str, float], float]:
    """``samples``: (seqs, seq_len, heads, head_dim, seconds)."""
    bounds = ((0.02, 1.0), (0.0, 8192.0))

    def params(x):
        return [_squash(v, lo, hi) for v, (lo, hi) in zip(x, bounds)]

    def errs(p):
        return [math.log(prefill_attention_s(b, s, h, d, peak, p[0], p[1], floor_us) / t) for b, s, h, d, t in samples]

    x = minimise(lambda x: sum(e * e for e in errs(params(x))),
                 [_unsquash(v, lo, hi) for v, (lo, hi) in zip((0.5, 100.0), bounds)])
    p = params(x)
    return dict(attention_prefill_efficiency=p[0], attention_prefill_extra_pairs=p[1]), _rms(errs(p))


def fit_decode_attention(samples: Sequence[Tuple[int, int, float, float]], bw: float, floor_us: float,
                         kv_heads: int = 1) -> Tuple[Dict[str, float], float]:
    """``samples``: (seqs, total KV tokens, KV bytes per token, seconds)."""
    bounds = ((0.02, 1.0), (0.0, 100.0), (0.0, 4096.0))

    def params(x):
        return [_squash(v, lo, hi) for v, (lo, hi) in zip(x, bounds)]

    def errs(p):
        return [math.log(decode_attention_s(b, kv, kvb, bw, p[0], p[1], floor_us, p[2], kv_heads) / t)
                for b, kv, kvb, t in samples]

    x = minimise(lambda x: sum(e * e for e in errs(params(x))),
                 [_unsquash(v, lo, hi) for v, (lo, hi) in zip((0.6, 0.1, 8.0), bounds)])
    p = params(x)
    return dict(attention_decode_efficiency=p[0], attention_decode_seq_us=p[1], attention_decode_half_ctas=p[2]), \
        _rms(errs(p))
