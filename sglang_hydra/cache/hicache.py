"""Hierarchical cache with real KV bytes: device pool (L1) -> host pool (L2) -> storage (L3).

Bookkeeping is one node per page, keyed by the page's chained hash (§5.9), so a key names
its whole prefix and the tree is a dict.  Semantics follow reference §5.2-§5.7, §5.11:

* write policies: ``write_through`` (threshold 1), ``write_through_selective`` (threshold 2),
  ``write_back`` (copy D->H only when a device leaf is evicted).  Hit counts are bumped
  during insert for every walked node that is on device and for each new node (a request
  is inserted from the root, so ``inserted_len`` is 0); match alone never counts.
* device eviction: backed -> demote (keep host copy); unbacked and not write_back ->
  delete; write_back -> back up the leaf, demote, or drop on host pressure.
* host eviction: (write_back) reclaim duplicates sparing device leaves, then both; then
  host-only leaves.  ``buffer_only`` never holds host values.
* load-back of host-only pages on the matched path (>= ``load_back_threshold`` tokens)
  through ``memory.transfer`` (real copies); storage prefetch with ``best_effort`` /
  ``wait_complete`` / ``timeout`` on a worker thread.

Every page's bytes are derived from its key (:meth:`HiCache.expected_page`), so each load
from any tier can be checked (``verify=True``); mismatches are counted in ``stats``.
"""
from __future__ import annotations

import hashlib
import heapq
import threading
import time
from typing import Dict, List, Optional, Sequence

import torch

from .storage import STORAGE_BATCH_SIZE, StorageBackend

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")


class Node:
    __slots__ = ("key", "parent", "children", "ndev_children", "dev", "host", "hit_count",
                 "lock", "last", "count", "stored", "born")

    def __init__(self, key, parent):
        self.key = key
        self.parent = parent
        self.children = 0
        self.ndev_children = 0
        self.dev: Optional[int] = None     # device page id
        self.host: Optional[int] = None    # host page id
        self.hit_count = 0
        self.lock = 0
        self.last = 0.0
        self.count = 0
        self.stored = False
        self.born = 0


class PrefetchOp:
    def __init__(self, keys, host_pages, tokens):
        self.keys = keys
        self.host_pages = host_pages
        self.tokens = tokens
        self.completed = 0
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.failed = False


def _new_stats():
    return {
        "device_hit_pages": 0, "host_hit_pages": 0, "storage_hit_pages": 0, "miss_pages": 0,
        "h2d_bytes": 0, "d2h_bytes": 0, "storage_read_bytes": 0, "storage_write_bytes": 0,
        "h2d_seconds": 0.0, "d2h_seconds": 0.0, "storage_read_seconds": 0.0, "storage_write_seconds": 0.0,
        "device_evicted_pages": 0, "device_demoted_pages": 0, "device_dropped_pages": 0,
        "host_evicted_pages": 0, "host_reclaimed_pages": 0, "backup_pages": 0, "backup_failed_pages": 0,
        "storage_write_pages": 0, "storage_write_failed_pages": 0,
        "prefetch_issued": 0, "prefetch_below_threshold": 0, "prefetch_no_host_space": 0,
        "prefetch_completed": 0, "prefetch_terminated": 0, "prefetch_pages": 0,
        "prefetch_wait_seconds": 0.0, "load_back_skipped": 0,
        "verified_pages": 0, "verify_mismatch_pages": 0, "dropped_unbacked_pages": 0,
    }


