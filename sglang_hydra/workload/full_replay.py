"""``job.mode=full``: replay a trace through device/host/storage tiers with real KV bytes.

Each page's bytes are derived from its chained key (so every load is checked), the
bandwidth of each tier is measured at start-up, and the TTFT estimate per request is
``uncached tokens x prefill_us_per_token + bytes loaded from host / H2D bandwidth +
bytes read from storage / storage read bandwidth``.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import torch

from ..cache.radix import block_page_keys
from ..cache.storage import create_storage_backend, page_hashes, storage_config_from_record
from .metrics import nearest_rank
from .trace import BLOCK_SIZE

__all__ = ["FullReplayResult", "full_replay", "measure_bandwidth"]


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
    bandwidth_gbps: Dict[str, float]          # measured at start-up
    achieved_gbps: Dict[str, float]           # during the replay
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
    stats: Dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def summary_rows(self) -> List[tuple]:
        hr = self.hit_rate
        bw = ", ".join(f"{k} {v:.2f}" for k, v in self.bandwidth_gbps.items())
        rows = [
            ("mode", f"{self.mode} ({self.write_policy or 'no hicache'}"
                     f"{', ' + self.storage_backend if self.storage_backend else ''})"),
            ("requests", f"{self.requests:,}"),
            ("token hit rate", f"{100 * self.token_hit_rate:.2f} %"),
            ("hit rate device / host / storage",
             f"{100 * hr.get('device', 0):.2f} / {100 * hr.get('host', 0):.2f} / {100 * hr.get('storage', 0):.2f} %"),
            ("bytes D->H / H->D", f"{self.bytes_moved.get('d2h', 0):,} / {self.bytes_moved.get('h2d', 0):,}"),
            ("bytes H->L3 / L3->H", f"{self.bytes_moved.get('storage_write', 0):,} / "
                                    f"{self.bytes_moved.get('storage_read', 0):,}"),
            ("evictions device / host", f"{self.evictions.get('device', 0):,} / {self.evictions.get('host', 0):,}"),
            ("prefetch issued / done / terminated",
             f"{self.prefetch.get('issued', 0)} / {self.prefetch.get('completed', 0)} / "
             f"{self.prefetch.get('terminated', 0)}"),
            ("measured GB/s", bw or "-"),
            ("verified pages (mismatch)", f"{self.verified_pages:,} ({self.verify_mismatch_pages})"),
            ("TTFT estimate P50/P90/P99",
             f"{self.ttft_ms_p50:.1f} / {self.ttft_ms_p90:.1f} / {self.ttft_ms_p99:.1f} ms"),
            ("wall time", f"{self.wall_time_s:.3f} s"),
        ]
        return rows


def measure_bandwidth(cache, pages: int = 32) -> Dict[str, float]:
    """GB/s of H2D, D2H and (if any) storage write/read, measured on scratch pages."""
    out: Dict[str, float] = {}
    alloc, hpool, xfer = cache.alloc, cache.hpool, cache.xfer
    n = max(1, min(pages, alloc.available_size() // cache.ps, hpool.available_size() // cache.ps))
    dp, hp = alloc.alloc_pages(n), hpool.alloc_pages(n)
    if dp is None or hp is None:
        return out
    try:
        for name, fn in (("d2h", lambda: xfer.backup(hp, dp)), ("h2d", lambda: xfer.load(hp, dp))):
            fn()
            xfer.synchronize()
            t0 = time.perf_counter()
            b = 0
            for _ in range(3):
                b += fn()
            xfer.synchronize()
            out[name] = b / max(time.perf_counter() - t0, 1e-9) / 1e9
        st = cache.storage
        if st is not None:
            keys = [f"bwprobe{os.getpid()}x{i:04d}" + "0" * 40 for i in range(n)]
            vals = [cache.read_host_page(int(p)) for p in hp]
            t0 = time.perf_counter()
            st.batch_set(keys, vals)
            out["storage_write"] = n * cache.page_bytes / max(time.perf_counter() - t0, 1e-9) / 1e9
            t0 = time.perf_counter()
            st.batch_get(keys)
            out["storage_read"] = n * cache.page_bytes / max(time.perf_counter() - t0, 1e-9) / 1e9
            for k in keys:
                st.delete(k)
            for k in ("get", "get_hit", "set", "bytes_read", "bytes_written"):
                st.stats[k] = 0
    finally:
        alloc.free_page_ids(dp)
        hpool.free_pages(hp)
    return out


def _request_keys(r, page_size, seed_hash=None):
    ids = block_page_keys(r.hash_ids, r.input_length, page_size, BLOCK_SIZE)
    return page_hashes([(int(i),) for i in ids], seed_hash)


def _metadata_only(record, reqs, mode, tail_threshold_tokens, prefill_us_per_token, progress, policy):
    from .replay import replay
    return replay(record, reqs, tail_threshold_tokens=tail_threshold_tokens,
                  prefill_us_per_token=prefill_us_per_token, progress=progress, policy=policy)


def full_replay(record, requests, *, mode: str = "full", max_requests: Optional[int] = None,
                tail_threshold_tokens: int = 4096, prefill_us_per_token: float = 50.0,
                progress: bool = False, policy: Optional[str] = None, verify: bool = True,
                storage=None) -> FullReplayResult:
    """Replay ``requests`` through the tiers built from ``record`` (see module doc).

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
    pol = policy or getattr(record, "radix_eviction_policy", "lru") or "lru"
    hicache_on = bool(getattr(record, "enable_hierarchical_cache", False))
    rec = record
    if not hicache_on:
        # device tier only: a host pool is still needed by HiCache's plumbing; give it
        # the device size but never back anything up (write_back + no eviction copies)
        from ..config.compose import record_from_values  # noqa: F401  (same record type)
    t_start = time.perf_counter()
    mem = build_memory(rec) if hicache_on else None
    st = None
    try:
        if not hicache_on:
            return _device_only(record, reqs, ps, pol, tail_threshold_tokens, prefill_us_per_token,
                                progress, t_start)
        extra = parse_extra_config(getattr(record, "hicache_storage_backend_extra_config", None),
                                   getattr(record, "hicache_storage_backend", None))
        backend = getattr(record, "hicache_storage_backend", None)
        st = storage
        if st is None and backend:
            from ..memory.geometry import kv_geometry
            cfg = storage_config_from_record(record, page_bytes=kv_geometry(record).bytes_per_page)
            st = create_storage_backend(backend, cfg)
        cache = HiCache(mem, write_policy=record.hicache_write_policy,
                        host_mode=getattr(record, "hicache_host_memory_mode", "cache") or "cache",
                        storage=st, prefetch_policy=getattr(record, "hicache_storage_prefetch_policy", "timeout"),
                        prefetch_threshold=extra.prefetch_threshold,
                        prefetch_timeout_base=extra.prefetch_timeout_base,
                        prefetch_timeout_per_ki_token=extra.prefetch_timeout_per_ki_token,
                        eviction_policy=pol, verify=verify)
        bw = measure_bandwidth(cache)
        return _run(cache, record, reqs, ps, pol, bw, tail_threshold_tokens, prefill_us_per_token,
                    progress, t_start, backend, st)
    finally:
        if mem is not None:
            mem.close()
        if st is not None and storage is None:
            st.close()


