"""The pass-time model: hand-computed small cases, monotonicity, TP, MoE and MLA."""
from __future__ import annotations

import pytest

from sglang_hydra.config.hardware import compose_hardware
from sglang_hydra.perf import PassModel, PassModelError
from sglang_hydra.perf.pass_time import ACT_BYTES, ELEMENTWISE_HIDDEN_PASSES

LLAMA8 = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
              head_dim=128, vocab_size=128256, intermediate_size=14336, num_parameters=8030261248,
              tp_size=1, model_path="llama")


def unit_hw(**kw):
    """1 TFLOP/s, 1 GB/s, perfect efficiencies, no floors: costs are countable by hand."""
    hw = dict(name="unit", bf16_tflops=1.0, hbm_bandwidth_gbps=1.0, gemm_efficiency=1.0, gemm_half_tokens=0.0,
              memory_efficiency=1.0, attention_prefill_efficiency=1.0, attention_decode_efficiency=1.0,
              allreduce_efficiency=1.0, allreduce_latency_us=0.0, kernel_floor_us=0.0, pass_overhead_us=0.0,
              elementwise_kernel_us=0.0,
              tp_link="nvlink", nvlink_gbps=1.0, h2d_gbps=1.0)
    hw.update(kw)
    return hw


def preset(name):
    hw, problems = compose_hardware(name)
    assert not problems
    return hw


TINY = dict(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
            vocab_size=16, intermediate_size=16, num_parameters=1000, tp_size=1, model_path="t", dtype="auto")


def test_attn_pairs_counts_causal_pairs():
    assert PassModel.attn_pairs(0, 1) == 1
    assert PassModel.attn_pairs(0, 4) == 10          # 1 + 2 + 3 + 4
    assert PassModel.attn_pairs(3, 2) == 2 * 3 + 3    # each new token sees the 3 cached + its causal part
    assert PassModel.attn_pairs(5, 0) == 0


def test_a_tiny_pass_by_hand():
    """One layer, hidden 8, two query heads / one KV head of 4, MLP 16, vocab 16, on a unit machine."""
    m = PassModel.from_record(TINY, unit_hw())
    n = 4
    pairs = PassModel.attn_pairs(0, n)
    peak, bw = 1e12, 1e9
    # GEMM (K, N): qkv (8, 2*4 + 1*(4+4)=16), o (8, 8), gate_up (8, 32), down (16, 8); memory-bound
    # at 1 GB/s: weights 2 B each + activations 2 B x M x (K + N)
    gemm = sum(max(2 * n * k * nn / peak, (2 * k * nn + 2 * n * (k + nn)) / bw)
               for k, nn in ((8, 16), (8, 8), (8, 32), (16, 8)))
    lm = max(2 * 1 * 8 * 16 / peak, (2 * 8 * 16 + 2 * 1 * (8 + 16)) / bw)
    attn = pairs * 2 * 2 * (4 + 4) / peak
    elem = n * ACT_BYTES * (ELEMENTWISE_HIDDEN_PASSES * 8 + 3 * 16) / bw
    want = gemm + lm + attn + elem
    assert m.step_s(n, pairs, 0, 0) == pytest.approx(want, rel=1e-12)
    assert m.prefill_s([(0, n)]) == pytest.approx(want, rel=1e-12)
    assert sum(m.breakdown(n, pairs).values()) == pytest.approx(want, rel=1e-12)


def test_decode_reads_the_whole_kv_of_every_sequence():
    hw = unit_hw(bf16_tflops=1e9)        # compute is free, only memory counts
    m = PassModel.from_record(TINY, hw)
    one = m.decode_s([100])
    two = m.decode_s([100, 300])
    kv_per_token = m.kv_bytes_per_token
    assert kv_per_token == 1 * (1 * 4 + 1 * 4) * 2          # one layer, one KV head, K and V, bf16
    b1, b2 = m.breakdown(1, 0, 1, 100), m.breakdown(2, 0, 2, 400)
    assert b1["attention_decode"] == pytest.approx(100 * kv_per_token / 1e9)
    assert b2["attention_decode"] == pytest.approx(400 * kv_per_token / 1e9)
    assert two > one


