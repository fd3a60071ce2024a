"""Replay a trace through the tiered cache (device, host, storage) with either mover.

``mover="count"`` (``job.mode=sim``) moves no bytes; ``mover="bytes"`` (``job.mode=full``)
moves real KV bytes through the pools, the transfer backend and a storage backend.  Both
run the same :class:`~sglang_hydra.cache.tiered.TieredCache`, so their page counts agree
page for page; only the cost of a move differs.  With HiCache off the cache is the
single-tier cache of ``replay_rules.md`` (same counts as :func:`~.replay.replay`).

Scheduling: requests are admitted one at a time in trace order.  Arrival = the trace
timestamp (ms -> s).  Request ``j`` starts at ``timeline.start_time(arrival)`` when a
``timeline`` is given (see :mod:`sglang_hydra.workload.ttft`), else at its arrival (the
engine is never busy: requests that share a timestamp arrive together and are admitted
one per scheduling pass, the deterministic logical model).  Before ``j`` is admitted every
request that has arrived by its start joins the queue (its storage prefetch is issued at
its arrival) and one scheduling pass runs (prefetch retries).  Prefetch progress comes from
``storage_read_bytes_per_s`` (unbounded when None); no result ever depends on wall time
(``wall_time_s`` and ``page_lookups_per_s`` only report how long the replay took).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from ..cache.movers import CountingMover
from ..cache.policies import get_policy_info, make_policy
from ..cache.radix import block_page_keys, block_page_weights
from ..cache.tiered import (DEFAULT_RETRY_MAX_ATTEMPTS, DEFAULT_RETRY_POLL_INTERVAL, UNBOUNDED_PAGES,
                            TieredCache)
from .metrics import cache_setup_label, nearest_rank, tier_shares_percent
from .replay import limit_requests
from .trace import BLOCK_SIZE, Request

__all__ = ["TieredReplayResult", "tiered_replay", "MOVERS", "TIER_COUNT_KEYS", "storage_read_rate",
           "sim_host_pages", "UNBOUNDED_PAGES"]

MOVERS = ("count", "bytes")
#: the per-tier page counts both movers must agree on
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


def storage_read_rate(value) -> Optional[float]:
    """Bytes/s from a number (bytes/s) or from an object with ``storage_read_gbps`` (GB/s)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"storage read bandwidth must be a number of bytes/s, got {value!r}")
    if isinstance(value, (int, float)):
        rate = float(value)
    else:
        gbps = getattr(value, "storage_read_gbps", None)
        if gbps is None:
            raise ValueError(f"storage read bandwidth: {value!r} is neither bytes/s nor has storage_read_gbps")
        rate = float(gbps) * 1e9
    if not rate > 0:
        raise ValueError(f"storage read bandwidth must be > 0 bytes/s, got {rate!r}")
    return rate


def sim_host_pages(record, device_pages: int, bytes_per_token: int) -> int:
    """Host tier pages for a byte-free replay, from the record alone (no allocation, no
    live memory): ``hicache_size`` GB if set, else ``hicache_ratio`` x the device tokens,
    floored to pages plus one, as the memory plan sizes the host pool."""
    from ..memory.hostmem import host_pool_tokens

    ps = int(record.page_size or 1)
    ratio = getattr(record, "hicache_ratio", None)
    size_gb = getattr(record, "hicache_size", 0) or 0
    _, pages = host_pool_tokens(page_size=ps, size_per_token=max(1, int(bytes_per_token)),
                                device_tokens=device_pages * ps, ratio=ratio, hicache_size_gb=size_gb)
    return pages


