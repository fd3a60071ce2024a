"""Request-by-request HiCache over real KV pools: the tiered cache with the real-bytes mover.

:class:`HiCache` is a thin front of :class:`~sglang_hydra.cache.tiered.TieredCache` (the one
tree every replay uses) with :class:`~sglang_hydra.cache.bytes_mover.BytesMover`, for callers
that feed requests one at a time as lists of page keys (chained page hashes, one page per
key).  No job runs it (``job=replay`` drives the tree through its engines); tests and
``scripts/fault_matrix.py`` do.  All decisions - hits, evictions, write-through / write-back, host eviction, load-back,
storage writes, prefetch and its retries - are the tiered cache's; see that module for the
semantics (reference §5.2-§5.7, §5.11).

Timing is a model, never the wall clock: ``arrive`` and ``admit`` take the time ``now_s``
(seconds); with ``storage_read_bytes_per_s`` a prefetch has read ``floor(elapsed * rate /
page_bytes)`` pages by admission and ``best_effort`` / ``wait_complete`` / ``timeout`` decide
what the request waits for; without it every prefetched page has landed.
"""
from __future__ import annotations

from typing import Dict, Hashable, Optional, Sequence

from .bytes_mover import BytesMover
from .policies import get_policy_info, make_policy
from .storage import STORAGE_BATCH_SIZE, StorageBackend
from .tiered import (DEFAULT_RETRY_MAX_ATTEMPTS, DEFAULT_RETRY_POLL_INTERVAL, PREFETCH_POLICIES,
                     WRITE_POLICIES, PrefetchRetries, TieredCache)

__all__ = ["HiCache", "PrefetchRetries", "WRITE_POLICIES", "PREFETCH_POLICIES",
           "DEFAULT_RETRY_POLL_INTERVAL", "DEFAULT_RETRY_MAX_ATTEMPTS"]

#: old statistic names -> tiered cache counts
_RENAMED = {"backup_pages": "host_written_pages", "backup_failed_pages": "host_write_failed_pages",
            "storage_write_pages": "storage_written_pages", "prefetch_pages": "prefetch_used_pages",
            "prefetch_discarded_pages": "prefetch_dropped_pages",
            "dropped_unbacked_pages": "device_dropped_pages"}