@pytest.mark.parametrize("hwname", ["h100_80gb", "a100_80gb", "l40s_48gb"])
def test_monotone_in_every_input(hwname):
    m = PassModel.from_record(LLAMA8, preset(hwname))
    prev = 0.0
    for n in (1, 16, 256, 1024, 4096, 16384):
        t = m.prefill_s([(0, n)])
        assert t > prev
        prev = t
    assert m.prefill_s([(8192, 1024)]) > m.prefill_s([(0, 1024)])
    prev = 0.0
    for b in (1, 8, 64, 256):
        t = m.decode_s([2048] * b)
        assert t >= prev
        prev = t
    assert m.decode_s([8192] * 32) > m.decode_s([1024] * 32)


def test_tp_splits_the_work_and_pays_all_reduces():
    hw = preset("h100_80gb")
    t1 = PassModel.from_record(LLAMA8, hw)
    t2 = PassModel.from_record(dict(LLAMA8, tp_size=2), hw)
    assert t2.weight_bytes_per_gpu == pytest.approx(t1.weight_bytes_per_gpu / 2, rel=1e-6)
    assert t2.kv_bytes_per_token == t1.kv_bytes_per_token / 2
    p1, p2 = t1.prefill_s([(0, 8192)]), t2.prefill_s([(0, 8192)])
    assert p1 / 2 < p2 < p1                     # faster, but less than twice: the all-reduces
    b = t2.breakdown(8192, PassModel.attn_pairs(0, 8192))
    assert b["allreduce"] > 0 and t1.breakdown(8192, 1)["allreduce"] == 0
    # the all-reduce term is a ring: 2 per layer x 2 (tp-1)/tp x the activations
    unit = unit_hw(nvlink_gbps=10.0)
    u2 = PassModel.from_record(dict(TINY, tp_size=2), unit)
    assert u2.breakdown(4, 10)["allreduce"] == pytest.approx(2 * 1 * (2 * 1 / 2) * 2 * 8 * 4 / 10e9)


def test_l40s_all_reduce_crosses_pcie():
    l40s = preset("l40s_48gb")
    assert l40s.tp_link == "pcie" and l40s.nvlink_gbps is None
    # the ring model (the preset's measured table set aside): PCIe is far slower than NVLink
    ring = dict(l40s.to_dict(), allreduce_table_us=None)
    m = PassModel.from_record(dict(LLAMA8, tp_size=2), ring)
    nv = PassModel.from_record(dict(LLAMA8, tp_size=2), dict(ring, tp_link="nvlink", nvlink_gbps=450.0))
    assert m.breakdown(4096, 1)["allreduce"] > 5 * nv.breakdown(4096, 1)["allreduce"]
    # and the measured tables say the same: an L40S pair against an H100 pair
    h100 = PassModel.from_record(dict(LLAMA8, tp_size=2), preset("h100_80gb"))
    tab = PassModel.from_record(dict(LLAMA8, tp_size=2), l40s)
    assert tab.breakdown(4096, 1)["allreduce"] > 5 * h100.breakdown(4096, 1)["allreduce"]


def test_measured_all_reduce_table_is_interpolated_by_message_size():
    # 8 layers x 2 all-reduces; TINY's hidden is 8 -> 16 bytes a token
    table = {"2": [[160, 10.0], [320, 30.0], [640, 40.0]]}
    m = PassModel.from_record(dict(TINY, tp_size=2), unit_hw(allreduce_table_us=table))
    per_pass = lambda tokens: m.breakdown(tokens, 1)["allreduce"] / (2 * 1e-6)   # noqa: E731  (us per all-reduce)
    assert per_pass(5) == pytest.approx(10.0)           # below the first size: its time
    assert per_pass(10) == pytest.approx(10.0)
    assert per_pass(15) == pytest.approx(20.0)          # halfway between 160 and 320 bytes
    assert per_pass(30) == pytest.approx(35.0)
    assert per_pass(60) == pytest.approx(50.0)          # past the end along the last segment
    # step_s reads the same curve from its piecewise table, exactly
    for tokens in (3, 10, 17, 29, 41, 77):
        assert m.step_s(tokens, 1, 0, 0) == pytest.approx(sum(m.breakdown(tokens, 1).values()), rel=1e-12)
    # a group size the table lacks falls back to the ring model
    t4 = PassModel.from_record(dict(TINY, tp_size=2, num_attention_heads=4, num_key_value_heads=4),
                               unit_hw(allreduce_table_us={"4": table["2"]}, nvlink_gbps=10.0))
    assert t4.breakdown(4, 10)["allreduce"] == pytest.approx(2 * 1 * (2 * 1 / 2) * 2 * 8 * 4 / 10e9)