@dataclass
class TieredReplayResult:
    """Outcome of a tiered replay.  Counts are pages unless the name says tokens;
    :meth:`to_dict` is JSON-serialisable and leaves the per-request arrays out by default."""

    mode: str                          # "sim" (counting mover) or "full" (real bytes)
    policy: str
    policy_config: Optional[Dict[str, Any]]
    hierarchical: bool
    write_policy: Optional[str]
    host_mode: Optional[str]
    storage_backend: Optional[str]
    prefetch_policy: Optional[str]
    storage_read_bytes_per_s: Optional[float]
    page_size: int
    page_bytes: int
    device_pages: Optional[int]        # None = unbounded
    host_pages: int
    requests: int
    lookup_pages: int
    input_tokens: int
    hit_pages: Dict[str, int]          # device / host / storage
    hit_tokens: Dict[str, int]
    page_hit_rate: Dict[str, float]
    token_hit_rate: Dict[str, float]   # per tier and "total"
    pages_written_to_host: int
    pages_written_to_storage: int
    evicted_pages: Dict[str, int]
    load_back_pages: int
    prefetch: Dict[str, int]
    uncached_tokens_p50: float
    uncached_tokens_p90: float
    uncached_tokens_p99: float
    storage_wait_s_total: float
    ttft_s_mean: Optional[float]
    ttft_s_p50: Optional[float]
    ttft_s_p90: Optional[float]
    ttft_s_p99: Optional[float]
    wall_time_s: float
    page_lookups_per_s: float
    counts: Dict[str, int] = field(default_factory=dict)
    bytes_moved: Dict[str, int] = field(default_factory=dict)       # real-bytes mover only
    transfer_seconds: Dict[str, float] = field(default_factory=dict)
    transfer_calls: Dict[str, int] = field(default_factory=dict)
    verified_pages: int = 0
    verify_mismatch_pages: int = 0
    device_hit_tokens: Optional[List[int]] = field(default=None, repr=False)
    host_hit_tokens: Optional[List[int]] = field(default=None, repr=False)
    storage_hit_tokens: Optional[List[int]] = field(default=None, repr=False)
    uncached_tokens: Optional[List[int]] = field(default=None, repr=False)
    ttft_s: Optional[List[float]] = field(default=None, repr=False)

    PER_REQUEST = ("device_hit_tokens", "host_hit_tokens", "storage_hit_tokens", "uncached_tokens", "ttft_s")

    def to_dict(self, *, include_per_request: bool = False) -> Dict[str, Any]:
        d = asdict(self)
        if not include_per_request:
            for k in self.PER_REQUEST:
                d.pop(k, None)
        return d

    def tier_counts(self) -> Dict[str, int]:
        """The page counts both movers must agree on."""
        return {k: self.counts.get(k, 0) for k in TIER_COUNT_KEYS}

    def summary_rows(self) -> List[tuple]:
        hr = self.token_hit_rate
        rows = [
            ("mode", cache_setup_label(self.mode, self.write_policy, self.storage_backend, self.policy)),
            ("requests", f"{self.requests:,}"),
            ("token hit rate", f"{100 * hr.get('total', 0):.2f} %"),
            ("token hit rate device / host / storage", tier_shares_percent(hr)),
            ("pages written to host / storage", f"{self.pages_written_to_host:,} / {self.pages_written_to_storage:,}"),
            ("evicted pages device / host", f"{self.evicted_pages.get('device', 0):,} / "
                                            f"{self.evicted_pages.get('host', 0):,}"),
            ("load-back pages", f"{self.load_back_pages:,}"),
            ("prefetch pages issued / used / dropped",
             f"{self.prefetch.get('issued_pages', 0):,} / {self.prefetch.get('used_pages', 0):,} / "
             f"{self.prefetch.get('dropped_pages', 0):,}"),
            ("uncached tokens P50/P90/P99", f"{self.uncached_tokens_p50:,.0f} / {self.uncached_tokens_p90:,.0f} / "
                                            f"{self.uncached_tokens_p99:,.0f}"),
        ]
        if self.ttft_s_p90 is not None:
            rows.append(("TTFT mean / P90", f"{1000 * self.ttft_s_mean:.1f} / {1000 * self.ttft_s_p90:.1f} ms"))
        rows.append(("wall time", f"{self.wall_time_s:.3f} s"))
        return rows


def _request_units(reqs: List[Request], page_size: int, block_size: int):
    """(keys, weights or None) per request: one weighted unit per trace block when pages
    are smaller than a block, else one unit per page."""
    if page_size < block_size and block_size % page_size == 0:
        return ([r.hash_ids for r in reqs],
                [block_page_weights(r.hash_ids, r.input_length, page_size, block_size) for r in reqs])
    return [block_page_keys(r.hash_ids, r.input_length, page_size, block_size) for r in reqs], None


