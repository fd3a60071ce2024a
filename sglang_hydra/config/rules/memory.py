"""Rules of the ``memory`` namespace: host-tier sizing defaults, HiCache normalisation,
cache-feature compatibility, and early checks of the JSON-valued settings."""
from __future__ import annotations

import json

from ..extra_config import parse_extra_config
from ..policy_params import validate_policy_config
from ..rulebook import Resolving, rule
from .model_facts import geometry_known, skip_unjudged, unknown_model_hint

_LINKER_KEYS = ("linker", "linker_module_path", "linker_extra_config")
_SPECULATIVE = ("EAGLE", "EAGLE3", "NEXTN", "DSPARK", "STANDALONE", "NGRAM", "DFLASH", "UNO", "FROZEN_KV_MTP")


@rule(6, "M-HR")
def hicache_ratio_default(cfg: Resolving) -> None:
    frac = cfg.hicache_host_memory_fraction
    if frac is not None and not (0 < frac <= 1):
        cfg.error("hicache_host_memory_fraction", f"{frac!r} is outside (0, 1]")
    out = {}
    if cfg.hicache_ratio is None and cfg.mode != "decode":
        out["hicache_ratio"] = 1.2 if cfg.hicache_host_memory_mode == "buffer_only" else 2.0
    if cfg.raw["hicache_ratio"] is not None or cfg.hicache_size > 0:
        out["hicache_host_memory_fraction"] = None
    if out:
        cfg.declare(**out)


@rule(52, "M-SZ")
def sizes_that_can_work(cfg: Resolving) -> None:
    """Pool sizes that no machine could honour fail here, when the record is resolved,
    rather than later when memory is allocated (the reference accepts them silently)."""
    ratio = cfg.hicache_ratio
    if ratio is not None and ratio <= 0:
        cfg.error("hicache_ratio", f"{ratio!r} gives an empty host tier; the ratio (host tier / device pool) "
                  "must be greater than 0")
    elif (ratio is not None and ratio < 1 and cfg.enable_hierarchical_cache and cfg.hicache_size <= 0
          and cfg.hicache_host_memory_mode == "cache"):
        cfg.error("hicache_ratio", f"{ratio!r} makes the host tier smaller than the device pool, but HiCache in "
                  "'cache' host memory mode keeps a host copy of the pages it writes from the device pool, so "
                  "the host tier must be at least as large: give a ratio >= 1 (or --hicache-size in GB); only "
                  "buffer_only mode and a decode server's backup-only host pool may be smaller")
    if cfg.hicache_size < 0:
        cfg.error("hicache_size", f"{cfg.hicache_size!r} is negative; give the host tier in GB (>= 1), or 0 to "
                  "size it with --hicache-ratio")
    mtt, ps = cfg.max_total_tokens, cfg.page_size or 1
    if mtt is not None and mtt < ps:
        cfg.error("max_total_tokens", f"{mtt!r} is smaller than one page ({ps} tokens, --page-size), which leaves "
                  f"a device pool of 0 pages; give at least {ps} tokens (a multiple of the page size)")


def _host_tier_on(cfg: Resolving) -> bool:
    return bool(cfg.enable_hierarchical_cache or cfg.disaggregation_decode_enable_offload_kvcache
                or (cfg.mode == "decode" and cfg.disaggregation_decode_retraction_backup in (None, "host_pool")))


