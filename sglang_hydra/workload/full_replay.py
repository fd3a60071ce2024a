"""``job.mode=full``: replay a trace through device/host/storage tiers with real KV bytes.

Each page's bytes are derived from its chained key, so every load is checked.

Scheduling (deterministic, from the trace order alone): requests that share a trace
timestamp arrive together (the Mooncake traces are quantised to ~3 s steps); each
scheduling pass admits the head of the waiting queue; the next group arrives once the
queue has drained.  A request's storage prefetch is issued on arrival, and its misses are
asked again while it waits (``hicache_storage_prefetch_retry_*``, see
:mod:`sglang_hydra.cache.hicache`).

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
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from ..cache.radix import block_page_keys
from ..cache.storage import create_storage_backend, page_hashes, storage_config_from_record
from .metrics import format_rate, nearest_rank
from .trace import BLOCK_SIZE

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
            ("mode", f"{self.mode} ({self.write_policy or 'no hicache'}"
                     f"{', ' + self.storage_backend if self.storage_backend else ''}, {self.policy})"),
            ("requests", f"{self.requests:,}"),
            ("token hit rate", f"{100 * self.token_hit_rate:.2f} %"),
            ("hit rate device / host / storage",
             f"{100 * hr.get('device', 0):.2f} / {100 * hr.get('host', 0):.2f} / {100 * hr.get('storage', 0):.2f} %"),
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


def _request_keys(r, page_size, seed_hash=None):
    ids = block_page_keys(r.hash_ids, r.input_length, page_size, BLOCK_SIZE)
    return page_hashes([(int(i),) for i in ids], seed_hash)


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
    from ..cache.hicache import HiCache
    from ..config.extra_config import parse_extra_config
    from ..memory import build_memory
    from .replay import select_requests

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
    extra = parse_extra_config(getattr(record, "hicache_storage_backend_extra_config", None),
                               getattr(record, "hicache_storage_backend", None))
    backend = getattr(record, "hicache_storage_backend", None)
    mem = build_memory(record)
    st = storage
    cache = None
    try:
        if st is None and backend:
            from ..memory.geometry import kv_geometry
            scfg = storage_config_from_record(record, page_bytes=kv_geometry(record).bytes_per_page)
            st = create_storage_backend(backend, scfg)
        cache = HiCache(mem, write_policy=record.hicache_write_policy,
                        host_mode=getattr(record, "hicache_host_memory_mode", "cache") or "cache",
                        storage=st, prefetch_policy=getattr(record, "hicache_storage_prefetch_policy", "timeout"),
                        prefetch_threshold=extra.prefetch_threshold,
                        prefetch_timeout_base=extra.prefetch_timeout_base,
                        prefetch_timeout_per_ki_token=extra.prefetch_timeout_per_ki_token,
                        prefetch_retry_poll_interval=getattr(record, "hicache_storage_prefetch_retry_poll_interval", 8),
                        prefetch_retry_max_attempts=getattr(record, "hicache_storage_prefetch_retry_max_attempts", 8),
                        eviction_policy=pol, eviction_policy_config=cfg, verify=verify)
        bw = measure_bandwidth(cache)
        base = dict(st.get_stats()) if st is not None else {}
        return _run(cache, reqs, ps, pol, cfg, bw, tail_threshold_tokens, prefill_us_per_token,
                    progress, t_start, backend, st, base)
    finally:
        if cache is not None:
            cache.close()
        mem.close()
        if st is not None and storage is None:
            st.close()


def _progress(total, enabled):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, unit="req", desc="full replay", mininterval=0.25)


def _pct(vals):
    s = sorted(vals)
    return tuple(float(nearest_rank(s, q)) if s else 0.0 for q in (0.5, 0.9, 0.99))


def _admissions(cache, reqs, ps):
    """Drive the scheduling model of the module doc; yields (request, HiCache.admit result)."""
    waiting: deque = deque()
    i, n = 0, len(reqs)
    while i < n or waiting:
        if not waiting:                 # idle: the next group of simultaneous arrivals comes in
            ts = reqs[i].timestamp
            while i < n and reqs[i].timestamp == ts:
                cache.arrive(i, _request_keys(reqs[i], ps))
                waiting.append(i)
                i += 1
        cache.scheduling_pass(waiting)
        j = waiting.popleft()
        yield reqs[j], cache.admit(j, reqs[j].priority)


def _run(cache, reqs, ps, pol, cfg, bw, tail, us, progress, t_start, backend, st, storage_base):
    ttft, unc = [], []
    hits = {"device": 0, "host": 0, "storage": 0}
    inp = 0
    h2d_bw = bw.get("h2d") or 0.0
    sr_bw = bw.get("storage_read") or 0.0
    bar = _progress(len(reqs), progress)
    try:
        for r, o in _admissions(cache, reqs, ps):
            hit_pages = o["device"] + o["host"] + o["storage"]
            ht = min(hit_pages * ps, r.input_length)
            dt = min(o["device"] * ps, r.input_length)
            hh = min((o["device"] + o["host"]) * ps, r.input_length) - dt
            hits["device"] += dt
            hits["host"] += hh
            hits["storage"] += ht - dt - hh
            inp += r.input_length
            u = r.input_length - ht
            unc.append(u)
            t = u * us / 1000.0
            if h2d_bw > 0:
                t += o["h2d_bytes"] / (h2d_bw * 1e9) * 1000.0
            if sr_bw > 0:
                t += o["storage_bytes"] / (sr_bw * 1e9) * 1000.0
            ttft.append(t)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    s = cache.summary_stats()
    meter = cache.meter
    n = len(reqs)
    p = _pct(ttft)
    up = _pct(unc)
    achieved = {d: meter.rate_gbps(d) for d in TIER_DIRECTIONS}
    ratio = {d: (achieved[d] / bw[d] if achieved[d] is not None and bw.get(d) else None) for d in TIER_DIRECTIONS}
    sstats = {}
    if st is not None:
        for k, v in st.get_stats().items():
            sstats[k] = v - storage_base.get(k, 0) if isinstance(v, (int, float)) else v
    return FullReplayResult(
        mode="full", policy=pol, policy_config=dict(cfg) if cfg else None, write_policy=cache.write_policy,
        host_mode="buffer_only" if cache.buffer_only else "cache", storage_backend=backend,
        prefetch_policy=cache.prefetch_policy if st is not None else None,
        page_size=ps, page_bytes=cache.page_bytes, device_pages=cache.dpool.num_pages,
        host_pages=cache.hpool.page_num, requests=n, input_tokens=inp, hit_tokens=hits,
        hit_rate={k: v / inp if inp else 0.0 for k, v in hits.items()},
        token_hit_rate=sum(hits.values()) / inp if inp else 0.0,
        bytes_moved={d: meter.bytes(d) for d in TIER_DIRECTIONS},
        evictions={"device": s["device_evicted_pages"], "device_demoted": s["device_demoted_pages"],
                   "device_dropped": s["device_dropped_pages"], "host": s["host_evicted_pages"],
                   "host_reclaimed": s["host_reclaimed_pages"]},
        prefetch={"issued": s["prefetch_issued"], "completed": s["prefetch_completed"],
                  "terminated": s["prefetch_terminated"], "below_threshold": s["prefetch_below_threshold"],
                  "rate_limited": s["prefetch_rate_limited"], "no_host_space": s["prefetch_no_host_space"],
                  "pages": s["prefetch_pages"], "present_pages": s["prefetch_present_pages"],
                  "discarded_pages": s["prefetch_discarded_pages"], "retries": s["prefetch_retries"],
                  "retry_issued": s["prefetch_retry_issued"], "retry_pages": s["prefetch_retry_pages"],
                  "wait_s": s["prefetch_wait_seconds"]},
        bandwidth_gbps=bw, achieved_gbps=achieved, bandwidth_ratio=ratio,
        transfer_seconds={d: meter.seconds(d) for d in TIER_DIRECTIONS},
        transfer_calls={d: meter.calls(d) for d in TIER_DIRECTIONS},
        scheduling_passes=s["scheduling_passes"],
        verified_pages=s["verified_pages"], verify_mismatch_pages=s["verify_mismatch_pages"],
        storage_stats=sstats, prefill_us_per_token=us, tail_threshold_tokens=tail,
        frac_uncached_gt_threshold=sum(1 for u in unc if u > tail) / n if n else 0.0,
        uncached_tokens_p50=up[0], uncached_tokens_p90=up[1], uncached_tokens_p99=up[2],
        ttft_ms_mean=sum(ttft) / n if n else 0.0, ttft_ms_p50=p[0], ttft_ms_p90=p[1], ttft_ms_p99=p[2],
        wall_time_s=time.perf_counter() - t_start, stats=s)


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