def _pct(values):
    s = sorted(values)
    return tuple(float(nearest_rank(s, q)) if s else 0.0 for q in (0.5, 0.9, 0.99))


def tiered_replay(record, requests: Iterable[Request], *, mover: str = "count", timeline=None,
                  host_pages: Optional[int] = None, device_pages: Optional[int] = None,
                  storage_read_bytes_per_s=None, storage=None, policy: Optional[str] = None,
                  policy_config: Optional[Dict[str, Any]] = None, max_requests: Optional[int] = None,
                  keep_per_request: bool = True, verify: bool = True, progress: bool = False,
                  load_back_threshold: int = 10, block_size: int = BLOCK_SIZE,
                  on_mover=None) -> TieredReplayResult:
    """Replay ``requests`` under ``record``'s cache settings through the tiered cache.

    ``mover``: ``"count"`` (no bytes) or ``"bytes"`` (real pools; the tier sizes are the
    built pools', so ``host_pages`` / ``device_pages`` must not be given).  Sim tier sizes:
    ``device_pages`` (default ``max_total_tokens // page_size``; unbounded when unset) and
    ``host_pages`` (default :func:`sim_host_pages`; pass what the memory plan for the target
    hardware says).  ``storage_read_bytes_per_s``: bytes/s, or an object with
    ``storage_read_gbps``; None = storage reads take no time.  ``storage``: a storage
    backend to use instead of the record's (bytes mover only).  ``policy`` /
    ``policy_config`` override the record's eviction policy (``belady``, ``fifo``).
    ``on_mover(mover)`` runs once the mover exists, before the first request (the
    real-bytes replay measures its bandwidth ceilings there).
    """
    if mover not in MOVERS:
        raise ValueError(f"unknown mover {mover!r}; allowed: {', '.join(MOVERS)}")
    reqs = limit_requests(requests, max_requests)
    ps = int(record.page_size or 1)
    if policy is None:
        pol_name = record.radix_eviction_policy
        pol_cfg = getattr(record, "radix_eviction_policy_config", None) if policy_config is None else policy_config
    else:
        pol_name, pol_cfg = policy, policy_config
    get_policy_info(pol_name)                     # unknown names fail here, before any work
    read_rate = storage_read_rate(storage_read_bytes_per_s)
    hierarchical = bool(getattr(record, "enable_hierarchical_cache", False))
    backend = getattr(record, "hicache_storage_backend", None) if hierarchical else None
    if storage is not None and mover != "bytes":
        raise ValueError("a storage backend object only makes sense with mover='bytes'")
    host_mode = (getattr(record, "hicache_host_memory_mode", "cache") or "cache") if hierarchical else None

    t0 = time.perf_counter()
    memory = st = bytes_mover = None
    try:
        if mover == "bytes":
            if host_pages is not None or device_pages is not None:
                raise ValueError("mover='bytes' sizes its tiers from the built pools; "
                                 "host_pages / device_pages are for mover='count'")
            from ..cache.bytes_mover import BytesMover
            from ..cache.storage import create_storage_backend, storage_config_from_record
            from ..memory import build_memory

            memory = build_memory(record)
            st = storage
            if st is None and backend:
                from ..memory.geometry import kv_geometry
                st = create_storage_backend(
                    backend, storage_config_from_record(record, page_bytes=kv_geometry(record).bytes_per_page))
            bytes_mover = BytesMover(memory, st if hierarchical else None, verify=verify)
            the_mover = bytes_mover
            page_bytes = bytes_mover.page_bytes
        else:
            from ..memory.geometry import kv_geometry

            geo = kv_geometry(record)
            page_bytes = geo.bytes_per_page
            max_tokens = record.max_total_tokens
            if device_pages is None:
                device_pages = UNBOUNDED_PAGES if max_tokens is None else int(max_tokens) // ps
            if hierarchical and host_pages is None:
                host_pages = sim_host_pages(record, device_pages, geo.bytes_per_token)
            the_mover = CountingMover(device_pages, host_pages or 0, has_storage=bool(backend),
                                      page_bytes=page_bytes)
        if on_mover is not None:
            on_mover(the_mover)
        return _run(record, reqs, the_mover, bytes_mover, timeline, ps, pol_name, pol_cfg, read_rate,
                    hierarchical, backend, host_mode, load_back_threshold, keep_per_request, progress,
                    block_size, page_bytes, t0)
    finally:
        if memory is not None:
            memory.close()
        if st is not None and storage is None:
            st.close()