@rule(53, "M-HC")
def hicache(cfg: Resolving) -> None:
    # M-HC1 / M-HC2: the linker configuration.
    lcfg = cfg.unified_cache_external_linker_config
    if lcfg is not None and not isinstance(lcfg, dict):
        cfg.error("unified_cache_external_linker_config", "must be a JSON object")
    elif cfg.unified_cache_external_linker_backend == "dynamic" and (cfg.enable_unified_cache_external_linker or lcfg is not None):
        _check_dynamic_linker(cfg, lcfg)
    # M-HC3
    if cfg.enable_linker_mla_dedup and (not cfg.enable_unified_cache_external_linker
                                        or cfg.unified_cache_external_linker_backend != "mooncake"):
        cfg.error("enable_linker_mla_dedup", "needs the Mooncake linker (--enable-unified-cache-external-linker with "
                  "--unified-cache-external-linker-backend mooncake)")
    # M-HC4: the linker replaces HiCache entirely.
    if cfg.enable_unified_cache_external_linker:
        if cfg.disable_radix_cache or cfg.radix_cache_backend is not None:
            cfg.error("enable_unified_cache_external_linker", "needs the built-in radix cache enabled (no "
                      "--disable-radix-cache, no --radix-cache-backend)")
        if cfg.enable_hierarchical_cache:
            cfg.error("enable_unified_cache_external_linker", "and --enable-hierarchical-cache exclude each other")
        if cfg.hicache_storage_backend is not None:
            cfg.error("hicache_storage_backend", "is not used by the external linker; drop it")
        return
    # M-HC5: nothing more unless a host tier exists.
    if not _host_tier_on(cfg):
        return
    # M-HC6
    mode = cfg.hicache_host_memory_mode
    if mode not in ("cache", "buffer_only"):
        cfg.error("hicache_host_memory_mode", f"must be 'cache' or 'buffer_only', got {mode!r}")
    elif cfg.hicache_size <= 0 and cfg.hicache_ratio is None and cfg.mode != "decode":
        cfg.error("hicache_ratio", f"host memory mode {mode} needs a host tier size: give --hicache-size or --hicache-ratio")
    elif mode == "buffer_only":
        if cfg.hicache_storage_backend is None:
            cfg.error("hicache_storage_backend", "buffer_only host memory only stages pages for a storage tier, so a "
                      "storage backend is required")
        if cfg.hicache_write_policy == "write_back":
            cfg.declare(hicache_write_policy="write_through", warn="buffer_only host memory writes through to storage")
        if cfg.mode == "decode":
            cfg.error("hicache_host_memory_mode", "buffer_only is not supported on decode servers (their prefetch and "
                      "offload paths bypass the staging pipeline); prefill servers support it")
    # M-HC7
    thr = cfg.disaggregation_decode_host_receive_threshold
    if isinstance(thr, (int, float)) and thr < 1:
        cfg.declare(hicache_mem_layout="layer_first")
    # M-HC8: layout and io backend must fit together.
    if cfg.hicache_mem_layout == "page_first_direct" and cfg.hicache_io_backend == "kernel":
        cfg.declare(hicache_io_backend="direct", warn="the kernel io backend cannot copy the page_first_direct layout")
    if cfg.hicache_mem_layout == "page_first" and cfg.hicache_io_backend == "direct":
        cfg.declare(hicache_mem_layout="page_first_direct", warn="direct io cannot copy the page_first layout")
    # M-HC9: distributed stores want a page-major layout.
    storage = cfg.hicache_storage_backend
    if not (storage == "mooncake" and cfg.dcp_size > 1) and storage in ("mooncake", "npu_memcache") \
            and cfg.hicache_mem_layout == "layer_first":
        io = cfg.hicache_io_backend
        new = {"direct": "page_first_direct", "kernel": "page_first"}.get(io, "layer_first")
        cfg.declare(hicache_mem_layout=new, warn=f"the {storage} storage backend cannot use layer_first")
    # M-HC10
    if cfg.enable_unified_memory and cfg.hicache_mem_layout == "page_first_direct":
        cfg.declare(hicache_mem_layout="page_first", hicache_io_backend="kernel",
                    warn="the unified pool's strided rows need the kernel io backend")
    # M-HC11
    if isinstance(thr, (int, float)) and thr < 1 and cfg.hicache_mem_layout != "layer_first":
        cfg.error("hicache_mem_layout", f"the resolved layout {cfg.hicache_mem_layout!r} cannot share the layer_first "
                  "decode host pool that receives transferred KV (host-receive threshold below 1)")
    # M-HC12
    if cfg.dcp_size > 1 and cfg.enable_hierarchical_cache:
        if storage is not None and mode == "buffer_only":
            cfg.error("hicache_host_memory_mode", "buffer_only host memory with a storage tier does not support --dcp-size > 1")
        if cfg.speculative_algorithm not in (None, "DSPARK"):
            cfg.error("speculative_algorithm", "HiCache with --dcp-size > 1 only supports DSPARK (other draft host "
                      f"pools have no DCP index translation), got {cfg.speculative_algorithm!r}")
        if cfg.enable_lmcache:
            cfg.error("enable_lmcache", "does not support --dcp-size > 1")
        if cfg.enable_hisparse:
            cfg.error("enable_hisparse", "does not support --dcp-size > 1")
        if not geometry_known(cfg):
            skip_unjudged(cfg, "whether HiCache with --dcp-size > 1 has the MLA model it needs", "KV geometry")
        elif not cfg.use_mla():
            cfg.error("dcp_size", "HiCache with --dcp-size > 1 needs an MLA model; MHA host pools have no DCP translation")


