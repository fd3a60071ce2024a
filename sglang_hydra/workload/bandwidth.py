"""Ceilings of the real-bytes transfers (``job.mode=full``): what each direction can move here.

Before the first request, one transfer of scratch pages per direction (device->host,
host->device, host->storage, storage->host) through the same calls the replay makes, best of
three.  ``job=replay job.mode=full`` reports each ceiling beside the rate the replay achieved
(bytes a tier received / time transfers in that direction ran) and their ratio.
"""
from __future__ import annotations

import time
import uuid
from typing import Dict, List

__all__ = ["measure_bandwidth", "TIER_DIRECTIONS"]

#: transfer direction -> label
TIER_DIRECTIONS = {"d2h": "device->host", "h2d": "host->device",
                   "storage_write": "host->storage", "storage_read": "storage->host"}


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
