"""The TTFT model against hand-computed cases.

Numbers are chosen so that each term is easy to compute by hand:
1 TFLOP/s at efficiency 1, num_parameters = 5e8 (so 1e9 FLOPs = 1 ms per new token),
attention 4 * 2 layers * 5 heads * 50 = 2000 FLOPs = 2 ns per (query, key) pair,
1000 KV bytes per token, host->device 1 GB/s (1 us per token), storage 0.5 GB/s.
"""
import math

import pytest

from sglang_hydra.workload.assemble import default_chunk_tokens
from sglang_hydra.workload.ttft import HardwareSpec, ModelShape, PrefillTimeline

MS = 1e-3
NS = 1e-9


def hw(**kw):
    base = dict(name="unit", bf16_tflops=1.0, prefill_efficiency=1.0, hbm_bandwidth_gbps=1e9,
                h2d_gbps=1.0, storage_read_gbps=0.5)
    base.update(kw)
    return base


def model(tp=1):
    return ModelShape(num_parameters=5e8, num_hidden_layers=2, num_attention_heads=5, head_dim=50,
                      kv_bytes_per_token=1000, tp_size=tp)


def timeline(chunk=None, **kw):
    return PrefillTimeline(hw(**kw), model(), chunk_tokens=chunk)


def test_single_request_linear_plus_causal_attention():
    t = timeline()
    # 10 tokens: 10 ms linear + 10*11/2 = 55 pairs * 2 ns
    assert t.serve(0.0, 10, 0, 0, 0) == pytest.approx(10 * MS + 55 * 2 * NS, rel=1e-12)


def test_attention_term_covers_the_cached_prefix():
    t = timeline()
    # 10 new tokens after 100 device-cached ones: 10*100 + 55 = 1055 pairs
    assert t.serve(0.0, 110, 100, 0, 0) == pytest.approx(10 * MS + 1055 * 2 * NS, rel=1e-12)


def test_fully_cached_prompt_still_computes_its_last_token():
    t = timeline()
    # 1 new token after 99 cached: 99 + 1 pairs
    assert t.serve(0.0, 100, 100, 0, 0) == pytest.approx(1 * MS + 100 * 2 * NS, rel=1e-12)


def test_queueing_fcfs_behind_the_previous_request():
    t = timeline()
    one = 10 * MS + 110 * NS
    assert t.start_time(0.0) == 0.0
    assert t.serve(0.0, 10, 0, 0, 0) == pytest.approx(one)
    assert t.start_time(0.005) == pytest.approx(one)      # still busy: must wait
    assert t.serve(0.005, 10, 0, 0, 0) == pytest.approx(2 * one - 0.005)
    assert t.start_time(1.0) == 1.0                        # idle again: starts on arrival
    assert t.serve(1.0, 10, 0, 0, 0) == pytest.approx(one)
    s = t.summary()
    assert s["queue_wait_p90_ms"] == pytest.approx((one - 0.005) * 1000)
    # busy 3 requests of `one` seconds over the span from 0 to 1 + one
    assert s["engine_busy_share"] == pytest.approx(3 * one / (1 + one))
    assert s["prefill_throughput"] == pytest.approx(30 / (1 + one))


def test_chunking_same_attention_pairs_but_each_pass_pays_the_memory_floor():
    # weights 5e8 params * 2 B = 1e9 B at 200 GB/s = 5 ms per pass, + prefix KV 1000 B/token
    hbm = 200.0
    unchunked = timeline(hbm_bandwidth_gbps=hbm).serve(0.0, 10, 0, 0, 0)
    assert unchunked == pytest.approx(10 * MS + 110 * NS)          # compute-bound: 10 ms > 5 ms floor
    t = timeline(chunk=4, hbm_bandwidth_gbps=hbm)
    passes = t.compute_seconds(10, 0)
    floor = lambda tokens_in_kv: 1e9 / (hbm * 1e9) + tokens_in_kv * 1000 / (hbm * 1e9)  # noqa: E731
    # chunks 4, 4, 2 (prefix 0, 4, 8): compute 4 ms + 10 pairs, 4 ms + 26 pairs, 2 ms + 19 pairs
    assert passes == pytest.approx([floor(4), floor(8), floor(10)])
    assert t.serve(0.0, 10, 0, 0, 0) == pytest.approx(sum(passes))
    assert sum(passes) > unchunked


def test_chunking_without_a_floor_keeps_the_causal_pair_count():
    t = timeline(chunk=4)
    passes = t.compute_seconds(10, 0)
    assert passes == pytest.approx([4 * MS + 10 * 2 * NS, 4 * MS + 26 * 2 * NS, 2 * MS + 19 * 2 * NS], rel=1e-12)
    assert sum(passes) == pytest.approx(10 * MS + 55 * 2 * NS, rel=1e-12)


