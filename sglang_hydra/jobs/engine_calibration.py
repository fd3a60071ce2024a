"""This machine's pass-time model, measured through a running engine (``job=calibrate`` without a
GPU, and ``job=validate job.calibrate=true``).

The pass-time model (:mod:`..perf.pass_time`) costs a pass as GEMMs, attention, element-wise
kernels and a fixed per-pass overhead.  On a GPU, ``job=calibrate`` times those kernels one by
one.  Here the real SGLang server is the instrument, so what the operator will be predicted is
what is measured:

* **the machine's ceilings**, by torch on this process's CPU (or GPU): the bf16 matmul rate
  (``bf16_tflops``), the copy bandwidth (``hbm_bandwidth_gbps``), the time of a tiny matmul
  (``kernel_floor_us``) and of a tiny element-wise kernel (``elementwise_kernel_us``): launch
  and dispatch costs, not fitted;
* **prefill passes**: one request at a time, prompts of several lengths made of tokens no other
  request has (nothing cached), one output token: the client's TTFT is the pass plus the
  request's way through the server; prompts that extend a cached one time attention over a
  cached prefix;
* **decode passes**: ``B`` requests at once with the same context, many output tokens: the
  median gap between tokens while all ``B`` decode is one decode pass of ``B`` sequences.

Then the efficiencies, each bounded inside its physical range (an efficiency in (0, 0.95], a
time >= 0), are fitted with the model's own formulas (:meth:`PassModel.step_s`) to those
passes: ``gemm_efficiency``, ``attention_prefill_efficiency``, ``attention_decode_efficiency``,
``attention_decode_seq_us``, ``pass_overhead_us`` (the scheduler's own time per pass: batch
building, sampling, Python) and ``request_path_us`` (HTTP, tokenizer manager and IPC between the
client and the scheduler, paid once per request before its first token).  Every sample and the
fit's error on it are returned with the preset, so the report shows how well it holds.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

__all__ = ["Sample", "Calibration", "measure_ceilings", "measure_engine", "fit_profile", "calibrate_on",
           "FITTED_FIELDS"]

#: prompt lengths of the prefill samples; (cached, new) shapes over a cached prefix
PREFILL_LENGTHS = (16, 64, 256, 1024, 2048, 4096)
CACHED_PREFILL_SHAPES = ((2048, 256), (4096, 512))
#: (batch, context) of the decode samples and the tokens each request decodes
DECODE_SHAPES = ((1, 64), (1, 2048), (4, 256), (8, 1024), (16, 128))
DECODE_TOKENS = 48
#: fitted fields and their bounds
FITTED_FIELDS = {
    "gemm_efficiency": (0.01, 0.95),
    "attention_prefill_efficiency": (0.001, 0.95),
    "attention_decode_efficiency": (0.001, 0.95),
    "attention_decode_seq_us": (0.0, 1.0e4),
    "pass_overhead_us": (0.0, 1.0e6),
    "request_path_us": (0.0, 1.0e6),
}


@dataclass
class Sample:
    """One measured pass: ``kind`` prefill (``new`` tokens after ``cached``) or decode (``batch``
    sequences of ``context`` tokens); ``seconds`` as measured."""

    kind: str
    seconds: float
    new: int = 0
    cached: int = 0
    batch: int = 0
    context: int = 0


@dataclass
class Calibration:
    """The fitted preset (a dict of hardware fields) with the samples and the fit's errors."""

    hardware: Dict[str, Any]
    samples: List[Sample] = field(default_factory=list)
    errors: List[float] = field(default_factory=list)      # (predicted - measured) / measured, per sample

    @property
    def worst_error(self) -> float:
        return max((abs(e) for e in self.errors), default=0.0)


