"""Derive the pass-time model's per-operation-class efficiencies from aiconfigurator's
measured SGLang kernel tables, and print them as hardware-preset YAML.

Run with aiconfigurator 0.12.0's Python (it brings pandas, pyarrow and scipy):

    /work/venvs/aic/bin/python scripts/fit_pass_model.py            # every GPU
    /work/venvs/aic/bin/python scripts/fit_pass_model.py h100_sxm   # one
    /work/venvs/aic/bin/python scripts/fit_pass_model.py --write    # and update conf/hardware/*.yaml

Only aiconfigurator's *data* is read (the parquet tables under
``aiconfigurator_core/systems/data/<gpu>/<op>/sglang/<version>/``); each table is held
against this project's own cost formula for that class (``sglang_hydra/perf/pass_time.py``)
and the formula's free factors are fitted by least squares on log time, so every factor
is reproducible from the command above:

* ``gemm`` (``gemm_perf``, bf16 torch linear, the rows with K, N >= 256: TP 8 splits give
  K = 512): ``gemm_efficiency``, ``gemm_half_tokens``, ``gemm_half_outputs``, ``gemm_k_overhead``,
  ``memory_efficiency``, ``kernel_floor_us`` of
  ``max(2NK (M + h + o / N) (1 + ko / K) / (peak * e), bytes / (bw * me), floor)``;
* ``context_attention`` (bf16, head 128, no window): ``attention_prefill_efficiency`` and
  ``attention_prefill_extra_pairs`` of ``(pairs + x * tokens) * heads * 4 * head_dim / (peak * e)``;
* ``generation_attention`` (bf16, head 128, no window): ``attention_decode_efficiency`` and
  ``attention_decode_seq_us`` and ``attention_decode_layer_us`` of
  ``kv_bytes / (bw * e) + seqs * s + layer`` (the fixed part: launch and split-KV merge);
* ``generation_attention`` also gives ``attention_decode_half_ctas`` (sequences x KV heads at
  which the read reaches half its rate) and ``attention_decode_split_ctas``: below
  ``attention_decode_split_below`` = half the SM count of blocks the kernel splits each
  context, and the batch reads like that many blocks;
* ``custom_allreduce`` (CUDA-graph rows, 64 KB-1 GB; message sizes are bf16 elements):
  ``allreduce_efficiency``, ``allreduce_latency_us`` and ``allreduce_tp_scaling`` of a ring over
  the preset's link, and, for PCIe cards, ``allreduce_bridge_gbps``: the rate every GPU of a
  group larger than a pair shares (their traffic crosses the host bridge);
* ``custom_allreduce`` again, kept as measured: ``allreduce_table_us``, per group size the
  median CUDA-graph time of every message from one token's activations (8 KB) up, which the
  pass model interpolates by message size (the ring line above is the fallback for group sizes
  the table lacks);
* ``elementwise_kernel_us``: ``gpu.mem_empirical_constant_latency`` of aiconfigurator's
  ``systems/<gpu>.yaml``.

``attention_prefill_layer_us`` and ``pass_overhead_us`` are written as 0 here: stage two,
``scripts/refine_pass_model.py``, fits them (and the decode efficiency) end to end.  Run the
stages in this order: stage one rewrites the whole block.
"""
from __future__ import annotations

import glob
import math
import os
import sys

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from sglang_hydra.perf.fit import EFFICIENCY_MAX, NEGLIGIBLE_RMS  # noqa: E402  (pure Python, no numpy)

#: the most blocks one decode-attention launch can keep resident per SM (2,048 threads / 128 per block):
#: a split batch cannot occupy the GPU like more than SM count x this many blocks
MAX_BLOCKS_PER_SM = 16
#: every term a fit dropped as negligible, per system (written into the preset's provenance note)
DROPPED = {}

#: streaming multiprocessors per GPU (NVIDIA's whitepapers: A100 108, H100/H200 SXM 132, L40S 142);
#: the decode kernel splits a batch of fewer blocks than half of them along the context
SM_COUNT = {"h100_sxm": 132, "h200_sxm": 132, "a100_sxm": 108, "l40s": 142}
# our preset -> (aiconfigurator system, dense bf16 TFLOP/s, HBM GB/s, TP link GB/s one way, link)
SYSTEMS = {
    "h100_sxm": ("h100_80gb", 989.4, 3350.0, 450.0, "nvlink"),
    "h200_sxm": ("h200_141gb", 989.4, 4800.0, 450.0, "nvlink"),
    "a100_sxm": ("a100_80gb", 312.0, 2039.0, 300.0, "nvlink"),
    "l40s": ("l40s_48gb", 362.05, 864.0, 32.0, "pcie"),
}