def _iter(reqs, progress):
    if not progress:
        return reqs
    from tqdm import tqdm
    return tqdm(reqs, unit="req", desc="full replay", mininterval=0.25)


def _pct(vals):
    s = sorted(vals)
    return tuple(float(nearest_rank(s, q)) if s else 0.0 for q in (0.5, 0.9, 0.99))


def _run(cache, record, reqs, ps, pol, bw, tail, us, progress, t_start, backend, st):
    ttft, unc = [], []
    hits = {"device": 0, "host": 0, "storage": 0}
    inp = 0
    h2d_bw = bw.get("h2d") or 0.0
    sr_bw = bw.get("storage_read") or 0.0
    for r in _iter(reqs, progress):
        keys = _request_keys(r, ps)
        o = cache.serve(keys)
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
    s = cache.stats
    n = len(reqs)
    p = _pct(ttft)
    up = _pct(unc)

    def rate(b, sec):
        return b / sec / 1e9 if sec > 0 else 0.0
    return FullReplayResult(
        mode="full", policy=pol, write_policy=cache.write_policy,
        host_mode="buffer_only" if cache.buffer_only else "cache", storage_backend=backend,
        prefetch_policy=cache.prefetch_policy if st is not None else None,
        page_size=ps, page_bytes=cache.page_bytes, device_pages=cache.dpool.num_pages,
        host_pages=cache.hpool.page_num, requests=n, input_tokens=inp, hit_tokens=hits,
        hit_rate={k: v / inp if inp else 0.0 for k, v in hits.items()},
        token_hit_rate=sum(hits.values()) / inp if inp else 0.0,
        bytes_moved={"d2h": s["d2h_bytes"], "h2d": s["h2d_bytes"], "storage_write": s["storage_write_bytes"],
                     "storage_read": s["storage_read_bytes"]},
        evictions={"device": s["device_evicted_pages"], "device_demoted": s["device_demoted_pages"],
                   "device_dropped": s["device_dropped_pages"], "host": s["host_evicted_pages"],
                   "host_reclaimed": s["host_reclaimed_pages"]},
        prefetch={"issued": s["prefetch_issued"], "completed": s["prefetch_completed"],
                  "terminated": s["prefetch_terminated"], "below_threshold": s["prefetch_below_threshold"],
                  "no_host_space": s["prefetch_no_host_space"], "pages": s["prefetch_pages"],
                  "wait_s": s["prefetch_wait_seconds"]},
        bandwidth_gbps=bw,
        achieved_gbps={"d2h": rate(s["d2h_bytes"], s["d2h_seconds"]), "h2d": rate(s["h2d_bytes"], s["h2d_seconds"]),
                       "storage_write": rate(s["storage_write_bytes"], s["storage_write_seconds"]),
                       "storage_read": rate(s["storage_read_bytes"], s["storage_read_seconds"])},
        verified_pages=s["verified_pages"], verify_mismatch_pages=s["verify_mismatch_pages"],
        storage_stats=st.get_stats() if st is not None else {},
        prefill_us_per_token=us, tail_threshold_tokens=tail,
        frac_uncached_gt_threshold=sum(1 for u in unc if u > tail) / n if n else 0.0,
        uncached_tokens_p50=up[0], uncached_tokens_p90=up[1], uncached_tokens_p99=up[2],
        ttft_ms_mean=sum(ttft) / n if n else 0.0, ttft_ms_p50=p[0], ttft_ms_p90=p[1], ttft_ms_p99=p[2],
        wall_time_s=time.perf_counter() - t_start, stats=dict(s))


