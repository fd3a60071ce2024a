"""``memory``: the KV cache beyond the device pool itself.

Prefix (radix) caching and its eviction policy, the hierarchical cache (host tier and
storage tier), and the external cache integrations.  Field names, defaults, flags and
choices follow the reference engine so its command lines keep working.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from ..spec import arg


@dataclass
class Memory:
    radix_eviction_policy: str = arg(
        "lru", "Which cached prefix leaves to drop first when the device pool is full.",
        choices="RADIX_EVICTION_POLICY", resolvable=True)
    _radix_eviction_policy_explicitly_set: bool = arg(
        False, "True when the policy was given on the command line or in a config file, "
        "so an explicit 'lru' is distinguishable from the default one.", no_cli=True)
    radix_eviction_policy_config: Optional[Dict[str, Any]] = arg(
        None, "JSON object of keyword arguments for the eviction policy "
        "(slru: protected_threshold; tlru: threshold, next_prompt_estimate in tokens). "
        "Unknown keys are rejected when the record is resolved.", parser="json")
    disable_radix_cache: bool = arg(
        False, "Turn prefix caching off: every request recomputes its whole prompt.", resolvable=True)
    enable_page_major_kv_layout: bool = arg(
        False, "Keep every layer's state for a token slot together in one page-granular "
        "buffer. Only supported together with --enable-unified-memory, which implies it.")
    enable_unified_memory: bool = arg(
        False, "Serve the full, sliding-window and state caches from one unified "
        "page-granular pool; attention and state backends must be stride-aware.")
    enable_session_radix_cache: bool = arg(
        False, "Keep per-session prefixes in the radix tree between turns of a session.")
    radix_cache_backend: Optional[str] = arg(
        None, "Name of a registered external tree-cache implementation to use instead of "
        "the built-in radix cache.")
    enable_hierarchical_cache: bool = arg(
        False, "Back the device KV cache with a larger host-memory tier (and optionally a "
        "storage tier) so evicted prefixes can be loaded back instead of recomputed.",
        aliases=("--enable-hicache",))
    hicache_host_memory_mode: str = arg(
        "cache", "'cache' keeps prefixes in host memory; 'buffer_only' uses host memory "
        "only to stage pages on their way to and from the storage tier.",
        choices=("cache", "buffer_only"))
    hicache_ratio: Optional[float] = arg(
        None, "Host tier size as a multiple of the device pool. Unset: twice the pool when the "
        "host tier caches, 1.2 times when it only buffers (buffer_only); decode servers settle it at start-up.")
    hicache_size: int = arg(
        0, "Host tier size in GB (1 GB = 1e9 bytes) per rank; when positive it wins over "
        "--hicache-ratio.")
    hicache_host_memory_fraction: Optional[float] = arg(
        0.8, "Share of the free host memory (after a 10 GiB reserve) that automatic host "
        "tier sizing may use; ignored when a ratio or size is given. Must be in (0, 1].")
    hicache_write_policy: str = arg(
        "write_through", "When device pages are copied to the host tier: on eviction "
        "(write_back), on insertion (write_through), or once a prefix proves popular "
        "(write_through_selective).",
        choices=("write_back", "write_through", "write_through_selective"))
    hicache_io_backend: str = arg(
        "kernel", "How pages move between device and host: plain tensor copies (direct) "
        "or gather/scatter kernels (kernel, kernel_ascend).",
        choices=("direct", "kernel", "kernel_ascend"))
    hicache_mem_layout: str = arg(
        "page_first", "Byte layout of the host tier (which axis is outermost).",
        choices=("layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"))
    hicache_storage_backend: Optional[str] = arg(
        None, "Third cache tier below host memory; unset means no storage tier.",
        choices="HICACHE_STORAGE_BACKEND")
    hicache_storage_prefetch_policy: str = arg(
        "timeout", "How long a request waits for pages prefetched from storage: not at all "
        "(best_effort), until all arrive (wait_complete), or up to a size-based deadline (timeout).",
        choices=("best_effort", "wait_complete", "timeout"))
    hicache_storage_backend_extra_config: Optional[str] = arg(
        None, "Backend-specific settings as JSON text, or '@path' to a .json, .toml, .yaml "
        "or .yml file.")
    hicache_storage_prefetch_retry_poll_interval: int = arg(
        8, "Scheduler passes to wait before asking storage again about a prefetch miss; "
        "0 turns miss retries off.")
    hicache_storage_prefetch_retry_max_attempts: int = arg(
        8, "How many times a missed prefetch is re-issued; 0 turns re-issues off.")
    enable_unified_cache_external_linker: bool = arg(
        False, "Let an external cache linker move KV directly between the device pool and "
        "its store, bypassing HiCache.")
    unified_cache_external_linker_backend: str = arg(
        "mooncake", "Which external linker implementation to use.",
        choices=("mooncake", "mori", "dynamic"))
    unified_cache_external_linker_config: Optional[Dict[str, Any]] = arg(
        None, "JSON object for the linker. 'dynamic' needs linker (class name) and "
        "linker_module_path, and may carry linker_extra_config (an object).", parser="json")
    enable_linker_mla_dedup: bool = arg(
        False, "With the Mooncake linker, load replicated MLA KV once on rank 0 and "
        "broadcast it layer by layer.")
    enable_hisparse: bool = arg(
        False, "Hierarchical sparse attention: keep only the top-k KV rows on the device.")
    hisparse_config: Optional[str] = arg(
        None, "JSON settings for hierarchical sparse attention (top_k, device_buffer_size, "
        "host_to_device_ratio, swap_in_block_size, ...).",
        aliases=("--hierarchical-sparse-attention-extra-config",))
    enable_lmcache: bool = arg(False, "Use LMCache as the external KV cache layer.")
    lmcache_config_file: Optional[str] = arg(None, "LMCache configuration file.")
    enable_flexkv: bool = arg(False, "Use FlexKV as the external KV cache layer.")
    flexkv_config_file: Optional[str] = arg(
        None, "FlexKV configuration file (exported as FLEXKV_CONFIG_PATH if that is unset).")