def test_bad_all_reduce_table_names_the_key():
    for bad in ({"2": [[160, 10.0]]}, {"2": [["x", 1.0], [2, 3]]}, {"2": [[160, -1.0], [320, 2.0]]}):
        with pytest.raises(PassModelError) as err:
            PassModel.from_record(dict(TINY, tp_size=2), unit_hw(allreduce_table_us=bad))
        assert "hardware.allreduce_table_us.2" in str(err.value)


def test_narrow_and_short_k_gemms_run_below_the_peak():
    fast_memory = dict(hbm_bandwidth_gbps=1e6)       # compute-bound GEMMs
    base = PassModel.from_record(dict(LLAMA8, tp_size=8), unit_hw(**fast_memory))
    shaped = PassModel.from_record(dict(LLAMA8, tp_size=8),
                                   unit_hw(gemm_half_outputs=1e5, gemm_k_overhead=256.0, **fast_memory))
    b0, b1 = base.breakdown(1024, 1)["gemm"], shaped.breakdown(1024, 1)["gemm"]
    assert b1 > 1.1 * b0
    # the o projection at TP 8 (K = 512): 1 + 256/512 = 1.5x its FLOP time, plus 1e5/4096 tokens of ramp
    o = [g for g in shaped._gemm_consts if g[4] == "gemm"][1]
    assert o[1] == pytest.approx(2 * 512 * 4096 * 1.5 / 1e12) and o[5] == pytest.approx(1e5 / 4096)


def test_decode_attention_fixed_cost_per_layer():
    m0 = PassModel.from_record(LLAMA8, unit_hw())
    m1 = PassModel.from_record(LLAMA8, unit_hw(attention_decode_layer_us=20.0))
    assert m1.decode_s([1000] * 4) - m0.decode_s([1000] * 4) == pytest.approx(32 * 20e-6)
    assert m1.prefill_s([(0, 100)]) == m0.prefill_s([(0, 100)])


