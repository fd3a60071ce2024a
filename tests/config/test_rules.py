"""Every resolution rule: the reference's outcome, and our (clearer) error texts."""
import json

import pytest

from sglang_hydra import ConfigError, compose_record
from sglang_hydra.config.testing import make_record


def problems(**fields):
    with pytest.raises(ConfigError) as ei:
        make_record(**fields)
    return ei.value.problems


def one(**fields):
    ps = problems(**fields)
    return ps


def has(ps, key, text):
    assert any(p.key == key and text in p.message for p in ps), [str(p) for p in ps]


# ---- M-HR
@pytest.mark.parametrize("given,ratio,fraction", [
    ({}, 2.0, 0.8),
    ({"hicache_host_memory_mode": "buffer_only"}, 1.2, 0.8),
    ({"hicache_size": 10}, 2.0, None),
    ({"hicache_ratio": 3.0}, 3.0, None),
    ({"disaggregation_mode": "decode", "disaggregation_transfer_backend": "fake"}, None, 0.8),
    ({"hicache_host_memory_fraction": None}, 2.0, None),
])
def test_m_hr_defaults(given, ratio, fraction):
    r = make_record(**given)
    assert r.hicache_ratio == ratio
    assert r.hicache_host_memory_fraction == fraction


def test_m_hr_bad_fraction_fails_even_with_ratio():
    ps = problems(hicache_host_memory_fraction=1.5, hicache_ratio=2.0)
    has(ps, "memory.hicache_host_memory_fraction", "outside (0, 1]")
    assert ps[0].flag == "--hicache-host-memory-fraction"


# ---- D-PD
def test_d_pd1_mooncake_tcp():
    r = make_record(disaggregation_transfer_backend="mooncake_tcp", disaggregation_mode="prefill")
    assert r.disaggregation_transfer_backend == "mooncake" and r.disaggregation_ib_device is None
    assert r.raw_input["disaggregation_transfer_backend"] == "mooncake_tcp"


def test_d_pd2_prefill_complete_forces_optimistic_prefill():
    r = make_record(disaggregation_mode="prefill", disaggregation_decode_allocation_policy="prefill_complete")
    assert r.optimistic_prefill_attempts == 1


def test_d_pd12_lists_every_unsupported_feature():
    ps = problems(disaggregation_decode_allocation_policy="prefill_complete", tp_size=2,
                  disaggregation_transfer_backend="nixl")
    msg = next(p.message for p in ps if p.key == "disagg.disaggregation_decode_allocation_policy")
    for part in ("aggregated serving", "other than Mooncake", "tensor parallelism"):
        assert part in msg


def test_d_pd4_threshold():
    has(problems(disaggregation_decode_host_receive_threshold=1.5),
        "disagg.disaggregation_decode_host_receive_threshold", "outside [0, 1]")
    has(problems(disaggregation_decode_host_receive_threshold=0.5, enable_hisparse=True, disaggregation_mode="decode"),
        "disagg.disaggregation_decode_host_receive_threshold", "hisparse")
    has(problems(disaggregation_decode_host_receive_threshold=0.5, disaggregation_mode="decode",
                 disaggregation_decode_retraction_backup="cpu_tensor"),
        "disagg.disaggregation_decode_retraction_backup", "host_pool")
    r = make_record(disaggregation_decode_host_receive_threshold=0.5, disaggregation_mode="decode",
                    disaggregation_decode_retraction_backup="none")
    assert r.disaggregation_decode_retraction_backup == "host_pool"
    assert r.hicache_mem_layout == "layer_first"  # M-HC7
    # outside decode, M-CC1 rejects the forced host_pool
    has(problems(disaggregation_decode_host_receive_threshold=0.5),
        "disagg.disaggregation_decode_retraction_backup", "decode server")


