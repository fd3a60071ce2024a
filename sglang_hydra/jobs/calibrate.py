"""``job=calibrate``: measure this GPU and write a hardware preset the pass-time model can use.

What it measures (torch, on the selected device), per operation class of the pass-time
model (:mod:`sglang_hydra.perf`), and fits with that model's own formulas
(:mod:`sglang_hydra.perf.fit`):

* **GEMMs** of the record's model shapes (q/k/v, o, gate/up, down) at token counts from 1
  to thousands: ``gemm_efficiency``, ``gemm_half_tokens``, ``memory_efficiency`` and
  ``kernel_floor_us``;
* **prefill attention** (causal, scaled_dot_product_attention) over several prompt lengths:
  ``attention_prefill_efficiency`` and ``attention_prefill_extra_pairs``;
* **decode attention** (one query per sequence over its KV) for several batches and
  contexts: ``attention_decode_efficiency`` and ``attention_decode_seq_us``;
* the peak: the base preset's ``bf16_tflops`` (a datasheet figure), or, when the base has
  none, the rate of a large matmul measured here; ``h2d_gbps`` / ``d2h_gbps``: pinned host
  <-> device copies; ``hbm_bandwidth_gbps``: a device-to-device copy.

Without a GPU (or with ``job.via=engine``) the calibration runs through a real SGLang server
instead (:mod:`.engine_calibration`): the server is launched as ``job=launch`` would, and its
prefill and decode passes are what the model is fitted to, so ``hardware=local`` predicts the
CPU server this machine runs.

One GPU cannot time a tensor-parallel all-reduce, so the all-reduce factors, the links
(``tp_link``, ``nvlink_gbps``, ``nic_gbps``) and ``pass_overhead_us`` are kept from the
base preset (the source says so).  It then predicts, with the pass-time model and the new
preset, five prompt shapes of a decoder-layer stack it did not fit on, and prints the
error of each prediction against a measurement.

The preset is written as ``<output dir>/hardware/<name>.yaml``: use it with
``hydra.searchpath=[file://<output dir>] hardware=<name>``.  ``job.device=cpu`` runs the
same code on the CPU with tiny shapes: a rehearsal of the procedure (it writes a preset
marked as such), not a calibration.
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Dict, List

from ..config.errors import ConfigError, Problem
from .context import JobContext

GB = 1e9

#: (new tokens, cached prefix tokens) of the stack runs the new preset predicts
GPU_CHECK_SHAPES = ((512, 0), (1024, 4096), (3072, 0), (6144, 2048), (2048, 16384))
CPU_CHECK_SHAPES = ((32, 0), (48, 96), (96, 0), (160, 64), (64, 256))
#: token counts of the GEMM sweep; prompt lengths of the attention sweep; (batch, context) of decode
GPU_GEMM_TOKENS = (1, 8, 32, 128, 512, 2048, 8192)
CPU_GEMM_TOKENS = (1, 8, 32, 128)
GPU_PREFILL_LENGTHS = (512, 1024, 2048, 4096, 8192)
CPU_PREFILL_LENGTHS = (32, 64, 128, 256)
GPU_DECODE_SHAPES = ((1, 4096), (8, 2048), (32, 4096), (64, 1024), (128, 2048))
CPU_DECODE_SHAPES = ((1, 256), (4, 128), (8, 512), (16, 64))
#: preset fields one GPU cannot measure: kept from the base preset
KEPT_FROM_BASE = ("allreduce_efficiency", "allreduce_latency_us", "allreduce_bridge_gbps", "allreduce_table_us",
                  "pass_overhead_us",
                  "tp_link", "nvlink_gbps", "nic_gbps", "host_memory_gb", "storage_read_gbps", "storage_write_gbps")


@dataclass
class StackShape:
    """The layers that are run: the model's widths, fewer layers."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @property
    def params(self) -> int:
        attn = self.hidden * self.heads * self.head_dim * 2 + self.hidden * self.kv_heads * self.head_dim * 2
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp)


