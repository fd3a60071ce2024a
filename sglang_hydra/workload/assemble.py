"""From resolved records and a hardware preset to the :class:`~.deployment.DeploymentModel` to simulate.

Each engine is one TP group of the record: its pass model (:class:`~sglang_hydra.perf.pass_time.
PassModel`), its device KV pool (``schedule.max_total_tokens``, else what the memory plan sizes on
the target GPU), its scheduler settings and its own prefix cache.  The cache is the tiered cache
with one of three movers: ``metadata`` (device tier only, HiCache off), ``sim`` (device, host and
storage tiers, no bytes) or ``full`` (real KV bytes through built pools; one engine only, as it
allocates them on this machine).

A node's GPUs share its host memory, storage and NICs: an engine of ``g`` GPUs on a node of
``gpus_per_node`` gets ``g / gpus_per_node`` of the node's host memory (its host KV tier is the
plan's, capped there) and of its storage read rate.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .deployment import DeploymentModel, ServerGroup
from .engine import SCHEDULE_POLICIES, EngineSpec
from .router import ROUTER_POLICIES, effective_load_balance
from .transfer import TRANSFER_BACKENDS

__all__ = ["CACHE_MODES", "TIER_COUNT_KEYS", "DeploymentInputs", "build_deployment", "default_chunk_tokens", "MODELLED_FIELDS",
           "context_limit", "default_max_running"]

CACHE_MODES = ("device_only", "sim", "full")
#: the per-tier page counts the counting and the real-bytes movers must agree on
TIER_COUNT_KEYS = (
    "device_hit_pages", "host_hit_pages", "storage_hit_pages", "miss_pages",
    "host_written_pages", "host_write_failed_pages", "storage_written_pages", "storage_write_skipped_pages",
    "device_evicted_pages", "device_demoted_pages", "device_dropped_pages",
    "host_evicted_pages", "host_reclaimed_pages", "host_dropped_pages",
    "load_back_pages", "load_back_skipped", "recomputed_pages", "device_truncated_pages",
    "prefetch_issued", "prefetch_issued_pages", "prefetch_used_pages", "prefetch_dropped_pages",
    "prefetch_present_pages", "prefetch_below_threshold", "prefetch_rate_limited",
    "prefetch_no_host_space", "prefetch_completed", "prefetch_terminated",
    "prefetch_retries", "prefetch_retry_issued", "prefetch_retry_pages", "scheduling_passes",
)
GB = 1e9
#: record fields the simulation reads (every other server setting leaves its answer unchanged)
MODELLED_FIELDS = frozenset({
    # model shape (pass model, KV geometry, context)
    "model_path", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
    "intermediate_size", "vocab_size", "num_parameters", "attention_arch", "kv_lora_rank", "qk_rope_head_dim",
    "q_lora_rank", "v_head_dim", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "num_shared_experts", "first_dense_layers", "dtype", "kv_cache_dtype", "quantization", "context_length",
    "max_position_embeddings", "allow_auto_truncate",
    # parallelism and routing
    "tp_size", "dp_size", "load_balance_method",
    # scheduler and pool
    "mem_fraction_static", "max_total_tokens", "max_running_requests", "chunked_prefill_size",
    "max_prefill_tokens", "schedule_policy", "enable_mixed_chunk", "page_size",
    # prefix cache and HiCache
    "disable_radix_cache", "radix_eviction_policy", "radix_eviction_policy_config",
    "enable_hierarchical_cache", "hicache_ratio", "hicache_size", "hicache_write_policy",
    "hicache_host_memory_mode", "hicache_storage_backend", "hicache_storage_prefetch_policy",
    "hicache_storage_backend_extra_config", "hicache_storage_prefetch_retry_poll_interval",
    "hicache_storage_prefetch_retry_max_attempts",
    # disaggregation
    "disaggregation_mode", "disaggregation_transfer_backend", "disaggregation_decode_enable_radix_cache",
})


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def default_chunk_tokens(record: Any, hardware: Any) -> Optional[int]:
    """The prefill chunk: the record's; unset, about what SGLang picks for the GPU's memory
    (2048 / 4096 / 8192 tokens under 35 / 60 / from 60 GB); ``-1`` or 0: not chunked (None)."""
    size = _get(record, "chunked_prefill_size")
    if size is not None:
        size = int(size)
        return None if size <= 0 else size
    gb = float(_get(hardware, "gpu_memory_gb", 80.0) or 80.0)
    return 2048 if gb < 35 else 4096 if gb < 60 else 8192


def default_max_running(record: Any, pool_tokens: int) -> int:
    """``schedule.max_running_requests``; unset, SGLang 0.5.23's request-table size: 512 requests
    per context length of pool tokens, clamped to 2048..4096, and never more than half the pool's
    tokens (``pool_configurator``'s estimate of ``ModelRunner``'s bound)."""
    v = _get(record, "max_running_requests")
    if v:
        return int(v)
    ctx = context_limit(record)
    estimate = int(pool_tokens / ctx * 512) if ctx else 4096
    estimate = max(min(estimate, 4096), 2048)
    return max(1, min(estimate, pool_tokens // 2))


def context_limit(record: Any) -> Optional[int]:
    """The context length the server enforces: ``model.context_length``, else the model's
    ``max_position_embeddings`` (None when neither is known)."""
    v = _get(record, "context_length") or _get(record, "max_position_embeddings")
    return int(v) if v else None


@dataclass
class DeploymentInputs:
    """Everything :func:`build_deployment` needs (records are resolved ``ServerArgs``)."""

    hardware: Any
    record: Any = None                  # agg: the server's record
    prefill: Any = None                 # disagg: each side's record
    decode: Any = None
    workers: int = 1                    # agg servers behind the router
    prefill_workers: int = 1
    decode_workers: int = 1
    router_policy: Optional[str] = None  # None: sglang-router's default (cache_aware)
    cache_mode: str = "sim"
    cache_semantics: str = "rules"
    policy: Optional[str] = None        # job.policy: an eviction policy overriding the record's
    policy_config: Optional[dict] = None  # its config (with ``policy``)
    storage: Any = None                 # full mode: a storage backend object (tests)
    verify: bool = True                 # full mode: check every page loaded


@dataclass
class BuiltDeployment:
    """The model plus what the report states about how it was sized."""

    model: DeploymentModel
    sides: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    closers: List[Any] = field(default_factory=list)
    byte_movers: List[Any] = field(default_factory=list)

    def close(self) -> None:
        for c in self.closers:
            try:
                c()
            except Exception:       # closing is best effort; the result is already made
                pass


def _plan(record, hardware):
    from ..memory.plan import make_plan
    return make_plan(record, hardware=hardware, check_io=False)


def _pass_model(record, hardware):
    from ..perf.pass_time import PassModel
    return PassModel.from_record(record, hardware)


def _cache_factory(record, hardware, *, mode: str, pool_tokens: int, host_tokens_cap: Optional[int], plan,
                   gpus: int, semantics: str, policy: Optional[str], policy_config, storage, verify,
                   built: BuiltDeployment,
                   role: str):
    """A function making one engine's cache (None: the engine has no prefix cache)."""
    from ..cache.movers import CountingMover
    from ..cache.policies import get_policy_info, make_policy
    from ..cache.tiered import TieredCache
    from ..config.extra_config import parse_extra_config
    from ..memory.geometry import kv_geometry

    if _get(record, "disable_radix_cache", False):
        return None, {}
    if role == "decode" and not _get(record, "disaggregation_decode_enable_radix_cache", False):
        return None, {}
    ps = int(_get(record, "page_size") or 1)
    pol_name = policy or _get(record, "radix_eviction_policy") or "lru"
    pol_cfg = policy_config if policy else _get(record, "radix_eviction_policy_config")
    get_policy_info(pol_name)
    hierarchical = bool(_get(record, "enable_hierarchical_cache", False)) and mode != "device_only"
    backend = _get(record, "hicache_storage_backend") if hierarchical else None
    geo = kv_geometry(record)
    device_pages = pool_tokens // ps
    host_pages = 0
    if hierarchical:
        host_pages = int(plan.host_pages)
        if host_tokens_cap is not None:
            host_pages = min(host_pages, host_tokens_cap // ps)
    storage_gbps = _get(hardware, "storage_read_gbps")
    gpn = max(1, int(_get(hardware, "gpus_per_node", 1) or 1))
    read_rate = float(storage_gbps) * GB * min(1.0, gpus / gpn) if storage_gbps else None
    extra = parse_extra_config(_get(record, "hicache_storage_backend_extra_config"), backend)
    kwargs = dict(
        page_size=ps, hierarchical=hierarchical,
        write_policy=(_get(record, "hicache_write_policy") or "write_through") if hierarchical else "write_through",
        host_mode=(_get(record, "hicache_host_memory_mode") or "cache") if hierarchical else "cache",
        prefetch_policy=(_get(record, "hicache_storage_prefetch_policy") or "best_effort") if backend else "best_effort",
        prefetch_threshold=extra.prefetch_threshold, prefetch_timeout_base=extra.prefetch_timeout_base,
        prefetch_timeout_per_ki_token=extra.prefetch_timeout_per_ki_token,
        storage_read_bytes_per_s=read_rate)
    for name in ("retry_poll_interval", "retry_max_attempts"):
        v = _get(record, f"hicache_storage_prefetch_{name}")
        if v is not None:
            kwargs[name] = v
    if "semantics" in inspect.signature(TieredCache.__init__).parameters:
        kwargs["semantics"] = semantics
    info = {"page_size": ps, "eviction_policy": pol_name, "device_pages": device_pages,
            "host_pages": host_pages, "hierarchical": hierarchical, "storage_backend": backend,
            "page_bytes": geo.bytes_per_page, "cache_semantics_passed": "semantics" in kwargs}

    if mode == "full":
        from ..cache.bytes_mover import BytesMover
        from ..cache.storage import create_storage_backend, storage_config_from_record
        from ..memory import build_memory

        def make_full():
            # the pools live on this machine (the target only times the passes); a host memory the
            # target states (hardware.host_memory_gb=16) still bounds the host pool
            from ..config.hardware import compose_hardware
            stated = _get(hardware, "host_memory_gb")
            name = _get(hardware, "name")
            if stated and name and name != "local":
                preset, _ = compose_hardware(name)
                if preset.host_memory_gb == stated:
                    stated = None        # the preset's own node, not a figure for this machine
            local, _ = compose_hardware("local", [("host_memory_gb", stated, "hardware.host_memory_gb")] if stated else [])
            memory = build_memory(record, hardware=local)
            built.closers.append(memory.close)
            st = storage
            if st is None and backend:
                st = create_storage_backend(backend, storage_config_from_record(record, page_bytes=geo.bytes_per_page))
                built.closers.append(st.close)
            mover = BytesMover(memory, st if hierarchical else None, verify=verify)
            built.byte_movers.append(mover)
            return TieredCache(mover, policy=make_policy(pol_name, pol_cfg, page_size=ps), **kwargs)
        return make_full, info

    def make_counting():
        mover = CountingMover(device_pages, host_pages, has_storage=bool(backend), page_bytes=geo.bytes_per_page)
        return TieredCache(mover, policy=make_policy(pol_name, pol_cfg, page_size=ps), **kwargs)
    return make_counting, info


def _side(record, hardware, *, role: str, servers: int, inp: DeploymentInputs, built: BuiltDeployment) -> ServerGroup:
    from ..memory.geometry import kv_geometry

    pm = _pass_model(record, hardware)
    if role in ("prefill", "decode"):
        # a what-if scale only (1.0 in every preset): the PD cost itself is the simulated KV transfer
        pm = pm.scaled(float(_get(hardware, f"disagg_{role}_pass_scale", 1.0) or 1.0))
    plan = _plan(record, hardware)
    tp = int(_get(record, "tp_size", 1) or 1)
    dp = int(_get(record, "dp_size", 1) or 1)
    pool = int(_get(record, "max_total_tokens") or plan.device_tokens)
    if inp.cache_mode == "full":
        pool = int(plan.device_tokens)
    policy = _get(record, "schedule_policy") or "fcfs"
    if policy not in SCHEDULE_POLICIES:
        raise ValueError(f"schedule.schedule_policy={policy!r} is not modelled by the simulation; "
                         f"use one of {', '.join(SCHEDULE_POLICIES)}")
    gpn = max(1, int(_get(hardware, "gpus_per_node", 1) or 1))
    host_gb = _get(hardware, "host_memory_gb")
    geo = kv_geometry(record)
    host_cap = None
    if host_gb:
        # this engine's share of its node's host memory, per rank, in tokens of one rank's KV
        host_cap = int(float(host_gb) * GB / gpn / max(1, geo.bytes_per_token))
    make_cache, cache_info = _cache_factory(record, hardware, mode=inp.cache_mode, pool_tokens=pool,
                                            host_tokens_cap=host_cap, plan=plan, gpus=tp,
                                            semantics=inp.cache_semantics, policy=inp.policy,
                                            policy_config=inp.policy_config,
                                            storage=inp.storage, verify=inp.verify, built=built, role=role)
    spec = EngineSpec(
        pass_model=pm, pool_tokens=pool, max_running=default_max_running(record, pool),
        chunk_tokens=default_chunk_tokens(record, hardware),
        max_prefill_tokens=int(_get(record, "max_prefill_tokens") or 16384), schedule_policy=policy,
        mixed_chunk=bool(_get(record, "enable_mixed_chunk", False)), gpus=tp, layers=pm.layers,
        kv_bytes_per_token_rank=float(pm.kv_bytes_per_token), kv_bytes_per_token=float(pm.kv_bytes_per_token) * tp,
        h2d_bytes_per_s=float(_get(hardware, "h2d_gbps", 0) or 0) * GB,
        storage_bytes_per_s=(float(_get(hardware, "storage_read_gbps")) * GB * min(1.0, tp / gpn)
                             if _get(hardware, "storage_read_gbps") else None))
    lb = effective_load_balance(_get(record, "load_balance_method"), role if role != "agg" else "null")
    host_pages = cache_info.get("host_pages", 0)
    ps_ = int(_get(record, "page_size") or 1)
    # host KV memory the server books (the plan's tokens, capped by the node share), whatever the
    # cache mode simulates: job.mode=metadata leaves the tier out of the hits, not out of the memory
    host_tokens = 0
    if _get(record, "enable_hierarchical_cache", False) and not (role == "decode" and not cache_info):
        host_tokens = int(getattr(plan, "host_tokens", 0) or 0)
        if host_cap is not None:
            host_tokens = min(host_tokens, (host_cap // ps_) * ps_)
    built.sides[role] = {
        "servers": servers, "dp_size": dp, "tp_size": tp, "gpus": servers * dp * tp, "load_balance_method": lb,
        "kv_pool_tokens": pool, "max_running_requests": spec.max_running, "chunk_tokens": spec.chunk_tokens,
        "max_prefill_tokens": spec.max_prefill_tokens, "schedule_policy": policy, "mixed_chunk": spec.mixed_chunk,
        "host_kv_tokens": host_pages * ps_ if host_pages else host_tokens,
        "host_kv_bytes_per_engine": host_tokens * int(geo.bytes_per_token) * tp,
        "host_tokens_node_share_cap": host_cap, "plan_host_pages": int(getattr(plan, "host_pages", 0) or 0),
        "weights_gb_per_gpu": pm.weight_bytes_per_gpu / GB, "pass_time_scale": pm.time_scale,
        "cache": cache_info, "record": record,
    }
    return ServerGroup(role=role, spec=spec, servers=servers, dp=dp, load_balance=lb, make_cache=make_cache,
                       page_size=cache_info.get("page_size", int(_get(record, "page_size") or 1)))


def build_deployment(inp: DeploymentInputs) -> BuiltDeployment:
    """The deployment to simulate.  Raises ``ValueError`` (one message naming the key) for a
    setting the simulation cannot model, :class:`~sglang_hydra.perf.pass_time.PassModelError`
    for a model or hardware the pass model cannot cost."""
    if inp.cache_mode not in CACHE_MODES:
        raise ValueError(f"job.mode={inp.cache_mode!r}; allowed: {', '.join(CACHE_MODES)}")
    policy = inp.router_policy or "cache_aware"
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"deploy.router_policy={policy!r} is not modelled by the simulation; "
                         f"allowed: {', '.join(ROUTER_POLICIES)}")
    hw = inp.hardware
    built = BuiltDeployment(model=None)   # type: ignore[arg-type]
    gpn = int(_get(hw, "gpus_per_node", 8) or 8)
    if inp.prefill is None:
        if inp.record is None:
            raise ValueError("build_deployment needs a record (agg) or prefill and decode records (disagg)")
        group = _side(inp.record, hw, role="agg", servers=inp.workers, inp=inp, built=built)
        if inp.cache_mode == "full" and (group.servers * group.dp) > 1:
            raise ValueError("job.mode=full allocates real pools on this machine and runs one engine; "
                             "use parallel.dp_size=1 and deploy.workers=1 (or job.mode=sim)")
        built.model = DeploymentModel("agg", {"agg": group}, router_policy=policy, gpus_per_node=gpn,
                                      request_path_s=float(_get(hw, "request_path_us") or 0.0) * 1e-6)
        return built
    if inp.cache_mode == "full":
        raise ValueError("job.mode=full runs one aggregated engine; use job.mode=sim for deploy=pd")
    backend = _get(inp.prefill, "disaggregation_transfer_backend") or "mooncake"
    if backend not in TRANSFER_BACKENDS:
        raise ValueError(f"disagg.disaggregation_transfer_backend={backend!r} is not modelled by the simulation; "
                         f"allowed: {', '.join(TRANSFER_BACKENDS)}")
    pre = _side(inp.prefill, hw, role="prefill", servers=inp.prefill_workers, inp=inp, built=built)
    dec = _side(inp.decode, hw, role="decode", servers=inp.decode_workers, inp=inp, built=built)
    nic = _get(hw, "nic_gbps")
    nvl = _get(hw, "nvlink_gbps")
    if not nic:
        raise ValueError(f"hardware.nic_gbps is not set for hardware '{_get(hw, 'name', '?')}'; the KV transfer "
                         "of deploy=pd needs the NIC bandwidth per GPU (GB/s)")
    built.model = DeploymentModel("disagg", {"prefill": pre, "decode": dec}, router_policy=policy,
                                  transfer_backend=backend, nvlink_gbps=float(nvl or 0), nic_gbps=float(nic),
                                  gpus_per_node=gpn, request_path_s=float(_get(hw, "request_path_us") or 0.0) * 1e-6)
    return built