def test_d_pd5_decode_dcp_backend():
    from sglang_hydra.config import choices
    choices.add_disagg_transfer_backend_choices("zmq")
    has(problems(disaggregation_mode="decode", dcp_size=2, disaggregation_transfer_backend="zmq"),
        "disagg.disaggregation_transfer_backend", "--dcp-size > 1")


def test_d_pd6_decode_radix_cache():
    r = make_record(disaggregation_mode="decode")
    assert r.disable_radix_cache is True
    r = make_record(disaggregation_mode="decode", disaggregation_decode_enable_radix_cache=True, disable_radix_cache=True)
    assert r.disable_radix_cache is False
    has(problems(disaggregation_mode="decode", disaggregation_decode_enable_radix_cache=True,
                 disaggregation_transfer_backend="fake"), "disagg.disaggregation_decode_enable_radix_cache", "fake")


@pytest.mark.parametrize("mrr,dp,attn_dp,extra", [(None, 1, 1, 0), (16, 1, 1, 32), (64, 2, 1, 64), (100, 1, 1, 0), (8, 2, 4, 2)])
def test_d_pd7_extra_slots(mrr, dp, attn_dp, extra):
    r = make_record(disaggregation_mode="decode", max_running_requests=mrr, dp_size=dp, attn_dp_size=attn_dp)
    assert r.disaggregation_decode_extra_slots == extra


def test_d_pd8_prefill_fake_rejected():
    has(problems(disaggregation_mode="prefill", disaggregation_transfer_backend="fake"),
        "disagg.disaggregation_transfer_backend", "prefill server cannot use 'fake'")


def test_d_pd9_staging_buffer_env():
    from sglang_hydra.config.compose import record_from_values
    with pytest.raises(ConfigError) as ei:
        record_from_values({"disaggregation_mode": "decode", "disaggregation_transfer_backend": "fake"},
                           env={"SGLANG_DISAGG_STAGING_BUFFER": "1"})
    assert "SGLANG_DISAGG_STAGING_BUFFER" in str(ei.value)


def test_d_pd10_role_switch():
    ps = problems(disaggregation_mode="prefill", enable_pd_role_switch=True, pp_size=2, ep_size=2)
    msg = next(p.message for p in ps if p.key == "disagg.enable_pd_role_switch")
    assert "expert parallelism (--ep-size 2)" in msg and "pipeline parallelism (--pp-size 2)" in msg
    make_record(enable_pd_role_switch=True, pp_size=2)  # not checked without a PD role


def test_d_pd11_rust_server_bootstrap_port():
    from sglang_hydra.config.compose import record_from_values
    env = {"SGLANG_RUST_SERVER": "1"}
    r = record_from_values({"disaggregation_mode": "prefill", "port": 31000}, env=env)
    assert r.disaggregation_bootstrap_port == 31000
    with pytest.raises(ConfigError, match="conflicts with --port"):
        record_from_values({"disaggregation_mode": "prefill", "port": 31000, "disaggregation_bootstrap_port": 9000}, env=env)


# ---- M-HC
def test_m_hc_layout_io_switches():
    r = make_record(enable_hierarchical_cache=True, hicache_mem_layout="page_first_direct")
    assert r.hicache_io_backend == "direct"
    r = make_record(enable_hierarchical_cache=True, hicache_io_backend="direct")
    assert r.hicache_mem_layout == "page_first_direct"
    r = make_record(enable_hierarchical_cache=True, hicache_mem_layout="layer_first", hicache_storage_backend="mooncake")
    assert r.hicache_mem_layout == "page_first"
    r = make_record(enable_hierarchical_cache=True, hicache_mem_layout="layer_first", hicache_storage_backend="mooncake",
                    hicache_io_backend="direct")
    assert r.hicache_mem_layout == "page_first_direct"
    r = make_record(enable_hierarchical_cache=True, hicache_io_backend="direct", enable_unified_memory=True,
                    attention_backend="triton")
    assert (r.hicache_mem_layout, r.hicache_io_backend) == ("page_first", "kernel")
    # untouched without a host tier
    r = make_record(hicache_mem_layout="page_first_direct")
    assert r.hicache_io_backend == "kernel"


