"""The declared fields match the reference engine's surface, and the record behaves as a record."""
import dataclasses
import pickle

import pytest

from sglang_hydra import ServerArgs, get_disagg, get_memory, namespace_of
from sglang_hydra.config.field_order import POSITIONAL_FIELD_ORDER
from sglang_hydra.config.fields import Disagg, Memory
from sglang_hydra.config.legacy import legacy_parser
from sglang_hydra.config.testing import make_record

# (field, default, flags, store_true, choices) for every memory/disagg field of the reference.
REFERENCE = [
    ("radix_eviction_policy", "lru", ["--radix-eviction-policy"], False, ["lru", "lfu", "slru", "priority", "tlru"]),
    ("radix_eviction_policy_config", None, ["--radix-eviction-policy-config"], False, None),
    ("disable_radix_cache", False, ["--disable-radix-cache"], True, None),
    ("enable_page_major_kv_layout", False, ["--enable-page-major-kv-layout"], True, None),
    ("enable_unified_memory", False, ["--enable-unified-memory"], True, None),
    ("enable_session_radix_cache", False, ["--enable-session-radix-cache"], True, None),
    ("radix_cache_backend", None, ["--radix-cache-backend"], False, None),
    ("enable_hierarchical_cache", False, ["--enable-hierarchical-cache", "--enable-hicache"], True, None),
    ("hicache_host_memory_mode", "cache", ["--hicache-host-memory-mode"], False, ["cache", "buffer_only"]),
    ("hicache_ratio", None, ["--hicache-ratio"], False, None),
    ("hicache_size", 0, ["--hicache-size"], False, None),
    ("hicache_host_memory_fraction", 0.8, ["--hicache-host-memory-fraction"], False, None),
    ("hicache_write_policy", "write_through", ["--hicache-write-policy"], False, ["write_back", "write_through", "write_through_selective"]),
    ("hicache_io_backend", "kernel", ["--hicache-io-backend"], False, ["direct", "kernel", "kernel_ascend"]),
    ("hicache_mem_layout", "page_first", ["--hicache-mem-layout"], False, ["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"]),
    ("hicache_storage_backend", None, ["--hicache-storage-backend"], False, ["file", "sim", "mooncake", "npu_memcache", "hf3fs", "nixl", "aibrix", "dynamic", "eic", "simm", "mori", "shm", "tensorcast", "seaweedfs"]),
    ("hicache_storage_prefetch_policy", "timeout", ["--hicache-storage-prefetch-policy"], False, ["best_effort", "wait_complete", "timeout"]),
    ("hicache_storage_backend_extra_config", None, ["--hicache-storage-backend-extra-config"], False, None),
    ("hicache_storage_prefetch_retry_poll_interval", 8, ["--hicache-storage-prefetch-retry-poll-interval"], False, None),
    ("hicache_storage_prefetch_retry_max_attempts", 8, ["--hicache-storage-prefetch-retry-max-attempts"], False, None),
    ("enable_unified_cache_external_linker", False, ["--enable-unified-cache-external-linker"], True, None),
    ("unified_cache_external_linker_backend", "mooncake", ["--unified-cache-external-linker-backend"], False, ["mooncake", "mori", "dynamic"]),
    ("unified_cache_external_linker_config", None, ["--unified-cache-external-linker-config"], False, None),
    ("enable_linker_mla_dedup", False, ["--enable-linker-mla-dedup"], True, None),
    ("enable_hisparse", False, ["--enable-hisparse"], True, None),
    ("hisparse_config", None, ["--hisparse-config", "--hierarchical-sparse-attention-extra-config"], False, None),
    ("enable_lmcache", False, ["--enable-lmcache"], True, None),
    ("lmcache_config_file", None, ["--lmcache-config-file"], False, None),
    ("enable_flexkv", False, ["--enable-flexkv"], True, None),
    ("flexkv_config_file", None, ["--flexkv-config-file"], False, None),
    ("decoupled_spec_bind_endpoint", None, ["--decoupled-spec-bind-endpoint"], False, None),
    ("decoupled_spec_connect_endpoints", None, ["--decoupled-spec-connect-endpoints"], False, None),
    ("decoupled_spec_rank", None, ["--decoupled-spec-rank"], False, None),
    ("decoupled_spec_role", "null", ["--decoupled-spec-role"], False, ["null", "verifier", "drafter"]),
    ("disaggregation_mode", "null", ["--disaggregation-mode"], False, ["null", "prefill", "decode"]),
    ("disaggregation_decode_allocation_policy", "early", ["--disaggregation-decode-allocation-policy"], False, ["early", "prefill_complete"]),
    ("disaggregation_transfer_backend", "mooncake", ["--disaggregation-transfer-backend"], False, None),
    ("disaggregation_enable_kv_checksum", False, ["--disaggregation-enable-kv-checksum"], True, None),
    ("disaggregation_bootstrap_port", 8998, ["--disaggregation-bootstrap-port"], False, None),
    ("disaggregation_ib_device", None, ["--disaggregation-ib-device"], False, None),
    ("disaggregation_decode_enable_radix_cache", False, ["--disaggregation-decode-enable-radix-cache"], True, None),
    ("disaggregation_decode_enable_offload_kvcache", False, ["--disaggregation-decode-enable-offload-kvcache"], True, None),
    ("disaggregation_decode_retraction_backup", None, ["--disaggregation-decode-retraction-backup"], False, ["cpu_tensor", "host_pool", "none"]),
    ("num_reserved_decode_tokens", 512, ["--num-reserved-decode-tokens"], False, None),
    ("disaggregation_decode_extra_slots", None, ["--disaggregation-decode-extra-slots"], False, None),
    ("disaggregation_decode_polling_interval", 1, ["--disaggregation-decode-polling-interval"], False, None),
    ("enable_pd_role_switch", False, ["--enable-pd-role-switch"], True, None),
    ("optimistic_prefill_attempts", 0, ["--optimistic-prefill-attempts"], False, None),
    ("encoder_only", False, ["--encoder-only"], True, None),
    ("language_only", False, ["--language-only"], True, None),
    ("language_model_only", False, ["--language-model-only"], True, None),
    ("encoder_transfer_backend", "auto", ["--encoder-transfer-backend"], False, ["auto", "zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"]),
    ("encoder_urls", [], ["--encoder-urls"], False, None),
    ("encoder_bootstrap_port", 8997, ["--encoder-bootstrap-port"], False, None),
    ("encoder_register_urls", [], ["--encoder-register-urls"], False, None),
    ("enable_adaptive_dispatch_to_encoder", False, ["--enable-adaptive-dispatch-to-encoder"], True, None),
    ("enable_pdmux", False, ["--enable-pdmux"], True, None),
    ("pdmux_config_path", None, ["--pdmux-config-path"], False, None),
    ("sm_group_num", 8, ["--sm-group-num"], False, None),
    ("disaggregation_decode_host_receive_threshold", 1.0, ["--disaggregation-decode-host-receive-threshold"], False, None),
]