def _check_dynamic_linker(cfg: Resolving, lcfg) -> None:
    field = "unified_cache_external_linker_config"
    if not isinstance(lcfg, dict):
        cfg.error(field, "the dynamic linker needs a JSON object with linker and linker_module_path")
        return
    unknown = sorted(set(lcfg) - set(_LINKER_KEYS))
    if unknown:
        cfg.error(field, f"unknown keys {unknown}; allowed: {', '.join(_LINKER_KEYS)}")
    for k in ("linker", "linker_module_path"):
        v = lcfg.get(k)
        if not isinstance(v, str) or not v.strip():
            cfg.error(field, f"{k} must be a non-empty string")
    if "linker_extra_config" in lcfg and not isinstance(lcfg["linker_extra_config"], dict):
        cfg.error(field, "linker_extra_config must be a JSON object")


@rule(76, "M-CC")
def cache_compatibility(cfg: Resolving) -> None:
    backup = cfg.disaggregation_decode_retraction_backup
    if backup == "host_pool":
        if cfg.mode != "decode":
            cfg.error("disaggregation_decode_retraction_backup", "'host_pool' only exists on a PD decode server")
        if cfg.dcp_size > 1:
            cfg.error("disaggregation_decode_retraction_backup", "'host_pool' does not support --dcp-size > 1")
        if cfg.enable_priority_scheduling and not cfg.disable_priority_preemption:
            cfg.error("disaggregation_decode_retraction_backup", "'host_pool' with priority scheduling needs "
                      "--disable-priority-preemption")
    # M-CC4 (and RT-4, checked here rather than when the tree is built).
    errors = validate_policy_config(cfg.radix_eviction_policy, cfg.radix_eviction_policy_config)
    for e in errors:
        cfg.error("radix_eviction_policy_config", e)
    if cfg.enable_hierarchical_cache and cfg.disable_radix_cache:
        cfg.error("enable_hierarchical_cache", "needs the radix cache, but it is disabled"
                  + (" (decode servers disable it unless --disaggregation-decode-enable-radix-cache is given)"
                     if cfg.mode == "decode" else " (--disable-radix-cache)"))
    if cfg.disaggregation_decode_enable_offload_kvcache:
        f = "disaggregation_decode_enable_offload_kvcache"
        if cfg.mode != "decode":
            cfg.error(f, "only applies to decode servers")
        if cfg.hicache_storage_backend is None:
            cfg.error(f, "needs a storage tier (--hicache-storage-backend)")
        if backup == "host_pool":
            cfg.error(f, "and --disaggregation-decode-retraction-backup host_pool both build a decode host pool; pick one")
    # M-CC7: sliding-window ratio.
    if cfg.values["_swa_full_tokens_ratio_explicitly_set"] is None:
        cfg.declare(_swa_full_tokens_ratio_explicitly_set=cfg.swa_full_tokens_ratio is not None)
    ratio = 0.8 if cfg.swa_full_tokens_ratio is None else cfg.swa_full_tokens_ratio
    if not 0 < ratio <= 1.0:
        cfg.error("swa_full_tokens_ratio", f"{ratio!r} is outside (0, 1]")
    if cfg.swa_prefix_tails is not None and cfg.swa_prefix_tails < 0:
        cfg.error("swa_prefix_tails", "must be a non-negative integer")
    # M-CC8: LMCache.
    if cfg.enable_lmcache:
        f = "enable_lmcache"
        alg = cfg.speculative_algorithm
        for bad, text in (
            (cfg.enable_hierarchical_cache, "and --enable-hierarchical-cache exclude each other"),
            (cfg.enable_unified_cache_external_linker, "and --enable-unified-cache-external-linker exclude each other"),
            (cfg.disable_radix_cache, "needs the radix cache enabled"),
            (alg is not None and str(alg).upper() in _SPECULATIVE, "does not support speculative decoding yet"),
            (cfg.attn_dp_enabled(), "does not support DP attention yet"),
            (cfg.dcp_size > 1, "does not support --dcp-size > 1 (no DCP index translation)"),
            (cfg.enable_streaming_session, "does not support streaming sessions yet"),
            (cfg.hicache_host_memory_mode == "buffer_only", "cannot use buffer_only host memory, a HiCache-only mode"),
            (cfg.mode != "null", "only supports colocated prefill and decode"),
        ):
            if bad:
                cfg.error(f, text)