def data_dir() -> str:
    import aiconfigurator_core
    return os.path.join(os.path.dirname(aiconfigurator_core.__file__), "systems", "data")


def table(system: str, op: str, name: str) -> pd.DataFrame:
    """The newest SGLang version's table ``name`` for ``op`` on ``system``."""
    paths = glob.glob(os.path.join(data_dir(), system, op, "sglang", "*", f"{name}.parquet"))
    if not paths:
        raise SystemExit(f"no {op}/{name} table for {system}")

    def version(p):
        v = p.split(os.sep)[-2].replace(".post", ".")
        return tuple(int(x) for x in v.split(".") if x.isdigit())
    return pd.read_parquet(max(paths, key=version))


def elementwise_constant_us(system):
    """The fixed latency aiconfigurator's system file states for memory-bound kernels."""
    import yaml
    with open(os.path.join(os.path.dirname(data_dir()), f"{system}.yaml"), encoding="utf-8") as fh:
        return float(yaml.safe_load(fh)["gpu"]["mem_empirical_constant_latency"]) * 1e6


def fit(resid, x0, lo, hi, optional=(), names=None):
    """Bounded least squares on log time; then each ``optional`` index whose term, fixed at exactly
    0, costs less than ``NEGLIGIBLE_RMS`` of rms is dropped (a term the table does not support is
    written as 0, not as a vanishing 1e-19), the rest refitted."""
    def solve(fixed):
        free = [i for i in range(len(x0)) if i not in fixed]

        def full(q):
            p = np.array(x0, dtype=float)
            p[free] = q
            for i in fixed:
                p[i] = 0.0
            return p
        start = np.clip(np.array(x0, dtype=float)[free], np.array(lo)[free] + 1e-12, np.array(hi)[free] - 1e-12)
        r = least_squares(lambda q: resid(full(q)), start, bounds=(np.array(lo)[free], np.array(hi)[free]))
        return full(r.x), float(np.sqrt(np.mean(r.fun ** 2)))
    fixed = []
    p, rms = solve(fixed)
    for i in optional:
        q, r = solve(fixed + [i])
        if r - rms < NEGLIGIBLE_RMS:
            fixed, p, rms = fixed + [i], q, r
            if names:
                DROPPED.setdefault(CURRENT[0], []).append(names[i])
    return p, rms


CURRENT = [""]        # the system being fitted (for DROPPED)


def fit_gemm(system, peak, bw):
    d = table(system, "gemm", "gemm_perf")
    # the shapes a transformer's projections have at TP 1-8 (K, N >= 256); M up to 32k tokens
    d = d[(d.gemm_dtype == "bfloat16") & (d.n >= 256) & (d.k >= 256) & (d.m <= 32768)]
    m, n, k = d.m.values.astype(float), d.n.values.astype(float), d.k.values.astype(float)
    t = d.latency.values / 1e3

    def model(p):
        eff, half, me, floor, half_k_outputs, k_over = p
        comp = 2 * n * k * (m + half + half_k_outputs * 1e3 / n) * (1 + k_over / k) / (peak * eff)
        mem = (2 * n * k + 2 * m * (n + k)) / (bw * me)
        return np.maximum(np.maximum(comp, mem), floor * 1e-6)
    p, rms = fit(lambda p: np.log(model(p) / t), [0.7, 64, 0.8, 5, 100, 100], [0.05, 0, 0.05, 0, 0, 0],
                 [EFFICIENCY_MAX["compute"], 4096, EFFICIENCY_MAX["memory"], 100, 1e5, 1e4], optional=(1, 4, 5),
                 names=["gemm_efficiency", "gemm_half_tokens", "memory_efficiency", "kernel_floor_us",
                        "gemm_half_outputs", "gemm_k_overhead"])
    return dict(gemm_efficiency=p[0], gemm_half_tokens=p[1], gemm_half_outputs=p[4] * 1e3, gemm_k_overhead=p[5],
                memory_efficiency=p[2], kernel_floor_us=p[3]), rms


