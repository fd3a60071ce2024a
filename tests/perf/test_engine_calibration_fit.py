"""The engine calibration's fit (jobs/engine_calibration.py) recovers a known machine.

Passes are made by the pass-time model itself with known efficiencies, pass overhead and request
path; the fit, given the same ceilings, must reproduce every pass and keep each fitted field
inside its physical bounds."""
from __future__ import annotations

from sglang_hydra import compose_record
from sglang_hydra.config.hardware import compose_hardware
from sglang_hydra.jobs.engine_calibration import FITTED_FIELDS, Sample, _model, fit_profile, predict


def test_the_fit_recovers_a_known_cpu_and_stays_physical():
    rec = compose_record(overrides=["model=tiny_llama"])
    base = compose_hardware("local")[0].to_dict()
    ceilings = {"bf16_tflops": 0.2, "hbm_bandwidth_gbps": 20.0, "kernel_floor_us": 15.0, "elementwise_kernel_us": 1.0}
    truth = dict(base, **ceilings, gemm_efficiency=0.5, attention_prefill_efficiency=0.3,
                 attention_decode_efficiency=0.2, attention_decode_seq_us=40.0, pass_overhead_us=4000.0)
    model = _model(rec, truth)
    shapes = [Sample("prefill", 0, new=n) for n in (16, 64, 256, 1024, 2048, 4096)]
    shapes += [Sample("prefill", 0, new=256, cached=2048), Sample("prefill", 0, new=512, cached=4096)]
    shapes += [Sample("decode", 0, batch=b, context=c) for b, c in ((1, 88), (1, 2072), (4, 280), (8, 1048), (16, 152))]
    samples = [Sample(s.kind, predict(model, s, 0.002), s.new, s.cached, s.batch, s.context) for s in shapes]
    cal = fit_profile(rec, base, ceilings, samples, steps=800)
    assert cal.worst_error < 0.05, list(zip(samples, cal.errors))
    for name, (lo, hi) in FITTED_FIELDS.items():
        assert lo <= cal.hardware[name] <= hi
    assert abs(cal.hardware["request_path_us"] - 2000.0) < 600.0
    assert abs(cal.hardware["pass_overhead_us"] - 4000.0) < 800.0


def test_a_full_sequence_attention_span_counts_the_cached_prefix_again():
    """SGLang's torch_native backend pads each request's queries to the whole sequence, so a cached
    prefix saves it no attention (``hardware.prefill_attention_span=full_sequence``, which the engine
    calibration states for a torch_native server); FlashInfer/FA3-style kernels attend from the new
    tokens only (``new``, every GPU preset)."""
    from sglang_hydra.perf.pass_time import PassModel
    rec = compose_record(overrides=["model=tiny_llama"])
    hw = compose_hardware("h100_80gb")[0].to_dict()
    assert _model(rec, dict(hw, prefill_attention_span="full_sequence")).attn_pairs(2048, 256) == 2304 * 2305 // 2
    assert _model(rec, hw).attn_pairs(2048, 256) == PassModel.attn_pairs(2048, 256) == 256 * 2048 + 256 * 257 // 2