ORDER_2_3 = POSITIONAL_FIELD_ORDER[1:]


def test_namespace_sizes_match_reference():
    assert len(dataclasses.fields(Memory)) == 31
    # sglang-hydra's own hydra-only fields (no reference flag) are not part of the reference's surface
    from sglang_hydra.config.spec import arg_of
    assert len([f for f in dataclasses.fields(Disagg) if not arg_of(f).hydra_only]) == 30


@pytest.mark.parametrize("name,default,flags,store_true,choices", REFERENCE, ids=[r[0] for r in REFERENCE])
def test_flag_surface(name, default, flags, store_true, choices):
    p = legacy_parser()
    actions = {a.dest: a for a in p._actions}
    a = actions[name]
    assert list(a.option_strings) == flags
    assert a.default == default
    assert (a.nargs == 0) is store_true
    if choices is not None:
        assert list(a.choices)[:len(choices)] == choices  # plugins may append


def test_transfer_backend_choices_start_with_reference():
    a = {x.dest: x for x in legacy_parser()._actions}["disaggregation_transfer_backend"]
    assert list(a.choices)[:6] == ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]


def test_list_and_json_flags():
    p = legacy_parser()
    ns = p.parse_args(["--encoder-urls", "a", "b", "--decoupled-spec-connect-endpoints", '["x","y"]',
                       "--radix-eviction-policy-config", '{"protected_threshold": 3}'])
    assert ns.encoder_urls == ["a", "b"]
    assert ns.decoupled_spec_connect_endpoints == ["x", "y"]
    assert ns.radix_eviction_policy_config == {"protected_threshold": 3}


def test_record_order_is_reference_order():
    names = [f.name for f in dataclasses.fields(ServerArgs)]
    assert names[0] == "model_path"
    from sglang_hydra.config.record import FIELDS
    # sglang-hydra's own hydra-only fields (no reference flag) follow the reference's, at the end
    mem_disagg = [n for n in names if namespace_of(ServerArgs)[n] in ("memory", "disagg")
                  and not FIELDS[n].arg.hydra_only]
    assert tuple(mem_disagg) == ORDER_2_3
    assert len(ORDER_2_3) == 61


def test_namespace_of_and_views():
    ns = namespace_of(ServerArgs)
    assert ns["hicache_ratio"] == "memory" and ns["disaggregation_mode"] == "disagg" and ns["page_size"] == "schedule"
    assert namespace_of(int) == {}
    rec = make_record(hicache_ratio=3.0)
    assert get_memory(rec).hicache_ratio == 3.0
    assert get_disagg(rec).disaggregation_bootstrap_port == 8998
    with pytest.raises(AttributeError):
        get_memory(rec).disaggregation_mode  # belongs to disagg
    with pytest.raises(AttributeError):
        get_memory(rec).hicache_ratio = 1.0


def test_records_are_immutable_and_pickle_equal():
    rec = make_record(enable_hierarchical_cache=True, radix_eviction_policy="lru")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.hicache_ratio = 5.0
    back = pickle.loads(pickle.dumps(rec))
    assert back == rec
    assert back.explicit_fields == rec.explicit_fields
    assert back.raw_input == rec.raw_input
    assert back.resolution_log == rec.resolution_log


def test_explicit_lru_is_distinguishable_from_default():
    explicit = make_record(radix_eviction_policy="lru")
    default = make_record()
    assert explicit.radix_eviction_policy == default.radix_eviction_policy == "lru"
    assert explicit._radix_eviction_policy_explicitly_set is True
    assert default._radix_eviction_policy_explicitly_set is False
    assert explicit.is_explicit("radix_eviction_policy") and not default.is_explicit("radix_eviction_policy")


def test_no_torch_on_import():
    import subprocess, sys
    code = ("import sys, sglang_hydra; from sglang_hydra import compose_record; "
            "compose_record(argv=['--hicache-ratio','2']); "
            "assert 'torch' not in sys.modules and 'triton' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