def test_m_hc_rewrites_are_logged(caplog):
    caplog.set_level("WARNING", logger="sglang_hydra.config")
    make_record(enable_hierarchical_cache=True, hicache_mem_layout="page_first_direct")
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("memory.hicache_io_backend: 'kernel' -> 'direct'" in m for m in msgs) == 1


def test_m_hc6_buffer_only():
    has(problems(enable_hierarchical_cache=True, hicache_host_memory_mode="buffer_only"),
        "memory.hicache_storage_backend", "storage backend is required")
    r = make_record(enable_hierarchical_cache=True, hicache_host_memory_mode="buffer_only",
                    hicache_storage_backend="file", hicache_write_policy="write_back")
    assert r.hicache_write_policy == "write_through"


def test_m_hc1_to_4_linker():
    has(problems(enable_linker_mla_dedup=True), "memory.enable_linker_mla_dedup", "Mooncake linker")
    has(problems(unified_cache_external_linker_backend="dynamic", enable_unified_cache_external_linker=True,
                 unified_cache_external_linker_config={"linker": "X", "bogus": 1}),
        "memory.unified_cache_external_linker_config", "unknown keys ['bogus']")
    ps = problems(enable_unified_cache_external_linker=True, enable_hierarchical_cache=True, hicache_storage_backend="file")
    has(ps, "memory.enable_unified_cache_external_linker", "exclude each other")
    has(ps, "memory.hicache_storage_backend", "not used by the external linker")


def test_m_hc11_decode_receive_with_mooncake_storage_fails():
    ps = problems(disaggregation_mode="decode", disaggregation_decode_host_receive_threshold=0.5,
                  hicache_storage_backend="mooncake", disaggregation_decode_enable_radix_cache=True)
    has(ps, "memory.hicache_mem_layout", "layer_first")


def test_m_hc12_dcp_needs_mla():
    has(problems(enable_hierarchical_cache=True, dcp_size=2), "parallel.dcp_size", "MLA")


# ---- M-CC
def test_m_cc_rules():
    has(problems(disaggregation_decode_retraction_backup="host_pool"),
        "disagg.disaggregation_decode_retraction_backup", "decode server")
    has(problems(enable_hierarchical_cache=True, disable_radix_cache=True), "memory.enable_hierarchical_cache", "radix cache")
    # decode + hicache needs the decode radix cache (D-PD6 disables it otherwise)
    has(problems(enable_hierarchical_cache=True, disaggregation_mode="decode"), "memory.enable_hierarchical_cache",
        "--disaggregation-decode-enable-radix-cache")
    has(problems(disaggregation_decode_enable_offload_kvcache=True), "disagg.disaggregation_decode_enable_offload_kvcache",
        "decode servers")
    has(problems(swa_full_tokens_ratio=1.5), "schedule.swa_full_tokens_ratio", "outside (0, 1]")
    ps = problems(enable_lmcache=True, enable_hierarchical_cache=True)
    has(ps, "memory.enable_lmcache", "exclude each other")


def test_m_cc4_tlru_and_policy_kwargs_checked_early():
    has(problems(radix_eviction_policy="tlru"), "memory.radix_eviction_policy_config", "greater than 'next_prompt_estimate'")
    ok = make_record(radix_eviction_policy="tlru", radix_eviction_policy_config={"threshold": 8192, "next_prompt_estimate": 512})
    assert ok.radix_eviction_policy_config["threshold"] == 8192
    # The reference only fails later with a bare TypeError; here the key and the policy are named.
    ps = problems(radix_eviction_policy="slru", radix_eviction_policy_config={"foo": 1})
    has(ps, "memory.radix_eviction_policy_config", "unknown key 'foo' in radix_eviction_policy_config for eviction policy 'slru'")
    ps = problems(radix_eviction_policy="lru", radix_eviction_policy_config={"bogus": 1})
    has(ps, "memory.radix_eviction_policy_config", "unknown key 'bogus'")
    ps = problems(radix_eviction_policy="slru", radix_eviction_policy_config={"protected_threshold": 0})
    has(ps, "memory.radix_eviction_policy_config", "'protected_threshold'")
    assert ps[0].flag == "--radix-eviction-policy-config"