def test_moe_is_costed_by_active_parameters():
    from sglang_hydra.config.compose import compose
    rec, composed = compose(["model=deepseek_v3", "hardware=h200_141gb", "parallel.tp_size=8"])
    m = PassModel.from_record(rec, composed.hardware)
    dense_equiv = dict(hidden_size=7168, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                       head_dim=128, vocab_size=129280, num_parameters=671_000_000_000, tp_size=8,
                       model_path="dense-671b", intermediate_size=(671_000_000_000 // 61) // (3 * 7168))
    dense = PassModel.from_record(dense_equiv, composed.hardware)
    pairs = PassModel.attn_pairs(0, 8192)
    linear = lambda b: b["gemm"] + b["moe"]     # noqa: E731
    # a dense model with all 671B parameters would take ~18x longer in the GEMMs (~37B active)
    ratio = linear(dense.breakdown(8192, pairs)) / linear(m.breakdown(8192, pairs))
    assert 12 < ratio < 25
    # compute grows with the experts per token: 8 routed + 1 shared of 2048 wide, 58 MoE layers
    b = m.breakdown(8192, PassModel.attn_pairs(0, 8192))
    assert b["moe"] > 0 and b["gemm"] > 0
    # decode of one token touches only its 8 experts, not all 256
    one, many = m.breakdown(1, 0, 1, 1000)["moe"], m.breakdown(256, 0, 256, 256000)["moe"]
    assert many > 10 * one


def test_mla_decode_reads_the_latent_cache():
    from sglang_hydra.config.compose import compose
    rec, composed = compose(["model=deepseek_v3", "hardware=h200_141gb", "parallel.tp_size=8"])
    m = PassModel.from_record(rec, composed.hardware)
    # latent 512 + rope 64, fp? no: bf16 KV, all 61 layers, NOT split over TP
    assert m.kv_bytes_per_token == (512 + 64) * 2 * 61
    assert m.decode_s([4096] * 64) > m.decode_s([1024] * 64)


def test_missing_fields_are_named():
    bad = dict(LLAMA8)
    del bad["intermediate_size"]
    with pytest.raises(PassModelError, match=r"model\.intermediate_size is not set"):
        PassModel.from_record(bad, preset("h100_80gb"))
    with pytest.raises(PassModelError, match=r"parallel\.tp_size=3 does not divide model\.num_attention_heads=32"):
        PassModel.from_record(dict(LLAMA8, tp_size=3), preset("h100_80gb"))
    with pytest.raises(PassModelError, match=r"hardware\.bf16_tflops is not set"):
        PassModel.from_record(LLAMA8, dict(name="local", hbm_bandwidth_gbps=100.0))
    moe = dict(LLAMA8, num_experts=8)
    with pytest.raises(PassModelError, match=r"model\.num_experts_per_tok.*model\.moe_intermediate_size"):
        PassModel.from_record(moe, preset("h100_80gb"))



@pytest.mark.parametrize("hwname,tp", [("h100_80gb", 1), ("l40s_48gb", 4), ("a100_80gb", 8)])
def test_piecewise_lookup_equals_the_direct_sum(hwname, tp):
    """step_s reads the token-count terms from a piecewise-linear table: it must be exact."""
    m = PassModel.from_record(dict(LLAMA8, tp_size=tp), preset(hwname))
    for n in (1, 2, 3, 7, 31, 64, 100, 257, 1000, 4096, 8191, 65536, 300000):
        direct = sum(m.breakdown(n, 0, n, n * 10).values())
        assert m.step_s(n, 0, n, n * 10) == pytest.approx(direct, rel=1e-9)
        pairs = PassModel.attn_pairs(0, n)
        assert m.step_s(n, pairs, 0, 0) == pytest.approx(sum(m.breakdown(n, pairs).values()), rel=1e-9)


def test_fits_recover_known_factors():
    """The calibrate fitters get back the factors that generated the timings."""
    from sglang_hydra.perf import fit
    peak, bw = 500e12, 2e12
    truth = dict(gemm_efficiency=0.7, gemm_half_tokens=80.0, memory_efficiency=0.75, kernel_floor_us=6.0,
                 gemm_half_outputs=50_000.0, gemm_k_overhead=200.0)
    samples = [(m, n, k, fit.gemm_s(m, n, k, peak, bw, 2.0, *truth.values()))
               for m in (1, 4, 16, 64, 256, 1024, 4096, 16384)
               for n, k in ((4096, 4096), (14336, 4096), (256, 256), (1024, 14336), (512, 8192))]
    got, rms = fit.fit_gemm(samples, peak, bw, 2.0)
    assert rms < 0.01
    for key in ("gemm_efficiency", "memory_efficiency"):
        assert got[key] == pytest.approx(truth[key], rel=0.05)
    assert got["gemm_half_outputs"] > 0 and got["gemm_k_overhead"] > 0      # both terms are in the data: kept
    samples = [(b, s, 32, 128, fit.prefill_attention_s(b, s, 32, 128, peak, 0.6, 300.0, 6.0))
               for b in (1, 4) for s in (256, 1024, 4096, 16384)]
    got, rms = fit.fit_prefill_attention(samples, peak, 6.0)
    assert rms < 0.01 and got["attention_prefill_efficiency"] == pytest.approx(0.6, rel=0.05)
    samples = [(b, b * c, 32768.0, fit.decode_attention_s(b, b * c, 32768.0, bw, 0.8, 0.2, 6.0))
               for b in (1, 8, 64, 256) for c in (128, 1024, 8192)]
    got, rms = fit.fit_decode_attention(samples, bw, 6.0)
    assert rms < 0.01 and got["attention_decode_efficiency"] == pytest.approx(0.8, rel=0.05)
    # no occupancy or per-layer term generated these timings: they are dropped (exactly 0), not left at 1e-19
    assert got["attention_decode_half_ctas"] == 0.0 and got["attention_decode_layer_us"] == 0.0


def test_fitted_efficiencies_stay_below_their_physical_bound():
    """Timings faster than the datasheet allows do not push an efficiency to (or past) its bound of 1."""
    from sglang_hydra.perf import fit
    peak, bw = 500e12, 2e12
    samples = [(b, b * c, 32768.0, 0.5 * b * c * 32768.0 / bw) for b in (1, 8, 64) for c in (1024, 8192)]
    got, _ = fit.fit_decode_attention(samples, bw, 0.0)
    assert got["attention_decode_efficiency"] <= fit.EFFICIENCY_MAX["memory"] < 1.0


@pytest.mark.parametrize("hwname", ["h100_80gb", "a100_80gb", "l40s_48gb"])
def test_the_fitted_gemm_formula_is_the_pass_models(hwname):
    """perf/fit.py fits exactly what PassModel evaluates: every GEMM of the model, every token count."""
    from sglang_hydra.perf import fit
    hw = preset(hwname).to_dict()
    m = PassModel.from_record(dict(LLAMA8, tp_size=2), hw)
    peak, bw = hw["bf16_tflops"] * 1e12, hw["hbm_bandwidth_gbps"] * 1e9
    for g, (count, c, w, a, _cls, h) in zip(m.gemms, m._gemm_consts):
        for tokens in (1, 7, 64, 300, 4096, 32768):
            ours = max(c * (tokens + h), w + a * tokens, m._floor)
            theirs = fit.gemm_s(tokens, g.n, g.k, peak, bw, 2.0, hw["gemm_efficiency"], hw["gemm_half_tokens"],
                                hw["memory_efficiency"], hw["kernel_floor_us"], hw["gemm_half_outputs"],
                                hw["gemm_k_overhead"])
            assert theirs == pytest.approx(ours, rel=1e-12), (g.name, tokens)


def test_the_fitted_decode_formula_is_the_pass_models():
    from sglang_hydra.perf import fit
    hw = preset("h200_141gb").to_dict()
    m = PassModel.from_record(dict(LLAMA8, tp_size=1), hw)
    bw = hw["hbm_bandwidth_gbps"] * 1e9
    kv_heads = 8
    for seqs in (1, 3, 8, 40, 256):
        ctx = 2048
        per_layer = m.kv_bytes_per_token / m.layers
        theirs = m.layers * fit.decode_attention_s(
            seqs, seqs * ctx, per_layer, bw, hw["attention_decode_efficiency"], hw["attention_decode_seq_us"], 0.0,
            hw["attention_decode_half_ctas"], kv_heads, hw["attention_decode_layer_us"],
            hw["attention_decode_split_below"], hw["attention_decode_split_ctas"])
        ours = m.breakdown(seqs, 0, seqs, seqs * ctx)["attention_decode"]
        assert theirs == pytest.approx(ours, rel=1e-9), seqs


MODEL_PRESETS = ["llama3_1_8b", "llama3_1_70b", "qwen3_8b", "qwen3_32b", "llama3_8b", "qwen2_7b", "deepseek_v3",
                 "tiny", "tiny_mla"]


@pytest.mark.parametrize("name", MODEL_PRESETS)
def test_model_presets_load_cite_config_json_and_are_costable(name):
    from sglang_hydra.config.compose import compose
    from sglang_hydra.config.presets import conf_dir
    text = (conf_dir() / "model" / f"{name}.yaml").read_text()
    if not name.startswith("tiny"):
        assert "config.json" in text and "huggingface.co" in text      # each shape's published source
    rec, composed = compose([f"model={name}", "hardware=h200_141gb", "parallel.tp_size=8" if name in
                             ("llama3_1_70b", "deepseek_v3") else "parallel.tp_size=1"])
    m = PassModel.from_record(rec, composed.hardware)
    assert 0 < m.prefill_s([(0, 1024)]) < 10 and 0 < m.decode_s([1024] * 8) < 1


def test_new_presets_have_the_published_shapes():
    from sglang_hydra.config.compose import compose
    rec, _ = compose(["model=llama3_1_70b"])
    assert (rec.hidden_size, rec.intermediate_size, rec.num_hidden_layers, rec.num_attention_heads,
            rec.num_key_value_heads, rec.vocab_size, rec.max_position_embeddings) == \
        (8192, 28672, 80, 64, 8, 128256, 131072)
    rec, _ = compose(["model=qwen3_8b"])
    assert (rec.hidden_size, rec.intermediate_size, rec.num_hidden_layers, rec.head_dim, rec.vocab_size) == \
        (4096, 12288, 36, 128, 151936)


@pytest.mark.parametrize("name", ["h100_80gb", "h200_141gb", "a100_80gb", "l40s_48gb"])
def test_gpu_presets_state_where_their_efficiencies_come_from(name):
    from sglang_hydra.config.presets import conf_dir
    text = (conf_dir() / "hardware" / f"{name}.yaml").read_text()
    assert "scripts/fit_pass_model.py" in text and "aiconfigurator" in text
    assert "scripts/refine_pass_model.py" in text
    assert "nic_gbps" in text and ("ConnectX" in text or "ASSUMED" in text)


def test_small_decode_batches_split_along_the_context():
    # 8 KV heads at TP 1: 4 sequences = 32 blocks, below split_below=54: they occupy like 200 blocks
    hw = unit_hw(hbm_bandwidth_gbps=1e6, bf16_tflops=1e6, attention_decode_half_ctas=40.0)   # memory-bound read
    plain = PassModel.from_record(LLAMA8, hw)
    split = PassModel.from_record(LLAMA8, dict(hw, attention_decode_split_below=54.0, attention_decode_split_ctas=200.0))
    kv = 4 * 8000
    b_plain, b_split = plain.breakdown(4, 0, 4, kv)["attention_decode"], split.breakdown(4, 0, 4, kv)["attention_decode"]
    read = kv * plain.kv_bytes_per_token / 1e15
    assert b_plain == pytest.approx(read * (1 + 40 / 32))
    assert b_split == pytest.approx(read * (1 + 40 / 200))
    # at or above the threshold the batch's own blocks count
    many = 16 * 8000
    assert split.breakdown(16, 0, 16, many)["attention_decode"] == plain.breakdown(16, 0, 16, many)["attention_decode"]
    assert split.step_s(4, 0, 4, kv) == pytest.approx(sum(split.breakdown(4, 0, 4, kv).values()))


def test_scaled_pass_model_times_every_pass_and_breaks_down():
    from sglang_hydra.config.compose import compose
    from sglang_hydra.perf.pass_time import PassModel

    rec, composed = compose(["model=llama3_1_8b", "hardware=h100_80gb"])
    pm = PassModel.from_record(rec, composed.hardware)
    slow = pm.scaled(1.1)
    assert pm.scaled(1.0) is pm and pm.time_scale == 1.0
    for args in ((4096, pm.attn_pairs(0, 4096), 0, 0), (64, 0, 64, 64 * 4300), (2112, pm.attn_pairs(0, 2048), 64, 64 * 4300)):
        assert slow.step_s(*args) == pytest.approx(1.1 * pm.step_s(*args), rel=1e-12)
        parts = slow.breakdown(*args)
        assert sum(parts.values()) == pytest.approx(slow.step_s(*args), rel=1e-9)
        assert parts["role_overhead"] == pytest.approx(0.1 * pm.step_s(*args), rel=1e-9)


def _general_step_s(m, n, kv):
    """step_s's general branch for a decode-only pass, as it was before decode passes were memoised."""
    from bisect import bisect_right
    t = m._pw_slope[bisect_right(m._pw_breaks, n)] * n + m._pw_icept[bisect_right(m._pw_breaks, n)]
    if m._moe is not None:
        t += m._moe_s(n)
    c, w, a = m._lm
    x, y = c * (n + m._lm_half), w + a * n
    t += x if x > y else y
    occ = m._dec_split_seqs if n < m._dec_split_below else n
    x = kv * m._dec_kv_s * (1.0 + m._dec_half_seqs / occ) + n * m._dec_seq_s + m._dec_layer_s
    y = kv * m._dec_flop_s
    if y > x:
        x = y
    t += x if x > m._attn_floor else m._attn_floor
    return t * m.time_scale


@pytest.mark.parametrize("model,hwname,tp", [("llama3_1_8b", "h100_80gb", 1), ("llama3_1_8b", "l40s_48gb", 2),
                                             ("llama3_1_8b", "a100_80gb", 8), ("deepseek_v3", "h200_141gb", 8)])
def test_memoised_decode_passes_are_the_same_floats(model, hwname, tp):
    """Decode-only passes read their batch-size terms from a memo (the simulation's speed-up): the
    result must be the very float the general formula gives, first call and memoised alike, so a
    simulation's figures do not move by a bit."""
    import random
    from sglang_hydra.config.compose import compose
    rec, composed = compose([f"model={model}", f"hardware={hwname}", f"parallel.tp_size={tp}"])
    m = PassModel.from_record(rec, composed.hardware)
    rng = random.Random(0)
    cases = [(n, n * ctx) for n in (1, 2, 3, 5, 8, 13, 31, 64, 127, 256, 300, 1000, 4096)
             for ctx in (1, 100, 4097, 30000)] + [(rng.randint(1, 2048), rng.randint(1, 10 ** 7)) for _ in range(400)]
    for rep in range(2):                     # the first call fills the memo, the second reads it
        for n, kv in cases:
            assert m.step_s(n, 0, n, kv) == _general_step_s(m, n, kv), (n, kv, rep)
            assert m.step_s(n, 0, n, kv, prefill_seqs=0) == _general_step_s(m, n, kv)
    # passes with a prefill part never take the decode memo
    assert m.step_s(65, PassModel.attn_pairs(0, 1), 64, 6400) != m.step_s(64, 0, 64, 6400)
    assert m.step_s(0, 0, 0, 0) == 0.0


@pytest.mark.parametrize("name", ["h100_80gb", "h200_141gb", "a100_80gb", "l40s_48gb"])
def test_gpu_presets_hold_physical_values(name):
    """Every efficiency below its bound; no vanishing coefficient (a term is there or exactly 0); no
    per-pass PD scale (the PD cost is the simulated transfer) and no fitted per-pass overhead."""
    from sglang_hydra.perf.fit import EFFICIENCY_MAX
    hw = preset(name).to_dict()
    for key in ("gemm_efficiency", "attention_prefill_efficiency", "allreduce_efficiency"):
        assert 0 < hw[key] <= EFFICIENCY_MAX["compute"] < 1, key
    for key in ("memory_efficiency", "attention_decode_efficiency"):
        assert 0 < hw[key] <= EFFICIENCY_MAX["memory"] < 1, key
    for key in ("gemm_half_tokens", "gemm_half_outputs", "gemm_k_overhead", "attention_prefill_extra_pairs",
                "attention_prefill_layer_us", "attention_decode_seq_us", "attention_decode_half_ctas",
                "attention_decode_layer_us", "attention_decode_split_ctas", "kernel_floor_us"):
        assert hw[key] == 0 or hw[key] >= 1e-3, (key, hw[key])
    if hw["attention_decode_half_ctas"] == 0:         # no occupancy term: nothing for a split to change
        assert hw["attention_decode_split_ctas"] == hw["attention_decode_split_below"] == 0
    assert hw["disagg_prefill_pass_scale"] == hw["disagg_decode_pass_scale"] == 1.0
    assert hw["pass_overhead_us"] == 0