@rule(77, "M-PM")
def page_major_layout(cfg: Resolving) -> None:
    if cfg.enable_unified_memory and not cfg.enable_page_major_kv_layout:
        cfg.declare(enable_page_major_kv_layout=True)
    if not cfg.enable_page_major_kv_layout:
        return
    f = "enable_page_major_kv_layout"
    if not cfg.enable_unified_memory:
        cfg.error(f, "is only supported together with --enable-unified-memory for now")
        return
    mla = cfg.use_mla()
    by_geometry = {"mla": {"triton", "fa3", "trtllm_mla", "flashinfer", "cutedsl_mla", "flashmla"},
                   "mha_split_v": {"triton", "fa3", "fa4"},
                   "mha": {"triton", "fa3", "fa4", "flashinfer", "trtllm_mha"}}
    if not geometry_known(cfg):   # refuse only backends that no geometry accepts
        allowed = set().union(*by_geometry.values())
        cfg.info("the page-major layout's attention backends were checked only against what some KV geometry "
                 f"accepts: {unknown_model_hint(cfg.model_path, 'KV geometry')}")
    elif mla:
        allowed = by_geometry["mla"]
    elif (cfg.v_head_dim or cfg.head_dim) != cfg.head_dim:
        allowed = by_geometry["mha_split_v"]
    else:
        allowed = by_geometry["mha"]
    backends = {b for b in _attention_pair(cfg) if b is not None}
    if not backends <= allowed:
        cfg.error(f, f"attention backends {sorted(backends)} are not supported with it; use one of {sorted(allowed)}")
    extra = {"cutedsl", "helion"} if mla or not geometry_known(cfg) else set()
    dec = cfg.linear_attn_decode_backend or cfg.linear_attn_backend
    pre = cfg.linear_attn_prefill_backend or cfg.linear_attn_backend
    if dec is not None and dec not in {"triton", "flashinfer"} | extra:
        cfg.error(f, f"linear-attention decode backend {dec!r} cannot handle the strided state")
    if pre is not None and pre not in {"triton", "flashkda", "flashinfer"} | extra:
        cfg.error(f, f"linear-attention prefill backend {pre!r} cannot handle the strided state")
    if cfg.mamba_backend not in (None, "triton"):
        cfg.error(f, f"needs the Triton Mamba kernels (--mamba-backend triton), got {cfg.mamba_backend!r}")


def _attention_pair(cfg: Resolving):
    base = cfg.attention_backend
    return (cfg.prefill_attention_backend or base, cfg.decode_attention_backend or base)