class HiCache:
    """Tiered page cache over the pools of a :class:`~sglang_hydra.memory.KVMemory`."""

    def __init__(self, memory, *, write_policy: str = "write_through", host_mode: str = "cache",
                 storage: Optional[StorageBackend] = None, prefetch_policy: str = "timeout",
                 prefetch_threshold: int = 256, prefetch_timeout_base: float = 1.0,
                 prefetch_timeout_per_ki_token: float = 0.25, load_back_threshold: int = 10,
                 eviction_policy: str = "lru", verify: bool = True, storage_batch_size: int = STORAGE_BATCH_SIZE):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"Invalid write policy: {write_policy}")
        if prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(f"Invalid prefetch policy: {prefetch_policy}")
        if host_mode not in ("cache", "buffer_only"):
            raise ValueError(f"Invalid host memory mode: {host_mode}")
        if eviction_policy not in ("lru", "lfu", "fifo"):
            raise ValueError(f"full replay supports eviction policies lru, lfu, fifo; got {eviction_policy!r}")
        if host_mode == "buffer_only":
            if storage is None:
                raise ValueError("hicache_host_memory_mode=buffer_only needs a hicache_storage_backend")
            if write_policy == "write_back":
                write_policy = "write_through"
        self.mem = memory
        self.dpool, self.alloc, self.hpool, self.xfer = memory.device_pool, memory.allocator, memory.host_pool, memory.transfer
        if self.hpool is None:
            raise ValueError("HiCache needs a host pool (enable_hierarchical_cache)")
        self.ps = self.dpool.page_size
        self.write_policy = write_policy
        self.is_write_back = write_policy == "write_back"
        self.threshold = 1 if write_policy == "write_through" else 2
        self.buffer_only = host_mode == "buffer_only"
        self.storage = storage
        self.prefetch_policy = prefetch_policy
        self.prefetch_threshold = max(int(prefetch_threshold), self.ps) if storage is not None else 0
        self.prefetch_timeout_base = float(prefetch_timeout_base)
        self.prefetch_timeout_per_page = self.ps / 1024 * float(prefetch_timeout_per_ki_token)
        self.load_back_threshold = load_back_threshold
        self.eviction_policy = eviction_policy
        self.verify = verify
        self.batch = max(1, int(storage_batch_size))
        self.nodes: Dict[str, Node] = {}
        self.root = Node(None, None)
        self.clock = 0
        self.stats = _new_stats()
        self.families = list(self.hpool.buffers)
        self._dcanon = {n: self.dpool.canonical(self.hpool.device_source(n)[0]) for n in self.families}
        self._dcols = {n: self.hpool.device_source(n)[1] for n in self.families}
        self._hcanon = {n: self.hpool.canonical(n) for n in self.families}
        shapes = []
        for n in self.families:
            h = self._hcanon[n]
            shapes.append((n, (h.shape[0],) + tuple(h.shape[2:])))
        self._shapes = shapes
        self._fam_bytes = [int(torch.Size(s).numel()) * self.hpool.store_dtype.itemsize for _, s in shapes]
        self.page_bytes = sum(self._fam_bytes)
        # device families not mirrored on host (MLA kv_split covers all columns): fill via host view
        self.prefetch_limit = int((0.9 if self.buffer_only else 0.5) * self.hpool.size)

    # ------------------------------------------------------------------ page bytes
    def expected_page(self, key: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(hashlib.shake_128(key.encode()).digest(self.page_bytes)), dtype=torch.uint8)

    def _split(self, flat: torch.Tensor):
        out, o = {}, 0
        for (n, shape), b in zip(self._shapes, self._fam_bytes):
            out[n] = flat[o:o + b].view(self.hpool.store_dtype).view(shape)
            o += b
        return out

    def _dview(self, n, page):
        v = self._dcanon[n][:, page]
        c = self._dcols[n]
        return v[..., c] if c is not None else v

    def write_device_page(self, page: int, flat: torch.Tensor) -> None:
        for n, t in self._split(flat).items():
            self._dview(n, page).copy_(t)

    def read_device_page(self, page: int) -> torch.Tensor:
        return torch.cat([self._dview(n, page).contiguous().cpu().view(torch.uint8).reshape(-1) for n in self.families])

    def read_host_page(self, page: int) -> torch.Tensor:
        return torch.cat([self._hcanon[n][:, page].contiguous().view(torch.uint8).reshape(-1) for n in self.families])

    def write_host_page(self, page: int, flat: torch.Tensor) -> None:
        for n, t in self._split(flat).items():
            self._hcanon[n][:, page].copy_(t)

    def _check(self, keys, pages, reader):
        if not self.verify:
            return
        for k, p in zip(keys, pages):
            self.stats["verified_pages"] += 1
            if not torch.equal(reader(int(p)), self.expected_page(k)):
                self.stats["verify_mismatch_pages"] += 1

    # ------------------------------------------------------------------ tree helpers
    def _prio(self, node):
        if self.eviction_policy == "lfu":
            return (node.count, node.last)
        if self.eviction_policy == "fifo":
            return (node.born,)
        return (node.last,)

    def _is_dleaf(self, n):
        return n.dev is not None and n.ndev_children == 0 and n.lock == 0

    def _is_hleaf(self, n):
        return n.dev is None and n.host is not None and n.children == 0 and n.lock == 0

    def _set_dev(self, n, page):
        if (n.dev is None) != (page is None) and n.parent is not None:
            n.parent.ndev_children += 1 if page is not None else -1
        n.dev = page

    def _remove(self, n):
        del self.nodes[n.key]
        n.parent.children -= 1
        if n.dev is not None:
            n.parent.ndev_children -= 1

    def _subtree(self, n):
        return [m for m in self.nodes.values() if self._descends(m, n)]

    @staticmethod
    def _descends(m, n):
        while m is not None:
            if m is n:
                return True
            m = m.parent
        return False

    def _drop_subtree(self, n, reason):
        for m in sorted(self._subtree(n), key=self._depth, reverse=True):
            if m.dev is not None:
                self.alloc.free_page_ids(torch.tensor([m.dev]))
                self._set_dev(m, None)
            if m.host is not None:
                self.hpool.free_pages(torch.tensor([m.host]))
                m.host = None
            self._remove(m)
            self.stats[reason] += 1

    @staticmethod
    def _depth(n):
        d = 0
        while n.parent is not None:
            d += 1
            n = n.parent
        return d

    # ------------------------------------------------------------------ backup (D->H, H->L3)
    def _backup(self, chain: List[Node]) -> int:
        done = []
        for n in chain:
            if n.host is not None or n.dev is None:
                continue
            if self.hpool.available_size() < self.ps:
                self.evict_host(self.ps - self.hpool.available_size())
            hp = self.hpool.alloc_pages(1)
            if hp is None:
                self.stats["backup_failed_pages"] += 1
                break
            n.host = int(hp[0])
            done.append(n)
        if done:
            t0 = time.perf_counter()
            b = self.xfer.backup(torch.tensor([n.host for n in done]), torch.tensor([n.dev for n in done]))
            self.xfer.synchronize()
            self.stats["d2h_seconds"] += time.perf_counter() - t0
            self.stats["d2h_bytes"] += b
            self.stats["backup_pages"] += len(done)
            if self.storage is not None:
                self._write_storage(done)
            if self.buffer_only:       # host was only staging
                self.hpool.free_pages(torch.tensor([n.host for n in done]))
                for n in done:
                    n.host = None
        return len(done)

    def _write_storage(self, nodes: List[Node]) -> None:
        for i in range(0, len(nodes), self.batch):
            part = [n for n in nodes[i:i + self.batch] if not n.stored]
            if not part:
                continue
            vals = [self.read_host_page(n.host) for n in part]
            t0 = time.perf_counter()
            ok = self.storage.batch_set([n.key for n in part], vals)
            self.stats["storage_write_seconds"] += time.perf_counter() - t0
            if not ok:
                okn = sum(1 for n in part if self.storage.exists(n.key))
                self.stats["storage_write_failed_pages"] += len(part) - okn
                for n in part:
                    n.stored = self.storage.exists(n.key)
                self.stats["storage_write_pages"] += okn
                self.stats["storage_write_bytes"] += okn * self.page_bytes
                return
            for n in part:
                n.stored = True
            self.stats["storage_write_pages"] += len(part)
            self.stats["storage_write_bytes"] += len(part) * self.page_bytes

    def _inc_hit_and_check(self, n) -> bool:
        if n.dev is None or self.is_write_back:
            return False
        n.hit_count += 1
        backed = n.stored if self.buffer_only else n.host is not None
        return not backed and n.hit_count >= self.threshold

    def _backup_chain(self, n):
        chain = []
        m = n
        while m.parent is not None:
            backed = m.stored if self.buffer_only else m.host is not None
            if backed:
                break
            chain.append(m)
            m = m.parent
        return self._backup(chain[::-1])

    # ------------------------------------------------------------------ evictions
    def evict_device(self, num_pages: int) -> int:
        heap = [(self._prio(n), id(n), n) for n in self.nodes.values() if self._is_dleaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, n = heapq.heappop(heap)
            if not self._is_dleaf(n) or n.key not in self.nodes:
                continue
            parent = n.parent
            if n.host is None and self.is_write_back:
                self._backup([n])
                if n.host is None:
                    self.stats["dropped_unbacked_pages"] += 0
                    self._drop_subtree(n, "device_dropped_pages")
                    freed += 1
                    self.stats["device_evicted_pages"] += 1
                    if parent.parent is not None and self._is_dleaf(parent):
                        heapq.heappush(heap, (self._prio(parent), id(parent), parent))
                    continue
            if n.host is not None:
                self.alloc.free_page_ids(torch.tensor([n.dev]))
                self._set_dev(n, None)
                self.stats["device_demoted_pages"] += 1
            else:
                self._drop_subtree(n, "device_dropped_pages")
            freed += 1
            self.stats["device_evicted_pages"] += 1
            if parent.parent is not None and self._is_dleaf(parent):
                heapq.heappush(heap, (self._prio(parent), id(parent), parent))
        return freed

    def evict_host(self, num_tokens: int) -> int:
        if self.buffer_only:
            return 0
        need = -(-num_tokens // self.ps)
        freed = 0
        if self.is_write_back:
            for spare in (True, False):
                if freed >= need:
                    break
                dups = [n for n in self.nodes.values() if n.dev is not None and n.host is not None and n.lock == 0
                        and not (spare and self._is_dleaf(n))]
                dups.sort(key=self._prio)
                for n in dups[: need - freed]:
                    self.hpool.free_pages(torch.tensor([n.host]))
                    n.host = None
                    freed += 1
                    self.stats["host_reclaimed_pages"] += 1
        heap = [(self._prio(n), id(n), n) for n in self.nodes.values() if self._is_hleaf(n)]
        heapq.heapify(heap)
        while freed < need and heap:
            _, _, n = heapq.heappop(heap)
            if n.key not in self.nodes or not self._is_hleaf(n):
                continue
            self.hpool.free_pages(torch.tensor([n.host]))
            n.host = None
            parent = n.parent
            self._remove(n)
            freed += 1
            self.stats["host_evicted_pages"] += 1
            if parent.parent is not None and self._is_hleaf(parent):
                heapq.heappush(heap, (self._prio(parent), id(parent), parent))
        return freed * self.ps

    # ------------------------------------------------------------------ prefetch
    def prefetch_timeout(self, tokens: int) -> float:
        return self.prefetch_timeout_base + (tokens // self.ps) * self.prefetch_timeout_per_page

    def start_prefetch(self, keys: Sequence[str]) -> Optional[PrefetchOp]:
        if self.storage is None or not keys:
            return None
        if len(keys) * self.ps < self.prefetch_threshold:
            return None
        hit = 0
        for i in range(0, len(keys), self.batch):
            part = keys[i:i + self.batch]
            got = self.storage.batch_exists(part)
            hit += got
            if got < len(part):
                break
        if hit * self.ps < self.prefetch_threshold:
            self.stats["prefetch_below_threshold"] += 1
            return None
        hit = min(hit, self.prefetch_limit // self.ps)
        hp = self.hpool.alloc_pages(hit)
        if hp is None:
            self.evict_host(hit * self.ps - self.hpool.available_size())
            n = min(hit, self.hpool.available_size() // self.ps)
            if n * self.ps < self.prefetch_threshold:
                self.stats["prefetch_no_host_space"] += 1
                return None
            hit = n
            hp = self.hpool.alloc_pages(hit)
        op = PrefetchOp(list(keys[:hit]), hp.tolist(), hit * self.ps)
        self.stats["prefetch_issued"] += 1
        op.thread = threading.Thread(target=self._prefetch_io, args=(op,), daemon=True)
        op.thread.start()
        return op

    def _prefetch_io(self, op: PrefetchOp) -> None:
        try:
            for i in range(0, len(op.keys), self.batch):
                if op.stop.is_set():
                    return
                ks = op.keys[i:i + self.batch]
                t0 = time.perf_counter()
                vals = self.storage.batch_get(ks)
                self.stats["storage_read_seconds"] += time.perf_counter() - t0
                for j, v in enumerate(vals):
                    if v is None or v.numel() != self.page_bytes:
                        return
                    self.write_host_page(op.host_pages[i + j], v)
                    self.stats["storage_read_bytes"] += self.page_bytes
                    op.completed = i + j + 1
        except Exception:  # backend failure = miss from here on
            op.failed = True

    def finish_prefetch(self, op: PrefetchOp) -> int:
        """Admission gate; returns pages usable (their data sits in ``op.host_pages``)."""
        t0 = time.perf_counter()
        if self.prefetch_policy == "wait_complete":
            op.thread.join()
        elif self.prefetch_policy == "timeout":
            op.thread.join(self.prefetch_timeout(op.tokens))
        op.stop.set()
        op.thread.join()
        self.stats["prefetch_wait_seconds"] += time.perf_counter() - t0
        done = op.completed
        self.stats["prefetch_completed" if done == len(op.keys) else "prefetch_terminated"] += 1
        return done

    # ------------------------------------------------------------------ serve one request
    def _touch(self, n):
        n.last = self.clock
        n.count += 1

    def serve(self, keys: Sequence[str]) -> Dict[str, int]:
        """Match, prefetch, load back and insert one request's page keys."""
        self.clock += 1
        out = {"device": 0, "host": 0, "storage": 0, "h2d_bytes": 0, "storage_bytes": 0}
        path: List[Node] = []
        node = self.root
        for k in keys:
            n = self.nodes.get(k)
            if n is None or (n.dev is None and n.host is None):
                break
            path.append(n)
        ndev = 0
        while ndev < len(path) and path[ndev].dev is not None:
            ndev += 1
        # host-only tail past the device prefix (device set is prefix-closed)
        locked: List[Node] = []
        for n in path:
            n.lock += 1
            locked.append(n)
        out["device"] = ndev
        # ---- storage prefetch for what neither tier has
        rest = list(keys[len(path):])
        anchor = path[-1] if path else self.root
        op = self.start_prefetch(rest) if rest else None
        staged: List[Node] = []
        bounce: List[int] = []
        if op is not None:
            done = self.finish_prefetch(op)
            self._check(op.keys[:done], op.host_pages[:done], self.read_host_page)
            unused = op.host_pages[done:]
            if unused:
                self.hpool.free_pages(torch.tensor(unused))
            parent = anchor
            for k, hp in zip(op.keys[:done], op.host_pages[:done]):
                n = Node(k, parent)
                n.host = hp
                n.stored = True
                self.nodes[k] = n
                parent.children += 1
                n.lock += 1
                locked.append(n)
                n.born = self.clock
                staged.append(n)
                parent = n
            out["storage"] = len(staged)
            self.stats["prefetch_pages"] += len(staged)
            out["storage_bytes"] = len(staged) * self.page_bytes
        # ---- load back host-only pages
        load = path[ndev:] + staged
        if load:
            ok = len(load) * self.ps >= self.load_back_threshold
            if ok and self.alloc.available_size() < len(load) * self.ps:
                self.evict_device(len(load) - self.alloc.available_size() // self.ps)
            dp = self.alloc.alloc_pages(len(load)) if ok else None
            if dp is None:
                self.stats["load_back_skipped"] += 1
                out["host"] = 0
                if staged:   # could not use what was fetched: give it back
                    for n in reversed(staged):
                        n.lock -= 1
                        locked.remove(n)
                        if self.buffer_only:
                            self.hpool.free_pages(torch.tensor([n.host]))
                            n.host = None
                            self._remove(n)
                    out["storage"] = 0
                    staged = []
                load = []
            else:
                hp = torch.tensor([n.host for n in load])
                t0 = time.perf_counter()
                b = self.xfer.load(hp, dp)
                self.xfer.synchronize()
                self.stats["h2d_seconds"] += time.perf_counter() - t0
                self.stats["h2d_bytes"] += b
                out["h2d_bytes"] = b
                for n, p in zip(load, dp.tolist()):
                    self._set_dev(n, p)
                self._check([n.key for n in load], dp.tolist(), self.read_device_page)
                if self.buffer_only:
                    self.hpool.free_pages(hp)
                    for n in load:
                        n.host = None
                out["host"] = len(load) - len(staged)
                path = path + staged
        self.stats["device_hit_pages"] += out["device"]
        self.stats["host_hit_pages"] += out["host"]
        self.stats["storage_hit_pages"] += out["storage"]
        # ---- insert: count hits on walked device nodes, create new pages for the rest
        nodes_on_path = []
        for n in path:
            if n.dev is None:
                break
            nodes_on_path.append(n)
        for n in nodes_on_path:
            self._touch(n)
            if self._inc_hit_and_check(n):
                self._backup_chain(n)
        new_keys = list(keys[len(nodes_on_path):])
        self.stats["miss_pages"] += len(keys) - out["device"] - out["host"] - out["storage"]
        parent = nodes_on_path[-1] if nodes_on_path else self.root
        # unlocked leftovers (host-only path nodes we could not load) stay as they are
        for k in new_keys:
            n = self.nodes.get(k)
            if n is not None and n.dev is not None:
                parent = n
                continue
            if self.alloc.available_size() < self.ps:
                self.evict_device(1)
            dp = self.alloc.alloc_pages(1)
            if dp is None:
                break
            if n is None:
                n = Node(k, parent)
                n.born = self.clock
                self.nodes[k] = n
                parent.children += 1
            self._set_dev(n, int(dp[0]))
            self.write_device_page(n.dev, self.expected_page(k))
            n.lock += 1
            locked.append(n)
            nodes_on_path.append(n)
            self._touch(n)
            if self._inc_hit_and_check(n):
                self._backup_chain(n)
            parent = n
        for n in locked:
            n.lock -= 1
        return out

    # ------------------------------------------------------------------ introspection
    def tier_of(self, key: str) -> str:
        n = self.nodes.get(key)
        if n is None:
            return "storage" if self.storage is not None and self.storage.exists(key) else "none"
        t = []
        if n.dev is not None:
            t.append("device")
        if n.host is not None:
            t.append("host")
        if n.stored:
            t.append("storage")
        return "+".join(t) or "none"

    def check_invariants(self) -> None:
        used_d = [n.dev for n in self.nodes.values() if n.dev is not None]
        used_h = [n.host for n in self.nodes.values() if n.host is not None]
        assert len(set(used_d)) == len(used_d)
        assert len(set(used_h)) == len(used_h)
        assert all(n.lock == 0 for n in self.nodes.values())
        for n in self.nodes.values():
            if n.dev is not None and n.parent.parent is not None:
                assert n.parent.dev is not None, "device set must be prefix-closed"