def stack_shape(record, device: str) -> StackShape:
    """Widths from the record (GPU) or tiny ones (CPU rehearsal)."""
    if device == "cpu":
        return StackShape(layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=384)
    hidden = int(getattr(record, "hidden_size", 0) or 4096)
    heads = int(getattr(record, "num_attention_heads", 0) or 32)
    kv = int(getattr(record, "num_key_value_heads", 0) or heads)
    head_dim = int(getattr(record, "head_dim", 0) or hidden // heads)
    layers = int(getattr(record, "num_hidden_layers", 0) or 32)
    params = getattr(record, "num_parameters", None)
    attn = hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2
    inter = int(3.5 * hidden)
    if params:   # what the MLP must hold for the layer stack to carry the model's parameters
        per_layer = float(params) / layers
        inter = max(hidden, int((per_layer - attn) / (3 * hidden)))
    return StackShape(layers=min(layers, 4), hidden=hidden, heads=heads, kv_heads=kv, head_dim=head_dim,
                      intermediate=inter)


def _require_device(device: str):
    import torch
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError([Problem("job.device", None, "job=calibrate needs a CUDA GPU and none is visible; "
                                   "job.device=cpu rehearses the procedure on the CPU with tiny shapes "
                                   "(it calibrates nothing)", "calibrate")])
    return torch


class _Stack:
    """Random-weight decoder layers (RMSNorm, GQA attention over a cached prefix, SwiGLU MLP)."""

    def __init__(self, torch, shape: StackShape, device: str, dtype):
        self.t, self.s, self.dev, self.dtype = torch, shape, device, dtype
        g = torch.Generator(device="cpu").manual_seed(0)

        def w(*dims):
            return (torch.randn(*dims, generator=g) / math.sqrt(dims[0])).to(device=device, dtype=dtype)

        s = shape
        self.layers = [dict(q=w(s.hidden, s.heads * s.head_dim), k=w(s.hidden, s.kv_heads * s.head_dim),
                            v=w(s.hidden, s.kv_heads * s.head_dim), o=w(s.heads * s.head_dim, s.hidden),
                            gate=w(s.hidden, s.intermediate), up=w(s.hidden, s.intermediate),
                            down=w(s.intermediate, s.hidden)) for _ in range(s.layers)]

    def run(self, new: int, prefix: int) -> None:
        t, s = self.t, self.s
        F = t.nn.functional
        x = t.randn(1, new, s.hidden, device=self.dev, dtype=self.dtype)
        kv_prefix = [(t.randn(1, s.kv_heads, prefix, s.head_dim, device=self.dev, dtype=self.dtype),
                      t.randn(1, s.kv_heads, prefix, s.head_dim, device=self.dev, dtype=self.dtype))
                     for _ in self.layers] if prefix else None
        rep = s.heads // s.kv_heads
        with t.no_grad():
            for i, L in enumerate(self.layers):
                h = F.rms_norm(x, (s.hidden,))
                q = (h @ L["q"]).view(1, new, s.heads, s.head_dim).transpose(1, 2)
                k = (h @ L["k"]).view(1, new, s.kv_heads, s.head_dim).transpose(1, 2)
                v = (h @ L["v"]).view(1, new, s.kv_heads, s.head_dim).transpose(1, 2)
                if kv_prefix:
                    k = t.cat([kv_prefix[i][0], k], dim=2)
                    v = t.cat([kv_prefix[i][1], v], dim=2)
                if rep > 1:
                    k = k.repeat_interleave(rep, dim=1)
                    v = v.repeat_interleave(rep, dim=1)
                if prefix:   # causal over the new tokens, full view of the prefix
                    mask = t.ones(new, prefix + new, device=self.dev, dtype=t.bool).tril(diagonal=prefix)
                    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                else:
                    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + a.transpose(1, 2).reshape(1, new, s.heads * s.head_dim) @ L["o"]
                h = F.rms_norm(x, (s.hidden,))
                x = x + (F.silu(h @ L["gate"]) * (h @ L["up"])) @ L["down"]


def _timed(torch, device: str, fn, repeats: int) -> float:
    """Median seconds of ``fn`` after one warm-up call."""
    fn()
    out = []
    for _ in range(max(1, repeats)):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def measure_gemms(torch, device: str, dtype, shape: StackShape, tokens, repeats: int):
    """(m, n, k, seconds) of ``[m, k] x [k, n]`` for the model's four projection shapes."""
    s = shape
    mats = ((s.hidden, s.heads * s.head_dim + 2 * s.kv_heads * s.head_dim), (s.heads * s.head_dim, s.hidden),
            (s.hidden, 2 * s.intermediate), (s.intermediate, s.hidden))
    out = []
    for k, n in mats:
        w = torch.randn(k, n, device=device, dtype=dtype)
        for m in tokens:
            x = torch.randn(m, k, device=device, dtype=dtype)
            out.append((m, n, k, _timed(torch, device, lambda: x @ w, repeats)))
    return out


def measure_prefill_attention(torch, device: str, dtype, shape: StackShape, lengths, repeats: int):
    """(seqs, length, heads, head_dim, seconds) of causal attention over one prompt."""
    F = torch.nn.functional
    out = []
    for n in lengths:
        q = torch.randn(1, shape.heads, n, shape.head_dim, device=device, dtype=dtype)
        k = torch.randn(1, shape.heads, n, shape.head_dim, device=device, dtype=dtype)
        v = torch.randn(1, shape.heads, n, shape.head_dim, device=device, dtype=dtype)
        out.append((1, n, shape.heads, shape.head_dim,
                    _timed(torch, device, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), repeats)))
    return out


