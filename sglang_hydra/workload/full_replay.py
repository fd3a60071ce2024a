"""``job.mode=full``: replay a trace through device/host/storage tiers with real KV bytes.

The replay is :func:`~sglang_hydra.workload.tiered_replay.tiered_replay` with the real-bytes
mover: the same tree and the same decisions as the byte-free ``job.mode=sim`` (their page
counts are identical), plus real copies, storage files and a check of every page loaded.
Each page's bytes are derived from its storage key.

Scheduling and prefetch timing are those of the tiered replay (deterministic, from the
trace alone): requests that share a trace timestamp arrive together and are admitted one
per scheduling pass; a request's storage prefetch is issued on arrival and retried while it
waits (``hicache_storage_prefetch_retry_*``); without a storage bandwidth every prefetched
page has landed by admission.

Bandwidth: the *ceiling* of each transfer direction (D->H, H->D, H->storage,
storage->H) is measured at start-up on scratch pages with the same page size and the same
calls the replay makes (best of 3); the *achieved* rate is what the tier really received
during the replay divided by the time transfers in that direction were running
(:class:`~sglang_hydra.workload.metrics.TransferMeter`); ``bandwidth_ratio`` is achieved /
ceiling.

TTFT estimate per request: ``uncached tokens x prefill_us_per_token + bytes loaded from
host / H2D ceiling + bytes read from storage / storage read ceiling``.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from ..cache.storage import create_storage_backend, storage_config_from_record
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
    prefill_us_per_token: float
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
            ("TTFT estimate P50/P90/P99",
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
                tail_threshold_tokens: int = 4096, prefill_us_per_token: float = 50.0,
                progress: bool = False, policy: Optional[str] = None,
                policy_config: Optional[Dict[str, Any]] = None, verify: bool = True,
                storage=None) -> FullReplayResult:
    """Replay ``requests`` through the tiers built from ``record`` (see module doc).

    ``policy`` / ``policy_config`` override ``record.radix_eviction_policy`` / ``..._config``.
    ``storage`` overrides the backend built from ``record.hicache_storage_backend`` (tests).
    Without HiCache only the device pool is used (device tier only).
    """
    if mode != "full":
        raise ValueError(f"full_replay only runs mode='full', got {mode!r}")
    from .replay import select_requests
    from .tiered_replay import tiered_replay

    reqs = select_requests(requests, max_requests, prefill_us_per_token)
    ps = int(record.page_size or 1)
    if policy is None:
        pol = getattr(record, "radix_eviction_policy", "lru") or "lru"
        cfg = getattr(record, "radix_eviction_policy_config", None) if policy_config is None else policy_config
    else:
        pol, cfg = policy, policy_config
    t_start = time.perf_counter()
    if not getattr(record, "enable_hierarchical_cache", False):
        return _device_only(record, reqs, ps, pol, cfg, tail_threshold_tokens, prefill_us_per_token,
                            progress, t_start)
    backend = getattr(record, "hicache_storage_backend", None)
    st = storage
    try:
        if st is None and backend:
            from ..memory.geometry import kv_geometry
            scfg = storage_config_from_record(record, page_bytes=kv_geometry(record).bytes_per_page)
            st = create_storage_backend(backend, scfg)
        probe: Dict[str, Any] = {}

        def measure(mover):
            probe["bw"] = measure_bandwidth(mover)
            probe["base"] = dict(st.get_stats()) if st is not None else {}

        r = tiered_replay(record, reqs, mover="bytes", storage=st, policy=pol, policy_config=cfg,
                          verify=verify, progress=progress, on_mover=measure, keep_per_request=True)
        return _result(r, ps, probe.get("bw", {}), probe.get("base", {}), st, tail_threshold_tokens,
                       prefill_us_per_token, t_start, backend)
    finally:
        if st is not None and storage is None:
            st.close()


def _pct(vals):
    s = sorted(vals)
    return tuple(float(nearest_rank(s, q)) if s else 0.0 for q in (0.5, 0.9, 0.99))


def _result(r, ps, bw, storage_base, st, tail, us, t_start, backend) -> FullReplayResult:
    """The tiered replay's outcome in the shape of ``job.mode=full`` reports, with the TTFT
    estimate of the module doc (bytes loaded per request = its tokens x bytes per token)."""
    bytes_per_token = r.page_bytes / ps if ps else 0.0
    h2d_bw = bw.get("h2d") or 0.0
    sr_bw = bw.get("storage_read") or 0.0
    ttft = []
    for unc, host, sto in zip(r.uncached_tokens, r.host_hit_tokens, r.storage_hit_tokens):
        t = unc * us / 1000.0
        if h2d_bw > 0:
            t += (host + sto) * bytes_per_token / (h2d_bw * 1e9) * 1000.0
        if sr_bw > 0:
            t += sto * bytes_per_token / (sr_bw * 1e9) * 1000.0
        ttft.append(t)
    n = r.requests
    p = _pct(ttft)
    achieved = {}
    for d in TIER_DIRECTIONS:
        b, sec = r.bytes_moved.get(d, 0), r.transfer_seconds.get(d, 0.0)
        achieved[d] = b / sec / 1e9 if b > 0 and sec > 0 else None
    ratio = {d: (achieved[d] / bw[d] if achieved[d] is not None and bw.get(d) else None) for d in TIER_DIRECTIONS}
    sstats = {}
    if st is not None:
        for k, v in st.get_stats().items():
            sstats[k] = v - storage_base.get(k, 0) if isinstance(v, (int, float)) else v
    c = r.counts
    stats = dict(c)
    stats.update(verified_pages=r.verified_pages, verify_mismatch_pages=r.verify_mismatch_pages,
                 storage_wait_s_total=r.storage_wait_s_total)
    unc = r.uncached_tokens
    return FullReplayResult(
        mode="full", policy=r.policy, policy_config=r.policy_config, write_policy=r.write_policy,
        host_mode=r.host_mode, storage_backend=backend if r.storage_backend else None,
        prefetch_policy=r.prefetch_policy, page_size=ps, page_bytes=r.page_bytes,
        device_pages=r.device_pages or 0, host_pages=r.host_pages, requests=n, input_tokens=r.input_tokens,
        hit_tokens=dict(r.hit_tokens), hit_rate={k: r.token_hit_rate[k] for k in ("device", "host", "storage")},
        token_hit_rate=r.token_hit_rate["total"], bytes_moved={d: r.bytes_moved.get(d, 0) for d in TIER_DIRECTIONS},
        evictions={"device": c["device_evicted_pages"], "device_demoted": c["device_demoted_pages"],
                   "device_dropped": c["device_dropped_pages"], "host": c["host_evicted_pages"],
                   "host_reclaimed": c["host_reclaimed_pages"]},
        prefetch={"issued": c["prefetch_issued"], "completed": c["prefetch_completed"],
                  "terminated": c["prefetch_terminated"], "below_threshold": c["prefetch_below_threshold"],
                  "rate_limited": c["prefetch_rate_limited"], "no_host_space": c["prefetch_no_host_space"],
                  "pages": c["prefetch_used_pages"], "issued_pages": c["prefetch_issued_pages"],
                  "present_pages": c["prefetch_present_pages"], "dropped_pages": c["prefetch_dropped_pages"],
                  "retries": c["prefetch_retries"], "retry_issued": c["prefetch_retry_issued"],
                  "retry_pages": c["prefetch_retry_pages"], "wait_s": r.storage_wait_s_total},
        bandwidth_gbps=bw, achieved_gbps=achieved, bandwidth_ratio=ratio,
        transfer_seconds={d: r.transfer_seconds.get(d, 0.0) for d in TIER_DIRECTIONS},
        transfer_calls={d: r.transfer_calls.get(d, 0) for d in TIER_DIRECTIONS},
        scheduling_passes=c["scheduling_passes"],
        verified_pages=r.verified_pages, verify_mismatch_pages=r.verify_mismatch_pages,
        storage_stats=sstats, prefill_us_per_token=us, tail_threshold_tokens=tail,
        frac_uncached_gt_threshold=sum(1 for u in unc if u > tail) / n if n else 0.0,
        uncached_tokens_p50=r.uncached_tokens_p50, uncached_tokens_p90=r.uncached_tokens_p90,
        uncached_tokens_p99=r.uncached_tokens_p99,
        ttft_ms_mean=sum(ttft) / n if n else 0.0, ttft_ms_p50=p[0], ttft_ms_p90=p[1], ttft_ms_p99=p[2],
        wall_time_s=time.perf_counter() - t_start, stats=stats)


def _device_only(record, reqs, ps, pol, cfg, tail, us, progress, t_start):
    """No HiCache: the metadata replay is exact for a single tier; wrap it in the same shape."""
    from .replay import replay
    r = replay(record, reqs, tail_threshold_tokens=tail, prefill_us_per_token=us, progress=progress,
               policy=pol, policy_config=cfg)
    inp = r.input_tokens
    return FullReplayResult(
        mode="full", policy=r.policy, policy_config=r.policy_config, write_policy=None, host_mode=None,
        storage_backend=None, prefetch_policy=None, page_size=ps, page_bytes=0,
        device_pages=r.capacity_pages or 0, host_pages=0,
        requests=r.requests, input_tokens=inp, hit_tokens={"device": r.hit_tokens, "host": 0, "storage": 0},
        hit_rate={"device": r.token_hit_rate, "host": 0.0, "storage": 0.0}, token_hit_rate=r.token_hit_rate,
        bytes_moved={}, evictions={"device": r.evictions, "host": 0}, prefetch={}, bandwidth_gbps={},
        achieved_gbps={}, verified_pages=0, verify_mismatch_pages=0, storage_stats={},
        prefill_us_per_token=us, tail_threshold_tokens=tail, frac_uncached_gt_threshold=r.frac_uncached_gt_threshold,
        uncached_tokens_p50=r.uncached_tokens_p50, uncached_tokens_p90=r.uncached_tokens_p90,
        uncached_tokens_p99=r.uncached_tokens_p99, ttft_ms_mean=r.ttft_ms_mean, ttft_ms_p50=r.ttft_ms_p50,
        ttft_ms_p90=r.ttft_ms_p90, ttft_ms_p99=r.ttft_ms_p99, wall_time_s=time.perf_counter() - t_start)