@rule(78, "M-UM")
def unified_memory(cfg: Resolving) -> None:
    if not cfg.enable_unified_memory:
        return
    f = "enable_unified_memory"
    alg = cfg.speculative_algorithm
    known = geometry_known(cfg)
    if not known:   # the tiny stand-in's MHA, non-hybrid geometry must not decide anything
        skip_unjudged(cfg, "which unified-memory combinations the model's MLA/hybrid layout allows", "KV geometry")
    hybrid = cfg.hybrid if known else None
    mla = cfg.use_mla() if known else None
    if cfg.mode != "null":
        if cfg.backend != "mooncake":
            cfg.error(f, f"with PD disaggregation only the mooncake transfer backend is supported, got {cfg.backend!r}")
        if cfg.pp_size != 1:
            cfg.error(f, "with PD disaggregation cannot use pipeline parallelism")
        if cfg.backend == "mooncake" and alg is not None:
            cfg.error(f, "with PD disaggregation over Mooncake cannot use speculative decoding")
        if cfg.getenv_flag("SGLANG_DISABLE_LAZY_COMPACTION"):
            cfg.error(f, "with PD disaggregation needs lazy compaction; unset SGLANG_DISABLE_LAZY_COMPACTION")
        if cfg.enable_hisparse:
            cfg.error(f, "with PD disaggregation cannot be combined with --enable-hisparse")
        if cfg.disaggregation_decode_enable_offload_kvcache:
            if cfg.hicache_storage_backend != "file":
                cfg.error(f, "decode KV offload only supports --hicache-storage-backend file")
            if mla is True:
                cfg.error(f, "decode KV offload does not support MLA models yet")
            if hybrid == "mamba":
                cfg.error(f, "decode KV offload does not support hybrid-Mamba models")
            if hybrid == "swa":
                cfg.error(f, "decode KV offload does not support hybrid sliding-window models yet")
        if cfg.disaggregation_decode_retraction_backup == "host_pool" and hybrid == "mamba":
            cfg.error(f, "host-pool decode retraction does not support hybrid-Mamba models")
    if alg not in (None, "DSPARK", "EAGLE", "EAGLE3", "DFLASH"):
        cfg.error(f, f"supports speculative algorithms DSPARK, DFLASH, EAGLE and EAGLE3 only, got {alg!r}")
    if cfg.speculative_eagle_topk not in (None, 1):
        cfg.error(f, f"supports a linear draft chain only (--speculative-eagle-topk 1), got {cfg.speculative_eagle_topk!r}")
    backends = set(_attention_pair(cfg))
    if alg in ("EAGLE", "EAGLE3"):
        if known and hybrid not in ("swa", "mamba"):
            cfg.error(f, "with EAGLE/EAGLE3 needs a hybrid target (sliding-window or Mamba)")
        audited_mla = {"triton", "trtllm_mla", "cutedsl_mla", "flashmla", "flashinfer", "fa3"}
        audited_mha = {"triton", "flashinfer", "fa3", "trtllm_mha"}
        audited = audited_mla if mla is True else audited_mha if mla is False else audited_mla | audited_mha
        if None in backends or not backends <= audited:
            cfg.error(f, f"with EAGLE/EAGLE3 needs explicit target attention backends from {sorted(audited)}, got "
                      f"{sorted(map(str, backends))}")
        mha_rails = {"triton", "flashinfer", "fa3", "trtllm_mha"}
        draft = {cfg.speculative_draft_attention_backend} if cfg.speculative_draft_attention_backend else backends
        if not draft <= mha_rails:
            cfg.error("speculative_draft_attention_backend", f"a fused EAGLE draft reads its KV through {sorted(mha_rails)}; "
                      f"got {sorted(map(str, draft))}")
        if cfg.disaggregation_decode_retraction_backup == "host_pool":
            cfg.error(f, "with EAGLE/EAGLE3 cannot use host-pool decode retraction")
        if cfg.enable_hierarchical_cache:
            cfg.error(f, "with EAGLE/EAGLE3 cannot use --enable-hierarchical-cache")
    elif alg in ("DSPARK", "DFLASH"):
        allowed = {"triton", "trtllm_mla", "cutedsl_mla", "flashmla", "flashinfer", "fa3", "fa4"} if alg == "DSPARK" \
            else {"triton", "flashinfer", "fa3", "trtllm_mha"}
        if cfg.dcp_size > 1:
            allowed.discard("flashinfer")
        if None in backends or not backends <= allowed:
            cfg.error(f, f"with {alg} needs prefill and decode attention backends from {sorted(allowed)}, got "
                      f"{sorted(map(str, backends))}")
    if cfg.enable_two_batch_overlap:
        cfg.error(f, "cannot be combined with --enable-two-batch-overlap")
    if cfg.enable_lmcache:
        cfg.error(f, "cannot be combined with --enable-lmcache")
    if cfg.enable_unified_cache_external_linker:
        cfg.error(f, "cannot be combined with --enable-unified-cache-external-linker; use --enable-hierarchical-cache")
    if cfg.dcp_size > 1:
        if mla is False:
            cfg.error(f, "with --dcp-size > 1 needs an MLA model")
        if hybrid in ("swa", "pure_swa"):
            cfg.error(f, "with --dcp-size > 1 does not support sliding-window models")
        if cfg.mode != "null":
            cfg.error(f, "with --dcp-size > 1 cannot run disaggregated")
        if not {b for b in backends if b} <= {"flashinfer", "trtllm_mla", "cutedsl_mla"} or None in backends:
            cfg.error(f, "with --dcp-size > 1 needs attention backends flashinfer, trtllm_mla or cutedsl_mla")


@rule(90, "RT-5")
def storage_extra_config(cfg: Resolving) -> None:
    value = cfg.hicache_storage_backend_extra_config
    if value is None:
        return
    try:
        parse_extra_config(value, cfg.hicache_storage_backend)
    except (ValueError, OSError) as exc:
        cfg.error("hicache_storage_backend_extra_config", str(exc))


@rule(91, "RT-8")
def hisparse_config(cfg: Resolving) -> None:
    if cfg.hisparse_config is None:
        return
    try:
        data = json.loads(cfg.hisparse_config)
    except ValueError as exc:
        cfg.error("hisparse_config", f"not valid JSON: {exc}")
        return
    if not isinstance(data, dict):
        cfg.error("hisparse_config", "must be a JSON object")
        return
    top_k = data.get("top_k", 2048)
    buf = data.get("device_buffer_size", 2 * top_k if isinstance(top_k, int) else 0)
    if isinstance(top_k, int) and isinstance(buf, int) and buf < top_k:
        cfg.error("hisparse_config", f"device_buffer_size ({buf}) must be at least top_k ({top_k})")
    blk = data.get("swap_in_block_size", 960)
    if isinstance(blk, bool) or not isinstance(blk, int):
        cfg.error("hisparse_config", f"swap_in_block_size must be an integer, got {blk!r}")
    elif not 1 <= blk <= 1024:
        cfg.error("hisparse_config", f"swap_in_block_size ({blk}) must be within [1, 1024]")