# --------------------------------------------------------------------------- the machine's ceilings
def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_ceilings(device: str = "cpu", repeats: int = 5) -> Dict[str, float]:
    """Matmul rate, copy bandwidth and the two per-kernel floors, measured with torch here."""
    import torch
    dev = torch.device(device)
    sync = (torch.cuda.synchronize if dev.type == "cuda" else (lambda: None))
    flops = 0.0
    for n in ((2048, 4096, 8192) if dev.type == "cuda" else (256, 512, 1024)):    # the best size is the peak
        a = torch.randn(n, n, dtype=torch.bfloat16, device=dev)
        b = torch.randn(n, n, dtype=torch.bfloat16, device=dev)

        def mm():
            a @ b
            sync()
        flops = max(flops, 2.0 * n ** 3 / _median_time(mm, repeats))
    big = torch.empty(64 * 2 ** 20 if dev.type == "cpu" else 512 * 2 ** 20, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(big)

    def copy():
        dst.copy_(big)
        sync()
    bandwidth = 2.0 * big.numel() / _median_time(copy, repeats)        # read + write
    x = torch.randn(8, 64, dtype=torch.bfloat16, device=dev)
    w = torch.randn(64, 64, dtype=torch.bfloat16, device=dev)

    def tiny_mm():
        for _ in range(100):
            x @ w
        sync()

    def tiny_add():
        for _ in range(100):
            x.add(x)
        sync()
    return {"bf16_tflops": flops / 1e12, "hbm_bandwidth_gbps": bandwidth / 1e9,
            "kernel_floor_us": _median_time(tiny_mm, repeats) / 100 * 1e6,
            "elementwise_kernel_us": _median_time(tiny_add, repeats) / 100 * 1e6}


# --------------------------------------------------------------------------- the engine's passes
def measure_engine(url: str, maker, *, max_tokens: int, say: Callable[[str], None] = lambda s: None,
                   repeats: int = 5) -> List[Sample]:
    """Prefill and decode samples from the server at ``url`` (module doc); ``max_tokens``: the
    largest prompt + output the server takes."""
    from .engine_client import Planned, run_requests
    samples: List[Sample] = []
    tag = [1000]

    def fresh(n: int) -> List[int]:
        tag[0] += 1
        return maker.unique(n, tag=tag[0])

    for n in PREFILL_LENGTHS:
        if n + 1 > max_tokens:
            continue
        times = []
        for _ in range(repeats):
            m = run_requests(url, [Planned(0, fresh(n), 1)])[0]
            if m.ok:
                times.append(m.first_token_s - m.sent_s)
        if times:
            samples.append(Sample("prefill", statistics.median(times), new=n))
    for cached, new in CACHED_PREFILL_SHAPES:
        if cached + new + 1 > max_tokens:
            continue
        times = []
        for _ in range(repeats):
            prefix = fresh(cached)
            run_requests(url, [Planned(0, prefix, 1)])                 # now cached
            m = run_requests(url, [Planned(0, prefix + fresh(new), 1)])[0]
            if m.ok and (m.cached_tokens or 0) > 0:
                times.append(m.first_token_s - m.sent_s)
                got = m.cached_tokens
        if times:
            samples.append(Sample("prefill", statistics.median(times), new=cached + new - got, cached=got))
    say(f"prefill: {len([s for s in samples if s.kind == 'prefill'])} shapes")
    for batch, context in DECODE_SHAPES:
        if context + DECODE_TOKENS > max_tokens:
            continue
        plan = [Planned(i, fresh(context), DECODE_TOKENS) for i in range(batch)]
        got = run_requests(url, plan, pacing="scheduled")
        if not all(m.ok for m in got):
            continue
        # the gaps while every request decodes: after the last first token, before the first finish
        start = max(m.first_token_s for m in got)
        stop = min(m.finish_s for m in got)
        gaps = []
        for m in got:
            ts = [t for t in m.token_times_s if start <= t <= stop]
            gaps += [b - a for a, b in zip(ts, ts[1:]) if b > a]
        if len(gaps) >= 4:
            # the client reads tokens in bursts when it lags; the median gap is one pass
            samples.append(Sample("decode", statistics.median(gaps), batch=batch,
                                  context=context + DECODE_TOKENS // 2))
    say(f"decode: {len([s for s in samples if s.kind == 'decode'])} shapes")
    return samples


# --------------------------------------------------------------------------- the fit
def _model(record, hardware: Dict[str, Any]):
    from ..perf.pass_time import PassModel
    return PassModel.from_record(record, hardware)


def predict(model, sample: Sample, request_path_s: float) -> float:
    """The model's time for one sample (prefill: the pass plus the request's path)."""
    if sample.kind == "prefill":
        return request_path_s + model.step_s(sample.new, model.attn_pairs(sample.cached, sample.new), 0, 0,
                                             prefill_seqs=1)
    return model.step_s(sample.batch, 0, sample.batch, sample.batch * sample.context)


def fit_profile(record, base: Dict[str, Any], ceilings: Dict[str, float], samples: Sequence[Sample],
                steps: int = 500) -> Calibration:
    """Fit :data:`FITTED_FIELDS` (within their bounds) to the samples, the ceilings fixed."""
    import math
    from ..perf.fit import minimise
    names = list(FITTED_FIELDS)
    hw0 = dict(base)
    hw0.update(ceilings)

    def squash(x: float, lo: float, hi: float) -> float:
        return lo + (hi - lo) / (1.0 + math.exp(-x))

    def params(x) -> Dict[str, float]:
        return {n: squash(v, *FITTED_FIELDS[n]) for n, v in zip(names, x)}

    def errors(p: Dict[str, float]) -> List[float]:
        hw = dict(hw0)
        hw.update({k: v for k, v in p.items() if k != "request_path_us"})
        model = _model(record, hw)
        path = p["request_path_us"] * 1e-6
        return [(predict(model, s, path) - s.seconds) / s.seconds for s in samples]

    def loss(x) -> float:
        # squared log ratio: over- and under-prediction by the same factor cost the same
        return sum(math.log1p(e) ** 2 if e > -1 else 1e6 for e in errors(params(x)))

    def unsquash(v: float, lo: float, hi: float) -> float:
        f = min(max((v - lo) / (hi - lo), 1e-6), 1 - 1e-6)
        return math.log(f / (1.0 - f))

    # start where the passes point: the shortest decode pass is mostly the per-pass overhead, the
    # shortest prefill's excess over it mostly the request's path
    decode = [s.seconds for s in samples if s.kind == "decode"]
    prefill = [s.seconds for s in samples if s.kind == "prefill"]
    overhead = 0.8 * min(decode) * 1e6 if decode else 1000.0
    path = max(1.0, (min(prefill) * 1e6 - overhead) * 0.5) if prefill else 1000.0
    start = {"gemm_efficiency": 0.5, "attention_prefill_efficiency": 0.3, "attention_decode_efficiency": 0.3,
             "attention_decode_seq_us": 10.0, "pass_overhead_us": overhead, "request_path_us": path}
    x = [unsquash(start[n], *FITTED_FIELDS[n]) for n in names]
    for _ in range(4):             # Nelder-Mead restarted from its best point: the simplex collapses early
        x = minimise(loss, x, steps=steps)
    best = params(x)
    hw = dict(hw0)
    hw.update(best)
    return Calibration(hardware=hw, samples=list(samples), errors=errors(best))


def calibrate_on(url: str, record, base_hardware, maker, *, say: Callable[[str], None] = lambda s: None,
                 device: str = "cpu"):
    """Measure and fit on the running server at ``url``; returns the fitted
    :class:`~sglang_hydra.config.hardware.Hardware` and the :class:`Calibration` (samples, errors)."""
    from ..config.hardware import Hardware
    base = base_hardware.to_dict() if hasattr(base_hardware, "to_dict") else dict(base_hardware or {})
    say("measuring this machine's ceilings ...")
    ceilings = measure_ceilings(device)
    pool = int(getattr(record, "max_total_tokens", 0) or 8192)
    samples = measure_engine(url, maker, max_tokens=min(pool - 1, int(getattr(record, "context_length", 0) or pool)),
                             say=say)
    if not base.get("gpu_memory_gb") and device == "cpu":
        # a CPU engine's "device" memory is this machine's RAM (SGLang sizes its pool from it)
        from ..memory.hostmem import meminfo_total_bytes
        base = dict(base, gpu_memory_gb=round(meminfo_total_bytes() / 1e9, 1))
        if not base.get("host_memory_gb"):
            base["host_memory_gb"] = base["gpu_memory_gb"]
    from ..perf.pass_time import FULL_SEQUENCE_PREFILL_BACKENDS
    backend = getattr(record, "prefill_attention_backend", None) or getattr(record, "attention_backend", None)
    base = dict(base, prefill_attention_span="full_sequence" if backend in FULL_SEQUENCE_PREFILL_BACKENDS else "new")
    cal = fit_profile(record, base, ceilings, samples)
    say(f"fitted on {len(samples)} passes, worst error {cal.worst_error:.0%}")
    known = set(Hardware.__dataclass_fields__)
    return Hardware(**{k: v for k, v in cal.hardware.items() if k in known}), cal


# --------------------------------------------------------------------------- job=calibrate via=engine
def _sig(x: float) -> float:
    return float(f"{float(x):.4g}")


def preset_from(cal: Calibration, name: str, source: str) -> Dict[str, Any]:
    """The preset to write: every hardware field of the calibration (fitted ones rounded)."""
    from ..config.hardware import Hardware
    known = list(Hardware.__dataclass_fields__)
    out: Dict[str, Any] = {}
    for k in known:
        v = cal.hardware.get(k)
        if k == "name":
            v = name
        elif k == "source":
            v = source
        elif isinstance(v, float):
            v = _sig(v)
        out[k] = v
    return out


def calibration_report(cal: Calibration, preset: Dict[str, Any]) -> Dict[str, Any]:
    """``calibrate.json``: the preset, every measured pass with the fitted model's time for it."""
    checks = [{"kind": s.kind, "new_tokens": s.new, "cached_tokens": s.cached, "batch": s.batch,
               "context": s.context, "measured_ms": s.seconds * 1000,
               "predicted_ms": s.seconds * (1 + e) * 1000, "error_pct": 100 * e}
              for s, e in zip(cal.samples, cal.errors)]
    return {"via": "engine", "preset": preset, "checks": checks, "max_abs_error_pct": 100 * cal.worst_error}


def run_engine_calibration(record, job: dict, ctx) -> Dict[str, Any]:
    """``job=calibrate`` through the real engine: launch, warm up, measure, fit, write the preset."""
    import json
    import sys

    import yaml
    from ..workload.token_ids import TokenMaker
    from .engine_client import Planned, flush_cache, run_requests
    from .launch import running_deployment
    say = (lambda text: print(f"calibrate: {text}", file=sys.stderr, flush=True))
    maker = TokenMaker(int(getattr(record, "vocab_size", 0) or 32000))
    base = getattr(ctx, "hardware", None)
    name = job.get("preset_name") or "local_engine"
    with running_deployment(record, job, ctx, say=say) as dep:
        url = dep.worker_urls[0]
        run_requests(url, [Planned(-1 - i, maker.unique(n, tag=i), 2) for i, n in enumerate((32, 256, 1024))])
        flush_cache(url)
        hw, cal = calibrate_on(url, record, base, maker, say=say)
    source = (f"job=calibrate via the engine on this machine, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
              f"matmul rate, copy bandwidth and kernel floors measured with torch; gemm/attention efficiencies, "
              f"pass overhead and request path fitted to {len(cal.samples)} passes of the real SGLang server "
              f"({getattr(record, 'model_path', '?')}), worst error {cal.worst_error:.0%}")
    preset = preset_from(cal, name, source)
    out_dir = ctx.out_dir()
    header = (f"# Written by sglang-hydra job=calibrate (via the engine).\n"
              f"# Use: sglang-hydra hydra.searchpath=[file://{out_dir.resolve()}] hardware={name} ...\n")
    ctx.write_text(f"hardware/{name}.yaml", header + yaml.safe_dump(preset, sort_keys=False))
    result = calibration_report(cal, preset)
    checks = result["checks"]
    result["preset_path"] = str(out_dir / "hardware" / f"{name}.yaml")
    ctx.write_text("calibrate.json", json.dumps(result, indent=2))
    if job.get("format") == "json":
        print(json.dumps(result, indent=2))
    else:
        print(f"{'pass':>8} {'new':>6} {'cached':>7} {'batch':>6} {'context':>8} {'predicted ms':>13} "
              f"{'measured ms':>12} {'error %':>8}")
        for c in checks:
            print(f"{c['kind']:>8} {c['new_tokens']:>6} {c['cached_tokens']:>7} {c['batch']:>6} {c['context']:>8} "
                  f"{c['predicted_ms']:>13.2f} {c['measured_ms']:>12.2f} {c['error_pct']:>8.1f}")
        print(f"wrote {result['preset_path']}")
        print(f"use it: sglang-hydra hydra.searchpath=[file://{out_dir.resolve()}] hardware={name} ...")
    return result
