"""The real-bytes report of ``job.mode=full``: bytes, bandwidths and checks around one simulation.

:func:`full_replay` runs the deployment simulation (:func:`~.deployment.simulate`, the loop of
``job=replay``) on one engine whose cache moves real KV bytes (``job.mode=full``): pools allocated
on this machine, copies through the io backend, storage files, every page loaded back checked
against the bytes it was written with.  Passes are timed on a hardware preset (``hardware``,
default ``h100_80gb``); requests arrive at their trace times.  This module adds what only real
bytes have: the *ceiling* of each transfer direction (D->H, H->D, H->storage, storage->H),
measured on scratch pages with the same calls before the first request (best of 3), the
*achieved* rate (bytes a tier received / time transfers in that direction ran), their ratio, and
the storage backend's own counters.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from .metrics import cache_setup_label, format_rate, nearest_rank, tier_shares_percent

__all__ = ["FullReplayResult", "full_replay", "measure_bandwidth", "TIER_DIRECTIONS"]

#: transfer direction -> label
TIER_DIRECTIONS = {"d2h": "device->host", "h2d": "host->device",
                   "storage_write": "host->storage", "storage_read": "storage->host"}


@dataclass
class FullReplayResult:
    mode: str
    policy: str
    write_policy: Optional[str]
    host_mode: Optional[str]
    storage_backend: Optional[str]
    prefetch_policy: Optional[str]
    page_size: int
    page_bytes: int
    device_pages: int
    host_pages: int
    requests: int
    input_tokens: int
    hit_tokens: Dict[str, int]
    hit_rate: Dict[str, float]
    token_hit_rate: float
    bytes_moved: Dict[str, int]
    evictions: Dict[str, int]
    prefetch: Dict[str, Any]
    bandwidth_gbps: Dict[str, float]               # ceiling, measured at start-up
    achieved_gbps: Dict[str, Optional[float]]      # during the replay (None: nothing moved)
    verified_pages: int
    verify_mismatch_pages: int
    storage_stats: Dict[str, int]
    tail_threshold_tokens: float
    frac_uncached_gt_threshold: float
    uncached_tokens_p50: float
    uncached_tokens_p90: float
    uncached_tokens_p99: float
    ttft_ms_mean: float
    ttft_ms_p50: float
    ttft_ms_p90: float
    ttft_ms_p99: float
    wall_time_s: float
    bandwidth_ratio: Dict[str, Optional[float]] = field(default_factory=dict)   # achieved / ceiling
    transfer_seconds: Dict[str, float] = field(default_factory=dict)            # busy time per direction
    transfer_calls: Dict[str, int] = field(default_factory=dict)
    scheduling_passes: int = 0
    policy_config: Optional[Dict[str, Any]] = None
    stats: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def summary_rows(self) -> List[tuple]:
        hr = self.hit_rate
        rows = [
            ("mode", cache_setup_label(self.mode, self.write_policy, self.storage_backend, self.policy)),
            ("requests", f"{self.requests:,}"),
            ("token hit rate", f"{100 * self.token_hit_rate:.2f} %"),
            ("hit rate device / host / storage", tier_shares_percent(hr)),
            ("bytes D->H / H->D", f"{self.bytes_moved.get('d2h', 0):,} / {self.bytes_moved.get('h2d', 0):,}"),
            ("bytes H->L3 / L3->H", f"{self.bytes_moved.get('storage_write', 0):,} / "
                                    f"{self.bytes_moved.get('storage_read', 0):,}"),
            ("evictions device / host", f"{self.evictions.get('device', 0):,} / {self.evictions.get('host', 0):,}"),
            ("prefetch issued / done / terminated / retries",
             f"{self.prefetch.get('issued', 0)} / {self.prefetch.get('completed', 0)} / "
             f"{self.prefetch.get('terminated', 0)} / {self.prefetch.get('retries', 0)}"),
        ]
        for d, label in TIER_DIRECTIONS.items():
            if d not in self.bandwidth_gbps and self.achieved_gbps.get(d) is None:
                continue
            ratio = self.bandwidth_ratio.get(d)
            rows.append((f"{label} GB/s achieved / ceiling",
                         f"{format_rate(self.achieved_gbps.get(d))} / {format_rate(self.bandwidth_gbps.get(d))}"
                         f" ({'-' if ratio is None else f'{ratio:.2f}x'})"))
        rows += [
            ("verified pages (mismatch)", f"{self.verified_pages:,} ({self.verify_mismatch_pages})"),
            ("TTFT P50/P90/P99 (simulated)",
             f"{self.ttft_ms_p50:.1f} / {self.ttft_ms_p90:.1f} / {self.ttft_ms_p99:.1f} ms"),
            ("wall time", f"{self.wall_time_s:.3f} s"),
        ]
        return rows


def measure_bandwidth(cache, pages: int = 32, reps: int = 3) -> Dict[str, float]:
    """Ceiling GB/s per direction: one transfer of ``pages`` scratch pages, best of ``reps``
    (each on pages the previous ones did not touch, when the pools have room).

    Storage is probed with fresh random keys (never already stored, so the write really
    happens) through the same ``batch_set`` / ``batch_get`` calls the replay uses, and the
    probe pages are deleted afterwards, also when interrupted.
    """
    out: Dict[str, float] = {}
    alloc, hpool, xfer = cache.alloc, cache.hpool, cache.xfer
    n = max(1, min(pages, alloc.available_size() // cache.ps, hpool.available_size() // cache.ps))
    # a fresh set of pages per repetition where the pools allow it: repeating one small
    # transfer would measure the CPU caches, not the memory the replay's pages live in
    sets = max(1, min(reps + 1, alloc.available_size() // cache.ps // n, hpool.available_size() // cache.ps // n))
    dp, hp = alloc.alloc_pages(n * sets), hpool.alloc_pages(n * sets)
    if dp is None or hp is None:
        return out
    st = cache.storage
    probe_keys: List[str] = []
    try:
        for name in ("d2h", "h2d"):
            fn = xfer.backup if name == "d2h" else xfer.load
            fn(hp[:n], dp[:n])                        # warm-up (first touch, code paths)
            xfer.synchronize()
            best = 0.0
            for r in range(reps):
                i = (1 + r) % sets * n
                t0 = time.perf_counter()
                b = fn(hp[i:i + n], dp[i:i + n])
                xfer.synchronize()
                best = max(best, b / max(time.perf_counter() - t0, 1e-9) / 1e9)
            out[name] = best
        if st is not None:
            wbest = rbest = 0.0
            for r in range(reps + 1):                 # round 0 warms up (directory, page cache)
                keys = [uuid.uuid4().hex + uuid.uuid4().hex for _ in range(n)]
                probe_keys.extend(keys)
                vals = [cache.expected_page(k) for k in keys]
                t0 = time.perf_counter()
                ok = st.batch_set(keys, vals)
                dt = time.perf_counter() - t0
                if ok and r:
                    wbest = max(wbest, n * cache.page_bytes / max(dt, 1e-9) / 1e9)
                t0 = time.perf_counter()
                got = st.batch_get(keys)
                dt = time.perf_counter() - t0
                good = sum(1 for v in got if v is not None)
                if good and r:
                    rbest = max(rbest, good * cache.page_bytes / max(dt, 1e-9) / 1e9)
            if wbest:
                out["storage_write"] = wbest
            if rbest:
                out["storage_read"] = rbest
    finally:
        for k in probe_keys:
            st.delete(k)
        alloc.free_page_ids(dp)
        hpool.free_pages(hp)
    return out


def full_replay(record, requests, *, mode: str = "full", max_requests: Optional[int] = None,
                tail_threshold_tokens: int = 4096, progress: bool = False, policy: Optional[str] = None,
                policy_config: Optional[Dict[str, Any]] = None, verify: bool = True,
                storage=None, hardware=None) -> FullReplayResult:
    """Simulate ``requests`` on one engine of ``record`` with real KV bytes (see module doc).

    ``policy`` / ``policy_config`` override ``record.radix_eviction_policy`` / ``..._config``.
    ``storage`` overrides the backend built from ``record.hicache_storage_backend`` (tests).
    Without HiCache only the device pool is used (device tier only).
    """
    if mode != "full":
        raise ValueError(f"full_replay only runs mode='full', got {mode!r}")
    from .assemble import DeploymentInputs, build_deployment
    from .deployment import simulate
    from .replay import limit_requests

    reqs = limit_requests(requests, max_requests)
    if hardware is None:
        from ..config.hardware import compose_hardware
        hardware, _ = compose_hardware("h100_80gb", [("gpus_per_node", 1, "full_replay")])
    t_start = time.perf_counter()
    built = build_deployment(DeploymentInputs(hardware=hardware, record=record, cache_mode="full", policy=policy,
                                              policy_config=policy_config, storage=storage, verify=verify))
    probe: Dict[str, Any] = {}
    group = built.model.groups["agg"]
    make = group.make_cache

    def measured_cache():
        cache = make()
        if cache.hierarchical:          # the ceilings need both pools
            probe["bw"] = measure_bandwidth(cache.mover)
        st = cache.mover.storage if hasattr(cache.mover, "storage") else None
        probe["storage"] = st
        probe["base"] = dict(st.get_stats()) if st is not None else {}
        return cache

    try:
        if make is not None:
            group.make_cache = measured_cache
        pool = group.spec.pool_tokens
        served = [r for r in reqs if r.input_length + 1 <= pool]
        sim = simulate(built.model, served, arrival="as_is", progress=progress)
        return _result(sim, built, probe, tail_threshold_tokens, t_start, len(reqs) - len(served))
    finally:
        built.close()


def _pct(vals):
    s = sorted(vals)
    return tuple(float(nearest_rank(s, q)) if s else 0.0 for q in (0.5, 0.9, 0.99))


def _result(sim, built, probe, tail, t_start, refused) -> FullReplayResult:
    """The simulation's outcome in the shape of ``job.mode=full`` reports."""
    engine = sim.engines["agg"][0]
    cache = engine.cache
    reqs = sim.requests
    n = len(reqs)
    ps = built.model.groups["agg"].page_size
    bw = probe.get("bw", {})
    mover = built.byte_movers[0] if built.byte_movers else None
    c = dict(cache.counts) if cache is not None else {}
    g = lambda k: c.get(k, 0)   # noqa: E731
    hit = {"device": sum(s.device_hit for s in reqs), "host": sum(s.host_hit for s in reqs),
           "storage": sum(s.storage_hit for s in reqs)}
    inp = sum(s.input_len for s in reqs)
    moved, seconds, calls = {}, {}, {}
    for d in TIER_DIRECTIONS:
        moved[d] = mover.meter.bytes(d) if mover else 0
        seconds[d] = mover.meter.seconds(d) if mover else 0.0
        calls[d] = mover.meter.calls(d) if mover else 0
    achieved = {d: (moved[d] / seconds[d] / 1e9 if moved[d] > 0 and seconds[d] > 0 else None) for d in TIER_DIRECTIONS}
    ratio = {d: (achieved[d] / bw[d] if achieved[d] is not None and bw.get(d) else None) for d in TIER_DIRECTIONS}
    st = probe.get("storage")
    sstats = {}
    if st is not None:
        base = probe.get("base", {})
        for k, v in st.get_stats().items():
            sstats[k] = v - base.get(k, 0) if isinstance(v, (int, float)) else v
    unc = [s.input_len - s.device_hit - s.host_hit - s.storage_hit for s in reqs]
    ttft = [1000.0 * (s.first_token_s - s.arrival_s) for s in reqs]
    p = _pct(ttft)
    up = _pct(unc)
    stats = dict(c)
    stats.update(verified_pages=mover.stats["verified_pages"] if mover else 0,
                 verify_mismatch_pages=mover.stats["verify_mismatch_pages"] if mover else 0,
                 storage_wait_s_total=sum(s.storage_wait_s for s in reqs), refused_requests=refused)
    hier = cache is not None and cache.hierarchical
    backend = built.sides["agg"]["cache"].get("storage_backend") if hier else None
    rec = built.sides["agg"]["record"]
    return FullReplayResult(
        mode="full", policy=built.sides["agg"]["cache"].get("eviction_policy", "none"),
        policy_config=None, write_policy=cache.write_policy if hier else None,
        host_mode=(getattr(rec, "hicache_host_memory_mode", "cache") or "cache") if hier else None,
        storage_backend=backend if cache is not None and cache.has_storage else None,
        prefetch_policy=cache.prefetch_policy if cache is not None and cache.has_storage else None,
        page_size=ps, page_bytes=cache.page_bytes if cache is not None else 0,
        device_pages=cache.device_pages if cache is not None else 0,
        host_pages=cache.host_pages if cache is not None else 0, requests=n, input_tokens=inp,
        hit_tokens=hit, hit_rate={k: (v / inp if inp else 0.0) for k, v in hit.items()},
        token_hit_rate=sum(hit.values()) / inp if inp else 0.0, bytes_moved=moved,
        evictions={"device": g("device_evicted_pages"), "device_demoted": g("device_demoted_pages"),
                   "device_dropped": g("device_dropped_pages"), "host": g("host_evicted_pages"),
                   "host_reclaimed": g("host_reclaimed_pages")},
        prefetch={"issued": g("prefetch_issued"), "completed": g("prefetch_completed"),
                  "terminated": g("prefetch_terminated"), "below_threshold": g("prefetch_below_threshold"),
                  "rate_limited": g("prefetch_rate_limited"), "no_host_space": g("prefetch_no_host_space"),
                  "pages": g("prefetch_used_pages"), "issued_pages": g("prefetch_issued_pages"),
                  "present_pages": g("prefetch_present_pages"), "dropped_pages": g("prefetch_dropped_pages"),
                  "retries": g("prefetch_retries"), "retry_issued": g("prefetch_retry_issued"),
                  "retry_pages": g("prefetch_retry_pages"), "wait_s": stats["storage_wait_s_total"]},
        bandwidth_gbps=bw, achieved_gbps=achieved, bandwidth_ratio=ratio, transfer_seconds=seconds,
        transfer_calls=calls, scheduling_passes=g("scheduling_passes"),
        verified_pages=stats["verified_pages"], verify_mismatch_pages=stats["verify_mismatch_pages"],
        storage_stats=sstats, tail_threshold_tokens=tail,
        frac_uncached_gt_threshold=sum(1 for u in unc if u > tail) / n if n else 0.0,
        uncached_tokens_p50=up[0], uncached_tokens_p90=up[1], uncached_tokens_p99=up[2],
        ttft_ms_mean=sum(ttft) / n if n else 0.0, ttft_ms_p50=p[0], ttft_ms_p90=p[1], ttft_ms_p99=p[2],
        wall_time_s=time.perf_counter() - t_start, stats=stats)