def test_host_load_hidden_behind_compute_except_the_first_layer():
    t = timeline()
    # 1000 host-hit tokens -> 1 ms of copies, 0.5 ms per layer; per-layer compute ~5 ms
    compute = 10 * MS + (10 * 1000 + 55) * 2 * NS
    assert t.serve(0.0, 1010, 0, 1000, 0) == pytest.approx(compute + 0.5 * MS, rel=1e-12)


def test_host_load_exceeding_compute_is_exposed_per_layer():
    t = timeline()
    # 20000 host-hit tokens -> 20 ms, 10 ms per layer; compute 10 ms + 200055 pairs (5.200055 ms per layer)
    compute = 10 * MS + (10 * 20000 + 55) * 2 * NS
    per_layer = compute / 2
    expected = compute + 10 * MS + (10 * MS - per_layer)
    assert t.serve(0.0, 20010, 0, 20000, 0) == pytest.approx(expected, rel=1e-12)
    assert t.summary()["exposed_host_load_s"] == pytest.approx(expected - compute, rel=1e-9)


def test_storage_read_is_exposed_then_copied_like_a_host_hit():
    t = timeline()
    # 1000 storage tokens: 1e6 B at 0.5 GB/s = 2 ms exposed, + 0.5 ms first-layer copy, + 3 ms wait
    compute = 10 * MS + (10 * 1000 + 55) * 2 * NS
    got = t.serve(0.0, 1010, 0, 0, 1000, storage_wait_s=3 * MS)
    assert got == pytest.approx(compute + 2 * MS + 0.5 * MS + 3 * MS, rel=1e-12)


def test_tensor_parallel_divides_compute():
    t = PrefillTimeline(hw(), model(tp=2), chunk_tokens=None)
    assert t.serve(0.0, 10, 0, 0, 0) == pytest.approx((10 * MS + 110 * NS) / 2, rel=1e-12)


def test_percentiles_are_nearest_rank():
    t = timeline()
    for i in range(10):                       # idle engine: TTFT = (i + 1) ms-ish each
        t.serve(10.0 * i, i + 1, 0, 0, 0)
    s = t.summary()
    ttft = sorted(t.ttft_s)
    assert s["ttft_p50_ms"] == pytest.approx(ttft[4] * 1000)
    assert s["ttft_p90_ms"] == pytest.approx(ttft[8] * 1000)
    assert s["ttft_p99_ms"] == pytest.approx(ttft[9] * 1000)
    assert s["ttft_mean_ms"] == pytest.approx(sum(ttft) / 10 * 1000)


def test_bad_inputs_are_rejected():
    t = timeline()
    with pytest.raises(ValueError, match="exceed"):
        t.serve(0.0, 10, 8, 3, 0)
    with pytest.raises(ValueError):
        t.serve(0.0, 10, -1, 0, 0)
    with pytest.raises(ValueError, match="prefill_efficiency"):
        PrefillTimeline(hw(prefill_efficiency=1.5), model(), chunk_tokens=None)
    with pytest.raises(ValueError, match="h2d_gbps"):
        PrefillTimeline(hw(h2d_gbps=0), model(), chunk_tokens=None)


def test_assumptions_each_say_what_breaks_them():
    items = timeline(chunk=8192).assumptions()
    assert len(items) >= 8 and all("wrong" in a for a in items)


def test_default_chunk_follows_the_record_then_gpu_memory():
    class Rec:
        chunked_prefill_size = None
    h = HardwareSpec.from_any(hw(gpu_memory_gb=80))
    assert default_chunk_tokens(Rec, h) == 8192
    assert default_chunk_tokens(Rec, HardwareSpec.from_any(hw(gpu_memory_gb=24))) == 2048
    Rec.chunked_prefill_size = -1
    assert default_chunk_tokens(Rec, h) is None
    Rec.chunked_prefill_size = 4096
    assert default_chunk_tokens(Rec, h) == 4096


def test_llama3_8b_on_h100_is_in_a_plausible_range():
    """8B params, 32 layers, 32 heads of 128 at ~989 TFLOP/s x 0.5: an 8k prompt takes ~0.3 s."""
    m = ModelShape(num_parameters=8.03e9, num_hidden_layers=32, num_attention_heads=32, head_dim=128,
                   kv_bytes_per_token=131072)
    h = dict(name="h100", bf16_tflops=989, prefill_efficiency=0.5, hbm_bandwidth_gbps=3350, h2d_gbps=25,
             storage_read_gbps=5)
    t = PrefillTimeline(h, m, chunk_tokens=8192)
    ttft = t.serve(0.0, 8192, 0, 0, 0)
    linear = 2 * 8.03e9 * 8192 / (989e12 * 0.5)
    attn = 4 * 32 * 32 * 128 * (8192 * 8193 / 2) / (989e12 * 0.5)
    assert ttft == pytest.approx(linear + attn, rel=1e-9)
    assert 0.2 < ttft < 0.5 and math.isfinite(ttft)