# ---- M-PM / M-UM
def test_m_pm_and_m_um():
    has(problems(enable_page_major_kv_layout=True), "memory.enable_page_major_kv_layout", "--enable-unified-memory")
    r = make_record(enable_unified_memory=True, attention_backend="triton")
    assert r.enable_page_major_kv_layout is True
    has(problems(enable_unified_memory=True, disaggregation_mode="prefill", disaggregation_transfer_backend="nixl"),
        "memory.enable_unified_memory", "mooncake")
    has(problems(enable_unified_memory=True, enable_two_batch_overlap=True), "memory.enable_unified_memory", "two-batch")
    has(problems(enable_unified_memory=True, speculative_algorithm="ngram"), "memory.enable_unified_memory", "'NGRAM'")


def test_x_cpu_attention_default_feeds_m_pm():
    # Without sgl-kernel's AMX ops the reference ends on torch_native for a CPU device,
    # which the page-major layout rejects (found by the differential test).
    assert make_record(device="cpu").attention_backend == "torch_native"
    assert make_record(device="cpu", attention_backend="triton").attention_backend == "triton"
    assert make_record(device="cuda").attention_backend is None
    has(problems(device="cpu", enable_unified_memory=True), "memory.enable_page_major_kv_layout", "torch_native")


# ---- D-ENC, D-OPT, D-SPEC, X-DRC, X-DLLM, X-RS
def test_d_enc():
    has(problems(encoder_only=True, language_only=True), "disagg.encoder_only", "exclude each other")
    has(problems(encoder_only=True), "disagg.encoder_only", "does not support LlamaForCausalLM")
    r = make_record(encoder_only=True, architecture="Qwen2VLForConditionalGeneration")
    assert r.encoder_transfer_backend == "zmq_to_scheduler"
    r = make_record(architecture="KimiK3ForConditionalGeneration", tp_size=2)
    assert r.encoder_transfer_backend == "zmq_to_tokenizer"
    has(problems(enable_prefix_mm_cache=True), "mm.enable_prefix_mm_cache", "--encoder-only")


def test_d_enc4_ib_devices(tmp_path):
    from sglang_hydra.config.compose import record_from_values
    (tmp_path / "mlx5_0").mkdir()
    (tmp_path / "mlx5_1").mkdir()
    env = {"SGLANG_HYDRA_IB_SYSFS": str(tmp_path)}
    base = {"disaggregation_mode": "prefill"}
    r = record_from_values({**base, "disaggregation_ib_device": " mlx5_0, mlx5_0,mlx5_1"}, env=env)
    assert r.disaggregation_ib_device == "mlx5_0,mlx5_1"
    r = record_from_values({**base, "disaggregation_ib_device": '{"0": "mlx5_0", "1": "mlx5_1"}'}, env=env)
    assert json.loads(r.disaggregation_ib_device) == {"0": "mlx5_0", "1": "mlx5_1"}
    with pytest.raises(ConfigError, match="unknown RDMA devices for all GPUs: mlx5_9"):
        record_from_values({**base, "disaggregation_ib_device": "mlx5_9"}, env=env)
    with pytest.raises(ConfigError, match="does not exist"):
        record_from_values({**base, "disaggregation_ib_device": "mlx5_0"}, env={"SGLANG_HYDRA_IB_SYSFS": str(tmp_path / "none")})


