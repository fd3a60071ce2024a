"""The frozen positional order of the flat record.

Code that builds the record positionally (or compares two records field by field) relies on
this order, so it only ever grows at the end.  It names the reference engine's first field
and its memory/disagg fields in the reference's positional order; fields it does not name
follow in namespace collection order.
"""

POSITIONAL_FIELD_ORDER = (
    "model_path",
    "radix_eviction_policy", "radix_eviction_policy_config", "disable_radix_cache",
    "enable_page_major_kv_layout", "enable_unified_memory", "enable_session_radix_cache",
    "radix_cache_backend", "decoupled_spec_bind_endpoint", "decoupled_spec_connect_endpoints",
    "decoupled_spec_rank", "decoupled_spec_role", "enable_hierarchical_cache", "hicache_host_memory_mode",
    "hicache_ratio", "hicache_size", "hicache_write_policy", "hicache_io_backend", "hicache_mem_layout",
    "hicache_storage_backend", "hicache_storage_prefetch_policy", "hicache_storage_backend_extra_config",
    "hicache_storage_prefetch_retry_poll_interval", "hicache_storage_prefetch_retry_max_attempts",
    "enable_unified_cache_external_linker", "unified_cache_external_linker_backend", "enable_hisparse",
    "hisparse_config", "enable_lmcache", "lmcache_config_file", "enable_flexkv", "flexkv_config_file",
    "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_bootstrap_port",
    "disaggregation_ib_device", "disaggregation_decode_enable_radix_cache",
    "disaggregation_decode_enable_offload_kvcache", "disaggregation_decode_retraction_backup",
    "num_reserved_decode_tokens", "disaggregation_decode_extra_slots",
    "disaggregation_decode_polling_interval", "optimistic_prefill_attempts", "encoder_only", "language_only",
    "language_model_only", "encoder_transfer_backend", "encoder_urls", "encoder_bootstrap_port",
    "encoder_register_urls", "enable_adaptive_dispatch_to_encoder", "enable_pdmux", "pdmux_config_path",
    "sm_group_num", "disaggregation_enable_kv_checksum", "enable_pd_role_switch",
    "_radix_eviction_policy_explicitly_set", "hicache_host_memory_fraction", "enable_linker_mla_dedup",
    "disaggregation_decode_host_receive_threshold", "disaggregation_decode_allocation_policy",
    "unified_cache_external_linker_config",
)