def _device_only(record, reqs, ps, pol, tail, us, progress, t_start):
    """No HiCache: the metadata replay is exact for a single tier; wrap it in the same shape."""
    from .replay import replay
    r = replay(record, reqs, tail_threshold_tokens=tail, prefill_us_per_token=us, progress=progress, policy=pol)
    inp = r.input_tokens
    return FullReplayResult(
        mode="full", policy=r.policy, write_policy=None, host_mode=None, storage_backend=None,
        prefetch_policy=None, page_size=ps, page_bytes=0, device_pages=r.capacity_pages or 0, host_pages=0,
        requests=r.requests, input_tokens=inp, hit_tokens={"device": r.hit_tokens, "host": 0, "storage": 0},
        hit_rate={"device": r.token_hit_rate, "host": 0.0, "storage": 0.0}, token_hit_rate=r.token_hit_rate,
        bytes_moved={}, evictions={"device": r.evictions, "host": 0}, prefetch={}, bandwidth_gbps={},
        achieved_gbps={}, verified_pages=0, verify_mismatch_pages=0, storage_stats={},
        prefill_us_per_token=us, tail_threshold_tokens=tail, frac_uncached_gt_threshold=r.frac_uncached_gt_threshold,
        uncached_tokens_p50=r.uncached_tokens_p50, uncached_tokens_p90=r.uncached_tokens_p90,
        uncached_tokens_p99=r.uncached_tokens_p99, ttft_ms_mean=r.ttft_ms_mean, ttft_ms_p50=r.ttft_ms_p50,
        ttft_ms_p90=r.ttft_ms_p90, ttft_ms_p99=r.ttft_ms_p99, wall_time_s=time.perf_counter() - t_start)