def measure_decode_attention(torch, device: str, dtype, shape: StackShape, shapes, repeats: int):
    """(seqs, KV tokens, KV bytes per token (one layer), seconds) of one query per sequence."""
    F = torch.nn.functional
    itemsize = 2 if dtype == torch.bfloat16 else 4
    per_token = 2 * shape.kv_heads * shape.head_dim * itemsize
    rep = shape.heads // shape.kv_heads
    out = []
    for batch, ctx_len in shapes:
        q = torch.randn(batch, shape.heads, 1, shape.head_dim, device=device, dtype=dtype)
        k = torch.randn(batch, shape.kv_heads, ctx_len, shape.head_dim, device=device, dtype=dtype)
        v = torch.randn(batch, shape.kv_heads, ctx_len, shape.head_dim, device=device, dtype=dtype)

        def attend():
            q2 = q.view(batch, shape.kv_heads, rep, shape.head_dim)     # grouped queries share their KV head
            return F.scaled_dot_product_attention(q2, k, v)
        out.append((batch, batch * ctx_len, float(per_token), _timed(torch, device, attend, repeats)))
    return out


def measure_matmul_tflops(torch, device: str, dtype, repeats: int) -> float:
    n = 8192 if device == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sec = _timed(torch, device, lambda: a @ b, repeats)
    return 2.0 * n ** 3 / sec / 1e12


def measure_copies(torch, device: str, repeats: int) -> Dict[str, float]:
    """GB/s of pinned host->device, device->host and device->device copies."""
    nbytes = (512 << 20) if device == "cuda" else (16 << 20)
    n = nbytes // 2
    pin = device == "cuda"
    host = torch.empty(n, dtype=torch.bfloat16, pin_memory=pin)
    dev = torch.empty(n, dtype=torch.bfloat16, device=device)
    dev2 = torch.empty_like(dev)
    h2d = _timed(torch, device, lambda: dev.copy_(host, non_blocking=True), repeats)
    d2h = _timed(torch, device, lambda: host.copy_(dev, non_blocking=True), repeats)
    d2d = _timed(torch, device, lambda: dev2.copy_(dev), repeats)
    return {"h2d_gbps": nbytes / h2d / GB, "d2h_gbps": nbytes / d2h / GB,
            "hbm_bandwidth_gbps": 2 * nbytes / d2d / GB}   # a copy reads and writes every byte


def _field(hw, name):
    if hw is None:
        return None
    return hw.get(name) if isinstance(hw, dict) else getattr(hw, name, None)