class HiCache:
    """Tiered page cache over the pools of a :class:`~sglang_hydra.memory.KVMemory`."""

    TRANSFER_DIRECTIONS = ("d2h", "h2d", "storage_write", "storage_read")

    def __init__(self, memory, *, write_policy: str = "write_through", host_mode: str = "cache",
                 storage: Optional[StorageBackend] = None, prefetch_policy: str = "timeout",
                 prefetch_threshold: int = 256, prefetch_timeout_base: float = 1.0,
                 prefetch_timeout_per_ki_token: float = 0.25, load_back_threshold: int = 10,
                 eviction_policy: str = "lru", eviction_policy_config: Optional[dict] = None,
                 prefetch_retry_poll_interval: int = DEFAULT_RETRY_POLL_INTERVAL,
                 prefetch_retry_max_attempts: int = DEFAULT_RETRY_MAX_ATTEMPTS,
                 verify: bool = True, storage_batch_size: int = STORAGE_BATCH_SIZE,
                 storage_read_bytes_per_s: Optional[float] = None):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"Invalid write policy: {write_policy}")
        info = get_policy_info(eviction_policy)          # unknown names: ValueError listing the known
        if info.cls.needs_future:
            raise ValueError(f"eviction policy {eviction_policy!r} needs the whole request sequence in advance, "
                             "which a request-by-request cache never has: run it in a replay (job.mode=device_only, "
                             "sim or full)")
        if memory.host_pool is None:
            raise ValueError("HiCache needs a host pool (enable_hierarchical_cache)")
        self.mem = memory
        self.mover = BytesMover(memory, storage, verify=verify, storage_batch_pages=storage_batch_size)
        self.dpool, self.alloc, self.hpool, self.xfer = self.mover.dpool, self.mover.alloc, self.mover.hpool, self.mover.xfer
        self.ps = self.mover.page_size
        self.storage = storage
        self.page_bytes = self.mover.page_bytes
        self.meter = self.mover.meter
        self.tree = TieredCache(
            self.mover, policy=make_policy(eviction_policy, eviction_policy_config, page_size=self.ps),
            page_size=self.ps, write_policy=write_policy, host_mode=host_mode, prefetch_policy=prefetch_policy,
            prefetch_threshold=prefetch_threshold, prefetch_timeout_base=prefetch_timeout_base,
            prefetch_timeout_per_ki_token=prefetch_timeout_per_ki_token,
            load_back_threshold=load_back_threshold, retry_poll_interval=prefetch_retry_poll_interval,
            retry_max_attempts=prefetch_retry_max_attempts, storage_read_bytes_per_s=storage_read_bytes_per_s)
        self.write_policy = self.tree.write_policy
        self.buffer_only = self.tree.buffer_only
        self.prefetch_policy = prefetch_policy
        self.eviction_policy = eviction_policy
        self._serial = 0

    # ------------------------------------------------------------------ views
    @property
    def retries(self) -> PrefetchRetries:
        return self.tree.retries

    @property
    def passes(self) -> int:
        """Scheduling passes so far."""
        return self.tree.retries.step

    @property
    def nodes(self) -> Dict[Hashable, object]:
        """Page key -> tree node (one page per node here), for inspection."""
        return {n.key: n for n in self.tree.iter_nodes()}

    @property
    def stats(self) -> Dict[str, int]:
        out = dict(self.tree.counts)
        for old, new in _RENAMED.items():
            out[old] = out[new]
        out.update(self.mover.stats)
        return out

    def expected_page(self, key):
        return self.mover.expected_page(key)

    def read_device_page(self, page: int):
        return self.mover.read_device_page(page)

    def read_host_page(self, page: int):
        return self.mover.read_host_page(page)

    def prefetch_timeout(self, tokens: int) -> float:
        return self.tree.prefetch_timeout_s(tokens // self.ps)

    def evict_host(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` tokens of host pages; returns tokens freed."""
        return self.tree.evict_host(-(-num_tokens // self.ps)) * self.ps

    # ------------------------------------------------------------------ requests
    @staticmethod
    def _out(adm, page_bytes) -> Dict[str, int]:
        return {"device": adm.device_pages, "host": adm.host_pages, "storage": adm.storage_pages,
                "h2d_bytes": (adm.host_pages + adm.storage_pages) * page_bytes,
                "storage_bytes": adm.storage_pages * page_bytes, "storage_wait_s": adm.storage_wait_s}

    def arrive(self, rid: Hashable, keys: Sequence[str], now_s: float = 0.0) -> None:
        """Request ``rid`` joins the waiting queue; its storage prefetch is issued now."""
        self.tree.arrive(rid, list(keys), None, now_s)

    def scheduling_pass(self, waiting_order: Sequence[Hashable], now_s: float = 0.0) -> None:
        self.tree.scheduling_pass(list(waiting_order), now_s)

    def admit(self, rid: Hashable, priority: int = 0, now_s: float = 0.0) -> Dict[str, int]:
        return self._out(self.tree.admit(rid, priority=priority, now_s=now_s), self.page_bytes)

    def serve(self, keys: Sequence[str], priority: int = 0, now_s: float = 0.0) -> Dict[str, int]:
        """Arrival, one scheduling pass and admission of a request that waits for nothing."""
        self._serial += 1
        rid = ("serve", self._serial)
        self.arrive(rid, keys, now_s)
        self.scheduling_pass([rid], now_s)
        return self.admit(rid, priority, now_s)

    def close(self) -> None:
        self.tree.close()

    def summary_stats(self) -> Dict[str, float]:
        out = self.stats
        for d in self.TRANSFER_DIRECTIONS:
            out[f"{d}_bytes"] = self.meter.bytes(d)
            out[f"{d}_seconds"] = self.meter.seconds(d)
            out[f"{d}_calls"] = self.meter.calls(d)
        return out

    # ------------------------------------------------------------------ introspection
    def tier_of(self, key: str) -> str:
        node = self.nodes.get(key)
        if node is None:
            return "storage" if self.storage is not None and self.storage.exists(key) else "none"
        return self.tree.tier_of(node)

    def check_invariants(self) -> None:
        self.tree.check_invariants()
        used_d = [p for n in self.tree.iter_nodes() if n.device is not None for p in n.device]
        used_h = [p for n in self.tree.iter_nodes() if n.host is not None for p in n.host]
        assert len(set(used_d)) == len(used_d), "device page used twice"
        assert len(set(used_h)) == len(used_h), "host page used twice"
        assert self.alloc.available_size() // self.ps == self.tree.device_pages - self.tree.device_used