def test_d_opt():
    r = make_record(disaggregation_mode="prefill", optimistic_prefill_attempts=2, pp_size=2)
    assert r.optimistic_prefill_attempts == 0
    r = make_record(disaggregation_mode="prefill", optimistic_prefill_attempts=2, enable_hierarchical_cache=True,
                    hicache_storage_backend="file")
    assert r.optimistic_prefill_attempts == 0
    has(problems(disaggregation_mode="prefill", disaggregation_decode_allocation_policy="prefill_complete", pp_size=2),
        "disagg.disaggregation_decode_allocation_policy", "optimistic prefill")


def test_d_spec():
    r = make_record(speculative_algorithm="nextn")
    assert r.speculative_algorithm == "EAGLE"
    has(problems(disaggregation_mode="decode", disaggregation_decode_enable_radix_cache=True, speculative_algorithm="ngram"),
        "disagg.disaggregation_decode_enable_radix_cache", "NGRAM")


def test_x_drc_writers():
    assert make_record(enable_mis=True).disable_radix_cache is True
    assert make_record(enable_deterministic_inference=True, attention_backend="flashinfer").disable_radix_cache is True
    assert make_record(enable_deterministic_inference=True, attention_backend="fa3").disable_radix_cache is False
    assert make_record(architecture="WhisperForConditionalGeneration").disable_radix_cache is True


def test_x_dllm_and_x_rs():
    r = make_record(dllm_algorithm="LowConfidence", enable_hierarchical_cache=True, disaggregation_mode="prefill")
    assert r.enable_hierarchical_cache is False and r.disaggregation_mode == "null"
    has(problems(enable_response_store=True, disaggregation_mode="prefill"), "serving.enable_response_store", "PD")


def test_x_dp_folds_deprecated_flag():
    r = compose_record(argv=["--enable-dp-attention", "--dp-size", "4"])
    # the record reports the switch as the engine's resolved_dict does: attention DP runs
    assert (r.attn_dp_size, r.dp_size, r.enable_dp_attention) == (4, 1, True)
    assert [e for e in r.resolution_log if e[1] == "enable_dp_attention"][0][3] is False  # folded first


# ---- RT-5 / RT-8
def test_rt5_extra_config_sources(tmp_path):
    (tmp_path / "c.json").write_text('{"prefetch_threshold": 64, "x": 1}')
    (tmp_path / "c.yaml").write_text("prefetch_threshold: 32\n")
    (tmp_path / "c.toml").write_text("prefetch_threshold = 16\n")
    (tmp_path / "c.ini").write_text("")
    from sglang_hydra.config.extra_config import parse_extra_config
    assert parse_extra_config(f"@{tmp_path / 'c.json'}").prefetch_threshold == 64
    assert parse_extra_config(f"@{tmp_path / 'c.json'}").backend == {"x": 1}
    assert parse_extra_config(f"@{tmp_path / 'c.yaml'}").prefetch_threshold == 32
    assert parse_extra_config(f"@{tmp_path / 'c.toml'}").prefetch_threshold == 16
    has(problems(hicache_storage_backend_extra_config=f"@{tmp_path / 'c.ini'}"),
        "memory.hicache_storage_backend_extra_config", "unsupported config format .ini")
    has(problems(hicache_storage_backend_extra_config='{"prefetch_threshold": "many"}'),
        "memory.hicache_storage_backend_extra_config", "'prefetch_threshold' must be an integer")
    has(problems(hicache_storage_backend_extra_config='{bad'), "memory.hicache_storage_backend_extra_config", "not valid JSON")
    has(problems(hicache_storage_backend="dynamic", hicache_storage_backend_extra_config='{}'),
        "memory.hicache_storage_backend_extra_config", "module_path")


def test_rt8_hisparse_config():
    has(problems(hisparse_config='{"top_k": 10, "device_buffer_size": 5}'), "memory.hisparse_config", "at least top_k")
    has(problems(hisparse_config='{"swap_in_block_size": 2000}'), "memory.hisparse_config", "[1, 1024]")