def run(record, job: dict, ctx: JobContext) -> Dict[str, Any]:
    via = job.get("via")
    if via is None:
        import torch
        via = "kernels" if torch.cuda.is_available() or job.get("device") == "cpu" else "engine"
    if via == "engine":
        from .engine_calibration import run_engine_calibration
        return run_engine_calibration(record, job, ctx)
    device = job.get("device", "cuda")
    torch = _require_device(device)
    repeats = max(1, int(job.get("repeats", 5)))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    base = getattr(ctx, "hardware", None)
    shape = stack_shape(record, device)
    gpu = device == "cuda"
    check_shapes = GPU_CHECK_SHAPES if gpu else CPU_CHECK_SHAPES
    stack = _Stack(torch, shape, device, dtype)

    copies = measure_copies(torch, device, repeats)
    peak = _field(base, "bf16_tflops")
    peak_source = f"base preset {_field(base, 'name')}"
    measured_peak = measure_matmul_tflops(torch, device, dtype, repeats)
    if not peak or not gpu:
        peak, peak_source = measured_peak, "measured: a large matmul on this device"
    from ..perf import fit as perf_fit
    peak_flops, bw = float(peak) * 1e12, copies["hbm_bandwidth_gbps"] * GB
    itemsize = 2.0 if gpu else 4.0
    gemms = measure_gemms(torch, device, dtype, shape, GPU_GEMM_TOKENS if gpu else CPU_GEMM_TOKENS, repeats)
    factors, gemm_rms = perf_fit.fit_gemm(gemms, peak_flops, bw, itemsize)
    floor = factors["kernel_floor_us"]
    prefill = measure_prefill_attention(torch, device, dtype, shape,
                                        GPU_PREFILL_LENGTHS if gpu else CPU_PREFILL_LENGTHS, repeats)
    got, prefill_rms = perf_fit.fit_prefill_attention(prefill, peak_flops, floor)
    factors.update(got)
    decode = measure_decode_attention(torch, device, dtype, shape, GPU_DECODE_SHAPES if gpu else CPU_DECODE_SHAPES,
                                      repeats)
    got, decode_rms = perf_fit.fit_decode_attention(decode, bw, floor, shape.kv_heads)
    factors.update(got)
    fit = {"gemm": {"samples": len(gemms), "rms_log_error": gemm_rms},
           "attention_prefill": {"samples": len(prefill), "rms_log_error": prefill_rms},
           "attention_decode": {"samples": len(decode), "rms_log_error": decode_rms}}

    name = job.get("preset_name") or _default_name(torch, device)
    # the rehearsal has no GPU: it keeps the base preset's size, or an 80 GB placeholder
    gpu_gb = (torch.cuda.get_device_properties(0).total_memory / GB) if gpu else \
        (_field(base, "gpu_memory_gb") or 80.0)
    from ..config.hardware import Hardware
    defaults = Hardware()
    preset = {
        "name": name,
        "gpu_memory_gb": _sig(gpu_gb),
        "hbm_bandwidth_gbps": _sig(copies["hbm_bandwidth_gbps"]),
        "bf16_tflops": _sig(float(peak)),
        **{k: _sig(v) for k, v in factors.items()},
        "h2d_gbps": _sig(copies["h2d_gbps"]),
        "d2h_gbps": _sig(copies["d2h_gbps"]),
        "gpus_per_node": (torch.cuda.device_count() if gpu else _field(base, "gpus_per_node")),
        "source": _source(torch, device, shape, peak_source, base),
    }
    for key in KEPT_FROM_BASE:
        v = _field(base, key)
        preset[key] = v if v is not None else getattr(defaults, key)
    checks = predict_vs_measure(torch, device, stack, shape, preset, check_shapes, repeats)
    out_dir = ctx.out_dir()
    preset_path = out_dir / "hardware" / f"{name}.yaml"
    import yaml
    header = ("# Written by sglang-hydra job=calibrate" + (" -- a CPU REHEARSAL, not a GPU calibration" if device == "cpu" else "")
              + f".\n# Use: sglang-hydra hydra.searchpath=[file://{out_dir.resolve()}] hardware={name} ...\n")
    ctx.write_text(f"hardware/{name}.yaml", header + yaml.safe_dump(preset, sort_keys=False))
    # the same figures as a --config file (hardware settings beside any server settings)
    ctx.write_text("calibrated_config.yaml", header.replace(f"hydra.searchpath=[file://{out_dir.resolve()}] "
                                                             f"hardware={name}", f"--config {out_dir.resolve()}/"
                                                             "calibrated_config.yaml")
                   + yaml.safe_dump({"hardware": preset}, sort_keys=False))
    result = {"device": device, "rehearsal": device == "cpu", "stack": shape.__dict__, "copies": copies,
              "matmul_tflops": measured_peak, "fit": fit, "preset": preset, "preset_path": str(preset_path),
              "checks": checks, "max_abs_error_pct": max(abs(c["error_pct"]) for c in checks)}
    ctx.write_text("calibrate.json", json.dumps(result, indent=2))
    _print(result, job, out_dir)
    return result