def fit_context_attention(system, peak, floor_us):
    d = table(system, "attention", "context_attention_perf")
    d = d[(d.attn_dtype == "bfloat16") & (d.kv_cache_dtype == "bfloat16") & (d.head_dim == 128)]
    if "window_size" in d:
        d = d[d.window_size == 0]
    # grouped-query shapes of served models (4-8 query heads per KV head), prompts of 256+ tokens
    d = d[(d.isl >= 256) & (d.num_heads >= 4) & (d.num_heads // d.num_key_value_heads).isin([4, 8])]
    b, s, h = d.batch_size.values.astype(float), d.isl.values.astype(float), d.num_heads.values.astype(float)
    t = d.latency.values / 1e3
    pairs = b * s * (s + 1) / 2

    def model(p):
        eff, extra = p
        return np.maximum((pairs + extra * b * s) * h * 4 * 128 / (peak * eff), floor_us * 1e-6)
    p, rms = fit(lambda p: np.log(model(p) / t), [0.5, 100], [0.05, 0], [EFFICIENCY_MAX["compute"], 8192],
                 optional=(1,), names=["attention_prefill_efficiency", "attention_prefill_extra_pairs"])
    return dict(attention_prefill_efficiency=p[0], attention_prefill_extra_pairs=p[1]), rms


def fit_generation_attention(system, bw, floor_us):
    d = table(system, "attention", "generation_attention_perf")
    d = d[(d.attn_dtype == "bfloat16") & (d.kv_cache_dtype == "bfloat16") & (d.head_dim == 128)]
    if "window_size" in d:
        d = d[d.window_size == 0]
    # grouped-query shapes of served models, batches up to 512, contexts of 256+ tokens
    d = d[(d.num_heads >= 4) & (d.num_heads // d.num_key_value_heads).isin([4, 8]) & (d.batch_size <= 512)
          & ((d.isl + d.step) >= 256)]
    b = d.batch_size.values.astype(float)
    ctx = (d.isl + d.step).values.astype(float)
    kv = d.num_key_value_heads.values.astype(float)
    t = d.latency.values / 1e3
    nbytes = b * ctx * kv * 128 * 2 * 2

    split_below = SM_COUNT[system] / 2
    blocks = b * kv

    def model(p):
        eff, seq_us, half, layer_us, split = p
        occ = np.where(blocks < split_below, split, blocks)
        return np.maximum(nbytes / (bw * eff) * (1 + half / occ) + (b * seq_us + layer_us) * 1e-6,
                          floor_us * 1e-6)
    max_ctas = SM_COUNT[system] * MAX_BLOCKS_PER_SM
    p, rms = fit(lambda p: np.log(model(p) / t), [0.7, 0.1, 50.0, 10.0, 200.0], [0.05, 0, 0, 0, 1],
                 [EFFICIENCY_MAX["memory"], 100, 4096, 500, max_ctas], optional=(1, 2, 3),
                 names=["attention_decode_efficiency", "attention_decode_seq_us", "attention_decode_half_ctas",
                        "attention_decode_layer_us", "attention_decode_split_ctas"])
    if p[2] == 0.0:                     # no occupancy term: a split changes nothing, so there is none to fit
        split_below, p[4] = 0.0, 0.0
    return dict(attention_decode_efficiency=p[0], attention_decode_seq_us=p[1], attention_decode_half_ctas=p[2],
                attention_decode_layer_us=p[3], attention_decode_split_below=split_below,
                attention_decode_split_ctas=p[4]), rms


def fit_allreduce(system, link, kind):
    d = table(system, "comm", "custom_allreduce_perf")
    # CUDA-graph rows, messages of 64 KB .. 1 GB (bf16 elements): what passes send
    d = d[d.kernel_source.str.contains("graph") & (d.message_size >= 32768)]
    tp = d.num_gpus.values.astype(float)
    nbytes = d.message_size.values.astype(float) * 2          # bf16 elements
    t = d.latency.values / 1e3
    ring = 2 * (tp - 1) / tp * nbytes
    if kind == "pcie":
        pair = tp <= 2

        def model(p):
            eff, lat, bridge = p
            per_gpu = ring / (link * eff)
            shared = 2 * (tp - 1) * nbytes / bridge
            return lat * 1e-6 + np.where(pair, per_gpu, shared)
        p, rms = fit(lambda p: np.log(model(p) / t), [0.6, 10, 15e9], [0.01, 0, 1e8],
                     [EFFICIENCY_MAX["compute"], 500, 1e12])
        return dict(allreduce_efficiency=p[0], allreduce_latency_us=p[1], allreduce_tp_scaling=0.0,
                    allreduce_bridge_gbps=p[2] / 1e9), rms

    def model(p):
        eff, lat, scaling = p
        return lat * 1e-6 + ring / (link * eff * (tp / 2) ** scaling)
    p, rms = fit(lambda p: np.log(model(p) / t), [0.6, 10, 0.0], [0.01, 0, -1], [EFFICIENCY_MAX["compute"], 500, 1])
    return dict(allreduce_efficiency=p[0], allreduce_latency_us=p[1], allreduce_tp_scaling=p[2],
                allreduce_bridge_gbps=None), rms


def allreduce_table(system):
    """``{tp: [[message bytes, us], ...]}`` from the CUDA-graph rows, 8 KB and up (median of repeats)."""
    d = table(system, "comm", "custom_allreduce_perf")
    d = d[d.kernel_source.str.contains("graph") & (d.message_size * 2 >= 8192)]
    out = {}
    for tp, g in d.groupby("num_gpus"):
        med = g.groupby("message_size").latency.median().sort_index()
        out[str(int(tp))] = [[int(m * 2), float(f"{lat * 1e3:.4g}")] for m, lat in med.items()]
    return out


def derive(system):
    CURRENT[0] = system
    preset, tflops, hbm, link, kind = SYSTEMS[system]
    peak, bw, link_bw = tflops * 1e12, hbm * 1e9, link * 1e9
    out, notes = {}, []
    g, rms = fit_gemm(system, peak, bw)
    out.update(g)
    notes.append(f"gemm rms log error {rms:.3f}")
    a, rms = fit_context_attention(system, peak, g["kernel_floor_us"])
    out.update(a)
    notes.append(f"context attention {rms:.3f}")
    a, rms = fit_generation_attention(system, bw, g["kernel_floor_us"])
    out.update(a)
    notes.append(f"generation attention {rms:.3f}")
    a, rms = fit_allreduce(system, link_bw, kind)
    out.update(a)
    notes.append(f"all-reduce {rms:.3f}")
    out["allreduce_table_us"] = allreduce_table(system)
    out["attention_prefill_layer_us"] = 0.0   # refined end to end (scripts/refine_pass_model.py)
    out["elementwise_kernel_us"] = elementwise_constant_us(system)
    notes.append("elementwise_kernel_us: gpu.mem_empirical_constant_latency of aiconfigurator's "
                 f"systems/{system}.yaml")
    # no kernel table measures a per-pass cost, and aiconfigurator's static estimate (the only end-to-end
    # figure the refinement sees) sums kernels: nothing to fit it on, so the model has none
    out["pass_overhead_us"] = 0.0
    if DROPPED.get(system):
        notes.append("terms the tables do not support (dropping each costs < "
                     f"{NEGLIGIBLE_RMS} rms log error), written as exactly 0: {', '.join(DROPPED[system])}")
    notes.append(f"efficiencies bounded below 1: compute {EFFICIENCY_MAX['compute']}, HBM {EFFICIENCY_MAX['memory']}; "
                 f"split-KV occupancy at most {MAX_BLOCKS_PER_SM} blocks per SM")
    return preset, out, notes


BEGIN = "# >>> pass-model efficiencies (written by scripts/fit_pass_model.py --write)"
END = "# <<< pass-model efficiencies"


def block(system, preset, vals, notes):
    """The preset's efficiency block, with its provenance."""
    lines = [BEGIN,
             f"# Derived from aiconfigurator 0.12.0's measured SGLang kernel tables for {system}",
             "# (aiconfigurator_core/systems/data/" + system + "/{gemm,attention,comm}/sglang/<newest>/*.parquet),",
             "# each class fitted to this project's cost formula by least squares on log time.",
             f"# Fit quality (rms of log(model/measured) over the table): {'; '.join(notes)}."]
    for k, v in vals.items():
        if isinstance(v, dict):
            lines.append(f"# {k}: custom_allreduce_perf.parquet, CUDA-graph rows; message bytes -> microseconds")
            lines.append(f"{k}:")
            lines += [f'  "{tp}": {rows}' for tp, rows in v.items()]
        else:
            lines.append(f"{k}: null" if v is None else f"{k}: {float(f'{v:.3g}')}")
    lines.append(END)
    return "\n".join(lines) + "\n"


def write(preset, text):
    """Replace (or append) the block in conf/hardware/<preset>.yaml."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conf", "hardware", f"{preset}.yaml")
    with open(path, encoding="utf-8") as fh:
        old = fh.read()
    if BEGIN in old:
        head, rest = old.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        new = head + text + tail
    else:
        new = old.rstrip("\n") + "\n" + text
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(new)


def main(argv):
    do_write = "--write" in argv
    systems = [a for a in argv if not a.startswith("--")] or list(SYSTEMS)
    for s in systems:
        preset, vals, notes = derive(s)
        text = block(s, preset, vals, notes)
        print(f"# conf/hardware/{preset}.yaml")
        print(text)
        if do_write:
            write(preset, text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