def test_all_problems_reported_together():
    ps = problems(hicache_host_memory_fraction=2.0, disaggregation_decode_host_receive_threshold=3.0,
                  enable_page_major_kv_layout=True, radix_eviction_policy="tlru")
    keys = {p.key for p in ps}
    assert {"memory.hicache_host_memory_fraction", "disagg.disaggregation_decode_host_receive_threshold",
            "memory.enable_page_major_kv_layout", "memory.radix_eviction_policy_config"} <= keys


def test_dummy_model_path_is_fully_validated():
    # The reference skips most rules for --model-path dummy; sglang-hydra validates every record the same way.
    with pytest.raises(ConfigError):
        make_record(model_path="dummy", enable_hierarchical_cache=True, disable_radix_cache=True)


def test_model_geometry_from_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 3,
        "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 256, "max_position_embeddings": 2048}))
    r = make_record(model_path=str(tmp_path))
    assert (r.num_hidden_layers, r.num_key_value_heads, r.head_dim, r.architecture) == (3, 2, 32, "Qwen2ForCausalLM")
    r = compose_record(argv=["--model-path", str(tmp_path), "model.num_hidden_layers=5"])
    assert r.num_hidden_layers == 5  # an explicit setting wins over the checkpoint
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(ConfigError, match="cannot read"):
        make_record(model_path=str(tmp_path))


# ---- M-SZ: sizes that can never work fail when the record is resolved
def test_msz_ratio_must_be_positive():
    for bad in (0.0, -1.5):
        ps = problems(hicache_ratio=bad)
        has(ps, "memory.hicache_ratio", "greater than 0")
        assert ps[0].flag == "--hicache-ratio" and repr(bad) in ps[0].message


def test_msz_ratio_below_one_only_where_the_host_tier_mirrors_the_device_pool():
    ps = problems(enable_hierarchical_cache=True, hicache_ratio=0.5)
    has(ps, "memory.hicache_ratio", "'cache' host memory mode")
    assert "0.5" in ps[0].message and ">= 1" in ps[0].message
    # allowed: a size wins over the ratio; buffer_only only stages pages; HiCache off; decode backup pools
    assert make_record(enable_hierarchical_cache=True, hicache_ratio=0.5, hicache_size=2).hicache_size == 2
    assert make_record(enable_hierarchical_cache=True, hicache_ratio=0.5, hicache_host_memory_mode="buffer_only",
                       hicache_storage_backend="file").hicache_ratio == 0.5
    assert make_record(hicache_ratio=0.5).hicache_ratio == 0.5
    assert make_record(enable_hierarchical_cache=True, hicache_ratio=1.0).hicache_ratio == 1.0


def test_msz_negative_size_and_a_pool_below_one_page():
    has(problems(hicache_size=-1), "memory.hicache_size", "-1 is negative")
    ps = problems(max_total_tokens=15, page_size=16)
    has(ps, "schedule.max_total_tokens", "smaller than one page (16 tokens")
    assert ps[0].flag == "--max-total-tokens" and "0 pages" in ps[0].message
    assert make_record(max_total_tokens=16, page_size=16).max_total_tokens == 16
    # the legacy flags go the same way, and every problem of a command comes together
    with pytest.raises(ConfigError) as ei:
        compose_record(argv=["--hicache-ratio", "-2", "--hicache-size", "-3", "--max-total-tokens", "3",
                             "--page-size", "4"])
    assert {p.key for p in ei.value.problems} == {"memory.hicache_ratio", "memory.hicache_size",
                                                  "schedule.max_total_tokens"}


def test_checkpoint_config_fills_model_size_fields(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(
        num_hidden_layers=2, num_key_value_heads=2, hidden_size=64, num_attention_heads=4,
        intermediate_size=256, vocab_size=32000)))
    r = make_record(model_path=str(tmp_path))
    assert (r.num_parameters, r.hidden_size, r.num_attention_heads) == (4219200, 64, 4)   # = the tiny preset's shape