def predict_vs_measure(torch, device, stack, shape: StackShape, preset, shapes, repeats) -> List[Dict[str, Any]]:
    """The pass-time model's prefill time for the stack with the new preset, against a measurement."""
    from ..config.hardware import Hardware
    from ..perf import PassModel
    hw = Hardware().to_dict()
    hw.update({k: v for k, v in preset.items() if k in hw})
    itemsize = 2.0 if device == "cuda" else 4.0
    model = PassModel(tp=1, hidden=shape.hidden, layers=shape.layers, heads=shape.heads, kv_heads=shape.kv_heads,
                      head_dim=shape.head_dim, v_head_dim=shape.head_dim, intermediate=shape.intermediate,
                      vocab=0, kv_bytes_per_token=2 * shape.layers * shape.kv_heads * shape.head_dim * itemsize,
                      weight_bytes_per_gpu=shape.params * itemsize, weight_itemsize=itemsize, hardware=hw,
                      name="calibration stack")
    out = []
    for new, prefix in shapes:
        predicted = model.prefill_s([(prefix, new)])
        measured = _timed(torch, device, lambda: stack.run(new, prefix), repeats)
        out.append({"new_tokens": new, "prefix_tokens": prefix, "predicted_s": predicted, "measured_s": measured,
                    "error_pct": 100.0 * (predicted - measured) / measured})
    return out


def _sig(x: float) -> float:
    """Four significant digits (a CPU's TFLOP/s must not round to 0)."""
    return float(f"{float(x):.4g}")


def _default_name(torch, device: str) -> str:
    if device != "cuda":
        return "cpu_rehearsal"
    gpu = torch.cuda.get_device_name(0).lower()
    return "calibrated_" + "".join(c if c.isalnum() else "_" for c in gpu).strip("_")


def _source(torch, device, shape, peak_source, base) -> str:
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (rehearsal only)"
    kept = (f"; all-reduce factors, links, pass overhead, host memory and storage rates kept from "
            f"{_field(base, 'name')}") if base is not None else ""
    return (f"job=calibrate on {where}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
            f"GEMMs, prefill and decode attention of the model's shapes (hidden {shape.hidden}, {shape.heads}/"
            f"{shape.kv_heads} heads of {shape.head_dim}, MLP {shape.intermediate}) with torch {torch.__version__}, "
            f"fitted with sglang_hydra.perf.fit; peak from {peak_source}; pinned copies for h2d/d2h, a device copy "
            f"for HBM{kept}")


def _print(result: Dict[str, Any], job: dict, out_dir) -> None:
    if job.get("format") == "json":
        print(json.dumps(result, indent=2))
        return
    p = result["preset"]
    if result["rehearsal"]:
        print("REHEARSAL on the CPU with tiny shapes: the numbers below describe this CPU, not a GPU.")
    print(f"GEMM efficiency {p['gemm_efficiency']:.3f} of {p['bf16_tflops']:g} TFLOP/s (half at "
          f"{p['gemm_half_tokens']:g} tokens), memory {p['memory_efficiency']:.3f}, prefill attention "
          f"{p['attention_prefill_efficiency']:.3f}, decode attention {p['attention_decode_efficiency']:.3f}; "
          f"h2d {p['h2d_gbps']:.1f} GB/s, d2h {p['d2h_gbps']:.1f} GB/s, HBM {p['hbm_bandwidth_gbps']:.0f} GB/s")
    print(f"{'new tokens':>10} {'prefix':>8} {'predicted ms':>13} {'measured ms':>12} {'error %':>8}")
    for c in result["checks"]:
        print(f"{c['new_tokens']:>10} {c['prefix_tokens']:>8} {1000 * c['predicted_s']:>13.2f} "
              f"{1000 * c['measured_s']:>12.2f} {c['error_pct']:>8.1f}")
    print(f"wrote {result['preset_path']}")
    print(f"use it: sglang-hydra hydra.searchpath=[file://{out_dir.resolve()}] hardware={p['name']} ...")
    print(f"    or: sglang-hydra --config {out_dir.resolve()}/calibrated_config.yaml ...")