def _run(record, reqs, the_mover, bytes_mover, timeline, ps, pol_name, pol_cfg, read_rate, hierarchical,
         backend, host_mode, load_back_threshold, keep_per_request, progress, block_size, page_bytes, t0):
    from ..config.extra_config import parse_extra_config

    extra = parse_extra_config(getattr(record, "hicache_storage_backend_extra_config", None), backend)
    pol = make_policy(pol_name, pol_cfg, page_size=ps)
    prefetch_policy = (getattr(record, "hicache_storage_prefetch_policy", None) or "best_effort") if backend else None
    write_policy = getattr(record, "hicache_write_policy", None) if hierarchical else None
    cache = TieredCache(
        the_mover, policy=pol, page_size=ps, hierarchical=hierarchical,
        write_policy=write_policy or "write_through", host_mode=host_mode or "cache",
        prefetch_policy=prefetch_policy or "best_effort", prefetch_threshold=extra.prefetch_threshold,
        prefetch_timeout_base=extra.prefetch_timeout_base,
        prefetch_timeout_per_ki_token=extra.prefetch_timeout_per_ki_token,
        load_back_threshold=load_back_threshold,
        retry_poll_interval=getattr(record, "hicache_storage_prefetch_retry_poll_interval",
                                    DEFAULT_RETRY_POLL_INTERVAL),
        retry_max_attempts=getattr(record, "hicache_storage_prefetch_retry_max_attempts",
                                   DEFAULT_RETRY_MAX_ATTEMPTS),
        storage_read_bytes_per_s=read_rate)
    keys, weights = _request_units(reqs, ps, block_size)
    if pol.needs_future:
        pol.prepare(keys)
    n = len(reqs)
    dev_tok = [0] * n
    host_tok = [0] * n
    sto_tok = [0] * n
    unc = [0] * n
    ttft: Optional[List[float]] = [0.0] * n if timeline is not None else None
    disabled = bool(getattr(record, "disable_radix_cache", False))
    arrival = [r.timestamp / 1000.0 for r in reqs]
    storage_wait = 0.0
    lookup_pages = 0
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=n, unit="req", desc="tiered replay", mininterval=0.25)
    try:
        queue: deque = deque()
        nxt = 0
        arrive, admit, scheduling_pass = cache.arrive, cache.admit, cache.scheduling_pass
        for j in range(n):
            r = reqs[j]
            length = r.input_length
            start = arrival[j]
            if timeline is not None:
                start = max(start, float(timeline.start_time(arrival[j])))
            if disabled:
                unc[j] = length
                lookup_pages += len(keys[j]) if weights is None else sum(weights[j])
                if timeline is not None:
                    ttft[j] = float(timeline.serve(arrival[j], length, 0, 0, 0, 0.0))
                continue
            while nxt < n and (nxt <= j or arrival[nxt] <= start):
                arrive(nxt, keys[nxt], None if weights is None else weights[nxt], arrival[nxt])
                queue.append(nxt)
                nxt += 1
            scheduling_pass(queue, start)
            queue.popleft()
            adm = admit(j, clock=j, priority=r.priority, now_s=start)
            lookup_pages += adm.lookup_pages
            d = adm.device_pages * ps
            if d > length:
                d = length
            h = (adm.device_pages + adm.host_pages) * ps
            if h > length:
                h = length
            a = adm.hit_pages * ps
            if a > length:
                a = length
            dev_tok[j] = d
            host_tok[j] = h - d
            sto_tok[j] = a - h
            unc[j] = length - a
            storage_wait += adm.storage_wait_s
            if timeline is not None:
                ttft[j] = float(timeline.serve(arrival[j], length, d, h - d, a - h, adm.storage_wait_s))
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        cache.close()
    wall = time.perf_counter() - t0
    c = dict(cache.counts)
    inp = sum(r.input_length for r in reqs)
    hit_pages = {"device": c["device_hit_pages"], "host": c["host_hit_pages"], "storage": c["storage_hit_pages"]}
    hit_tokens = {"device": sum(dev_tok), "host": sum(host_tok), "storage": sum(sto_tok)}
    token_rate = {k: (v / inp if inp else 0.0) for k, v in hit_tokens.items()}
    token_rate["total"] = sum(hit_tokens.values()) / inp if inp else 0.0
    up = _pct(unc)
    tp = _pct(ttft) if ttft else (None, None, None)
    bytes_moved, seconds, calls, verified, mismatched = {}, {}, {}, 0, 0
    if bytes_mover is not None:
        for direction in ("d2h", "h2d", "storage_write", "storage_read"):
            bytes_moved[direction] = bytes_mover.meter.bytes(direction)
            seconds[direction] = bytes_mover.meter.seconds(direction)
            calls[direction] = bytes_mover.meter.calls(direction)
        verified = bytes_mover.stats["verified_pages"]
        mismatched = bytes_mover.stats["verify_mismatch_pages"]
    return TieredReplayResult(
        mode="full" if bytes_mover is not None else "sim", policy=pol_name,
        policy_config=dict(pol_cfg) if pol_cfg else None, hierarchical=cache.hierarchical,
        write_policy=cache.write_policy if cache.hierarchical else None,
        host_mode=host_mode if cache.hierarchical else None, storage_backend=backend if cache.has_storage else None,
        prefetch_policy=prefetch_policy if cache.has_storage else None, storage_read_bytes_per_s=read_rate,
        page_size=ps, page_bytes=page_bytes,
        device_pages=None if cache.device_pages >= UNBOUNDED_PAGES else cache.device_pages,
        host_pages=cache.host_pages, requests=n, lookup_pages=lookup_pages, input_tokens=inp,
        hit_pages=hit_pages, hit_tokens=hit_tokens,
        page_hit_rate={k: (v / lookup_pages if lookup_pages else 0.0) for k, v in hit_pages.items()},
        token_hit_rate=token_rate, pages_written_to_host=c["host_written_pages"],
        pages_written_to_storage=c["storage_written_pages"],
        evicted_pages={"device": c["device_evicted_pages"], "device_demoted": c["device_demoted_pages"],
                       "device_dropped": c["device_dropped_pages"], "host": c["host_evicted_pages"],
                       "host_reclaimed": c["host_reclaimed_pages"], "host_dropped": c["host_dropped_pages"]},
        load_back_pages=c["load_back_pages"],
        prefetch={"issued": c["prefetch_issued"], "issued_pages": c["prefetch_issued_pages"],
                  "used_pages": c["prefetch_used_pages"], "dropped_pages": c["prefetch_dropped_pages"],
                  "completed": c["prefetch_completed"], "terminated": c["prefetch_terminated"],
                  "retries": c["prefetch_retries"], "retry_pages": c["prefetch_retry_pages"]},
        uncached_tokens_p50=up[0], uncached_tokens_p90=up[1], uncached_tokens_p99=up[2],
        storage_wait_s_total=storage_wait,
        ttft_s_mean=(sum(ttft) / n if n else 0.0) if ttft is not None else None,
        ttft_s_p50=tp[0], ttft_s_p90=tp[1], ttft_s_p99=tp[2],
        wall_time_s=wall, page_lookups_per_s=lookup_pages / wall if wall > 0 else 0.0,
        counts=c, bytes_moved=bytes_moved, transfer_seconds=seconds, transfer_calls=calls, verified_pages=verified,
        verify_mismatch_pages=mismatched,
        device_hit_tokens=dev_tok if keep_per_request else None,
        host_hit_tokens=host_tok if keep_per_request else None,
        storage_hit_tokens=sto_tok if keep_per_request else None,
        uncached_tokens=unc if keep_per_request else None,
        ttft_s=ttft if keep_per_request else None)
