"""Hierarchical cache with real KV bytes: device pool (L1) -> host pool (L2) -> storage (L3).

Bookkeeping is one node per page, keyed by the page's chained hash (§5.9), so a key names
its whole prefix and the tree is a dict.  Semantics follow reference §5.2-§5.7, §5.11:

* write policies: ``write_through`` (threshold 1), ``write_through_selective`` (threshold 2),
  ``write_back`` (copy D->H only when a device leaf is evicted).  Hit counts are bumped
  during insert for every walked node that is on device and for each new node (a request
  is inserted from the root, so ``inserted_len`` is 0); match alone never counts.  A
  request's backup is one transfer (its new pages form one chain, as the reference's one
  new leaf does), and storage writes go out in batches of ``storage_batch_size`` pages.
* device eviction: backed -> demote (keep host copy); unbacked and not write_back ->
  delete; write_back -> back up the leaf, demote, or drop on host pressure.
* host eviction: (write_back) reclaim duplicates sparing device leaves, then both; then
  host-only leaves.  ``buffer_only`` never holds host values.
* eviction order: the policy objects of :mod:`sglang_hydra.cache.policies` (every
  registered policy except replay-only ones such as ``belady``, which need the future).
  Nodes carry the fields those policies read (``last_access``, ``hit_count``,
  ``insert_time``, ``priority``, ``depth``, ``hw``, ``aux``), and the cache calls their
  insert / touch / evict hooks; ties break by creation order, so a replay is deterministic.
* load-back of host-only pages on the matched path (>= ``load_back_threshold`` tokens)
  through ``memory.transfer`` (real copies).

Scheduling model (§5.7): a request *arrives* (:meth:`HiCache.arrive`: joins the waiting
queue and its storage prefetch is issued at once, as the reference's ``_prefetch_kvcache``
does on arrival), zero or more *scheduling passes* go by (:meth:`HiCache.scheduling_pass`),
then it is *admitted* (:meth:`HiCache.admit`: match, the prefetch admission gate
``best_effort`` / ``wait_complete`` / ``timeout``, load-back, insert, backup).
:meth:`HiCache.serve` does all three for a request that waits for nothing.  Storage misses
of a request that is still waiting behind the queue head are asked again every
``prefetch_retry_poll_interval`` passes, at most ``prefetch_retry_max_attempts`` times
(0 disables either); prefetch IO runs on one worker thread.

Every page's bytes are derived from its key (:meth:`HiCache.expected_page`), so each load
from any tier can be checked (``verify=True``); mismatches are counted in ``stats``.
Bytes and busy time of every transfer direction are recorded in ``meter``
(:class:`~sglang_hydra.workload.metrics.TransferMeter`): only bytes a tier really received
count, so pages storage already holds are skipped, not counted as written.
"""
from __future__ import annotations

import hashlib
import heapq
import queue
import threading
from typing import Dict, Hashable, List, Optional, Sequence

import torch

from ..workload.metrics import TransferMeter
from .policies import get_policy_info, make_policy
from .storage import STORAGE_BATCH_SIZE, StorageBackend

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
#: reference defaults of ``hicache_storage_prefetch_retry_poll_interval`` / ``..._max_attempts``
DEFAULT_RETRY_POLL_INTERVAL = 8
DEFAULT_RETRY_MAX_ATTEMPTS = 8


class Node:
    __slots__ = ("key", "parent", "kids", "ndev_children", "dev", "host", "backup_hits", "lock",
                 "stored", "seq",
                 # read by the eviction policies (same names as radix.TreeNode)
                 "last_access", "hit_count", "insert_time", "priority", "depth", "hw", "aux")

    def __init__(self, key, parent, seq=0, clock=0):
        self.key = key
        self.parent = parent
        self.kids: set = set()
        self.ndev_children = 0
        self.dev: Optional[int] = None     # device page id
        self.host: Optional[int] = None    # host page id
        self.backup_hits = 0               # write-through threshold counter (§5.2)
        self.lock = 0
        self.stored = False
        self.seq = seq                     # creation order: deterministic tie-break
        self.last_access = clock
        self.hit_count = 1
        self.insert_time = clock
        self.priority = 0
        self.depth = parent.depth + 1 if parent is not None else -1
        self.hw = 0
        self.aux = None

    @property
    def children(self) -> int:
        return len(self.kids)


class PrefetchRetries:
    """When a waiting request asks storage again about pages it missed (reference
    ``storage_prefetch.py:StoragePrefetchRetries``).

    A registered miss becomes due ``interval`` passes after the first pass that sees it; a
    request re-issues at most ``max_attempts`` times; the queue head is never held back by a
    speculative retry (its pending miss is dropped, it is admitted with what the tiers
    hold).  ``interval <= 0`` or ``max_attempts <= 0`` disables retries.
    """

    def __init__(self, interval: int, max_attempts: int):
        self.interval = int(interval)
        self.max_attempts = int(max_attempts)
        self.step = 0
        self._due: Dict[Hashable, Optional[int]] = {}
        self._attempts: Dict[Hashable, int] = {}

    @property
    def enabled(self) -> bool:
        return self.interval > 0 and self.max_attempts > 0

    def poll_miss(self, rid: Hashable) -> None:
        if self.enabled and self._attempts.get(rid, 0) < self.max_attempts:
            self._due[rid] = None

    def attempts(self, rid: Hashable) -> int:
        return self._attempts.get(rid, 0)

    def forget(self, rid: Hashable) -> None:
        self._due.pop(rid, None)
        self._attempts.pop(rid, None)

    def pop_ready(self, waiting: Sequence[Hashable]) -> List[Hashable]:
        """One scheduling pass: the waiting requests (queue order) whose retry is due now."""
        self.step += 1
        if not waiting or not self._due:
            return []
        self._due.pop(waiting[0], None)
        ready = []
        for rid in waiting:
            if rid not in self._due:
                continue
            if self._attempts.get(rid, 0) >= self.max_attempts:
                del self._due[rid]
                continue
            due = self._due[rid]
            if due is None:
                due = self._due[rid] = self.step + self.interval
            if due > self.step:
                continue
            del self._due[rid]
            self._attempts[rid] = self._attempts.get(rid, 0) + 1
            ready.append(rid)
        return ready


class PrefetchOp:
    """Storage -> host reads for ``keys`` (request positions ``start ..``) into ``host_pages``."""

    def __init__(self, keys, start, host_pages, tokens):
        self.keys = keys
        self.start = start
        self.host_pages = host_pages
        self.tokens = tokens
        self.completed = 0
        self.failed = False
        self.started = False
        self.stop = threading.Event()
        self.done = threading.Event()
        self.lock = threading.Lock()


class _Waiting:
    __slots__ = ("keys", "ops", "covered")

    def __init__(self, keys):
        self.keys = list(keys)
        self.ops: List[PrefetchOp] = []
        self.covered = 0     # request positions up to here are on a tier or requested from storage


def _new_stats():
    return {
        "device_hit_pages": 0, "host_hit_pages": 0, "storage_hit_pages": 0, "miss_pages": 0,
        "device_evicted_pages": 0, "device_demoted_pages": 0, "device_dropped_pages": 0,
        "host_evicted_pages": 0, "host_reclaimed_pages": 0, "backup_pages": 0, "backup_failed_pages": 0,
        "storage_write_pages": 0, "storage_write_failed_pages": 0, "storage_write_skipped_pages": 0,
        "prefetch_issued": 0, "prefetch_below_threshold": 0, "prefetch_no_host_space": 0,
        "prefetch_rate_limited": 0, "prefetch_completed": 0, "prefetch_terminated": 0, "prefetch_pages": 0,
        "prefetch_present_pages": 0, "prefetch_discarded_pages": 0,
        "prefetch_retries": 0, "prefetch_retry_issued": 0, "prefetch_retry_pages": 0,
        "load_back_skipped": 0, "scheduling_passes": 0,
        "verified_pages": 0, "verify_mismatch_pages": 0, "dropped_unbacked_pages": 0,
    }


class HiCache:
    """Tiered page cache over the pools of a :class:`~sglang_hydra.memory.KVMemory`."""

    def __init__(self, memory, *, write_policy: str = "write_through", host_mode: str = "cache",
                 storage: Optional[StorageBackend] = None, prefetch_policy: str = "timeout",
                 prefetch_threshold: int = 256, prefetch_timeout_base: float = 1.0,
                 prefetch_timeout_per_ki_token: float = 0.25, load_back_threshold: int = 10,
                 eviction_policy: str = "lru", eviction_policy_config: Optional[dict] = None,
                 prefetch_retry_poll_interval: int = DEFAULT_RETRY_POLL_INTERVAL,
                 prefetch_retry_max_attempts: int = DEFAULT_RETRY_MAX_ATTEMPTS,
                 verify: bool = True, storage_batch_size: int = STORAGE_BATCH_SIZE):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"Invalid write policy: {write_policy}")
        if prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(f"Invalid prefetch policy: {prefetch_policy}")
        if host_mode not in ("cache", "buffer_only"):
            raise ValueError(f"Invalid host memory mode: {host_mode}")
        info = get_policy_info(eviction_policy)          # unknown names: ValueError listing the known
        if info.cls.needs_future:
            raise ValueError(f"eviction policy {eviction_policy!r} needs the whole request sequence in advance, "
                             "so it only runs in job.mode=metadata; the hierarchical cache takes any other "
                             "registered policy")
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
        self._seq = 0
        self.stats = _new_stats()
        self.meter = TransferMeter()
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
        # what a policy sizes its tables by (ghost_lru): pages the tiers can hold together
        self.capacity = self.dpool.num_pages + (0 if self.buffer_only else self.hpool.page_num)
        self.policy = make_policy(eviction_policy, eviction_policy_config, page_size=self.ps)
        self.policy.bind(self)
        self.prefetch_limit = int((0.9 if self.buffer_only else 0.5) * self.hpool.size)
        self.prefetch_occupied = 0
        self.retries = PrefetchRetries(prefetch_retry_poll_interval, prefetch_retry_max_attempts)
        self.waiting: Dict[Hashable, _Waiting] = {}
        self._serial = 0
        self._io_queue: Optional["queue.SimpleQueue"] = None
        self._io_thread: Optional[threading.Thread] = None

    # the tree protocol the policies use (RadixTree names)
    @property
    def _clock(self) -> int:
        return self.clock

    @property
    def passes(self) -> int:
        """Scheduling passes so far."""
        return self.retries.step

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
    def _new_node(self, key, parent) -> Node:
        self._seq += 1
        n = Node(key, parent, self._seq, self.clock)
        self.nodes[key] = n
        parent.kids.add(n)
        if self.policy.wants_insert_hook:
            self.policy.on_insert(n)
        return n

    def _heap_entry(self, n):
        return (self.policy.key(n), n.seq, n)

    def _is_dleaf(self, n):
        return n.dev is not None and n.ndev_children == 0 and n.lock == 0

    def _is_hleaf(self, n):
        return n.dev is None and n.host is not None and not n.kids and n.lock == 0

    def _set_dev(self, n, page):
        if (n.dev is None) != (page is None) and n.parent is not None:
            n.parent.ndev_children += 1 if page is not None else -1
        n.dev = page

    def _remove(self, n):
        del self.nodes[n.key]
        n.parent.kids.discard(n)
        if n.dev is not None:
            n.parent.ndev_children -= 1
        if self.policy.wants_evict_hook:
            self.policy.on_evict(n)

    def _subtree(self, n):
        out, stack = [], [n]
        while stack:
            m = stack.pop()
            out.append(m)
            stack.extend(m.kids)
        return out

    def _drop_subtree(self, n, reason):
        for m in reversed(self._subtree(n)):          # children before parents
            if m.dev is not None:
                self.alloc.free_page_ids(torch.tensor([m.dev]))
                self._set_dev(m, None)
            if m.host is not None:
                self.hpool.free_pages(torch.tensor([m.host]))
                m.host = None
            self._remove(m)
            self.stats[reason] += 1

    def _match(self, keys) -> List[Node]:
        """Nodes of the longest prefix of ``keys`` that some tier (device or host) holds."""
        path = []
        for k in keys:
            n = self.nodes.get(k)
            if n is None or (n.dev is None and n.host is None):
                break
            path.append(n)
        return path

    # ------------------------------------------------------------------ backup (D->H, H->L3)
    def _backup(self, chain: List[Node]) -> int:
        """D->H for ``chain`` (root-most first) as one transfer; stops at the first page the
        host cannot take, so backed pages stay prefix-closed."""
        todo = [n for n in chain if n.host is None and n.dev is not None]
        if not todo:
            return 0
        need = len(todo) * self.ps
        if self.hpool.available_size() < need:
            self.evict_host(need - self.hpool.available_size())
        fit = min(len(todo), self.hpool.available_size() // self.ps)
        if fit < len(todo):
            self.stats["backup_failed_pages"] += len(todo) - fit
            todo = todo[:fit]
        if not todo:
            return 0
        # pair ascending device pages with ascending host pages: consecutive runs on both
        # sides become single slice copies in the transfer backend
        hp = torch.sort(self.hpool.alloc_pages(len(todo))).values
        by_dev = sorted(todo, key=lambda n: n.dev)
        for n, p in zip(by_dev, hp.tolist()):
            n.host = p
        with self.meter.timing("d2h") as moved:
            moved.append(self.xfer.backup(hp, torch.tensor([n.dev for n in by_dev])))
            self.xfer.synchronize()
        self.stats["backup_pages"] += len(todo)
        if self.storage is not None:
            self._write_storage(todo)
        if self.buffer_only:       # host was only staging
            self.hpool.free_pages(hp)
            for n in todo:
                n.host = None
        return len(todo)

    def _write_storage(self, nodes: List[Node]) -> None:
        """H->L3 in batches; a page storage already holds is marked stored, not written again."""
        todo = []
        for n in nodes:
            if n.stored:
                continue
            if self.storage.exists(n.key):
                n.stored = True
                self.stats["storage_write_skipped_pages"] += 1
                continue
            todo.append(n)
        for i in range(0, len(todo), self.batch):
            part = todo[i:i + self.batch]
            vals = [self.read_host_page(n.host) for n in part]
            with self.meter.timing("storage_write"):
                ok = self.storage.batch_set([n.key for n in part], vals)
            written = part if ok else [n for n in part if self.storage.exists(n.key)]
            self.meter.add_bytes("storage_write", len(written) * self.page_bytes)
            for n in written:
                n.stored = True
            self.stats["storage_write_pages"] += len(written)
            if not ok:        # batch_set stops at the first failure: so do we
                self.stats["storage_write_failed_pages"] += len(todo) - i - len(written)
                return

    def _inc_hit_and_check(self, n) -> bool:
        if n.dev is None or self.is_write_back:
            return False
        n.backup_hits += 1
        backed = n.stored if self.buffer_only else n.host is not None
        return not backed and n.backup_hits >= self.threshold

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
        heap = [self._heap_entry(n) for n in self.nodes.values() if self._is_dleaf(n)]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, n = heapq.heappop(heap)
            if n.key not in self.nodes or not self._is_dleaf(n):
                continue
            parent = n.parent
            if n.host is None and self.is_write_back:
                self._backup([n])
            if n.host is not None:
                self.alloc.free_page_ids(torch.tensor([n.dev]))
                self._set_dev(n, None)
                self.stats["device_demoted_pages"] += 1
            else:
                self._drop_subtree(n, "device_dropped_pages")
            freed += 1
            self.stats["device_evicted_pages"] += 1
            if parent.parent is not None and self._is_dleaf(parent):
                heapq.heappush(heap, self._heap_entry(parent))
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
                dups.sort(key=lambda n: (self.policy.key(n), n.seq))
                for n in dups[: need - freed]:
                    self.hpool.free_pages(torch.tensor([n.host]))
                    n.host = None
                    freed += 1
                    self.stats["host_reclaimed_pages"] += 1
        heap = [self._heap_entry(n) for n in self.nodes.values() if self._is_hleaf(n)]
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
                heapq.heappush(heap, self._heap_entry(parent))
        return freed * self.ps

    # ------------------------------------------------------------------ prefetch
    def prefetch_timeout(self, tokens: int) -> float:
        return self.prefetch_timeout_base + (tokens // self.ps) * self.prefetch_timeout_per_page

    def _issue_prefetch(self, rid, w: _Waiting) -> None:
        """Ask storage about what no tier holds past the request's prefix; start reading the
        leading hit; register a retry for what is still missing."""
        start = max(len(self._match(w.keys)), w.covered)
        rest = w.keys[start:]
        if not rest or len(rest) * self.ps < self.prefetch_threshold:
            return
        hit = 0
        for i in range(0, len(rest), self.batch):
            part = rest[i:i + self.batch]
            got = self.storage.batch_exists(part)
            hit += got
            if got < len(part):
                break
        if hit < len(rest):
            self.retries.poll_miss(rid)
        if hit * self.ps < self.prefetch_threshold:
            self.stats["prefetch_below_threshold"] += 1
            return
        room = (self.prefetch_limit - self.prefetch_occupied) // self.ps
        if room * self.ps < self.prefetch_threshold:
            self.stats["prefetch_rate_limited"] += 1
            self.retries.poll_miss(rid)
            return
        hit = min(hit, room)
        hp = self.hpool.alloc_pages(hit)
        if hp is None:
            self.evict_host(hit * self.ps - self.hpool.available_size())
            n = min(hit, self.hpool.available_size() // self.ps)
            if n * self.ps < self.prefetch_threshold:
                self.stats["prefetch_no_host_space"] += 1
                self.retries.poll_miss(rid)
                return
            hit = n
            hp = self.hpool.alloc_pages(hit)
        op = PrefetchOp(list(rest[:hit]), start, hp.tolist(), hit * self.ps)
        self.prefetch_occupied += op.tokens
        w.ops.append(op)
        w.covered = start + hit
        self.stats["prefetch_issued"] += 1
        self._submit(op)

    def _submit(self, op: PrefetchOp) -> None:
        if self._io_thread is None:
            self._io_queue = queue.SimpleQueue()
            self._io_thread = threading.Thread(target=self._io_loop, name="hicache-prefetch-io", daemon=True)
            self._io_thread.start()
        self._io_queue.put(op)

    def _io_loop(self) -> None:
        while True:
            op = self._io_queue.get()
            if op is None:
                return
            with op.lock:
                op.started = not op.stop.is_set()
            try:
                if op.started:
                    self._prefetch_io(op)
            finally:
                op.done.set()

    def _prefetch_io(self, op: PrefetchOp) -> None:
        try:
            for i in range(0, len(op.keys), self.batch):
                if op.stop.is_set():
                    return
                ks = op.keys[i:i + self.batch]
                with self.meter.timing("storage_read") as moved:
                    vals = self.storage.batch_get(ks)
                    good = 0
                    for v in vals:
                        if v is None or v.numel() * v.element_size() != self.page_bytes:
                            break
                        good += 1
                    moved.append(good * self.page_bytes)
                for j in range(good):
                    self.write_host_page(op.host_pages[i + j], vals[j].view(torch.uint8).view(-1))
                    op.completed = i + j + 1
                if good < len(ks):
                    return
        except Exception:  # backend failure = miss from here on
            op.failed = True

    def finish_prefetch(self, op: PrefetchOp) -> int:
        """Admission gate; returns pages usable (their data sits in ``op.host_pages``)."""
        with self.meter.timing("prefetch_wait"):
            if self.prefetch_policy == "wait_complete":
                op.done.wait()
            elif self.prefetch_policy == "timeout":
                op.done.wait(self.prefetch_timeout(op.tokens))
            op.stop.set()
            with op.lock:
                started = op.started
            if started:
                op.done.wait()       # at most the batch in flight
        done = op.completed if started else 0
        self.stats["prefetch_completed" if done == len(op.keys) else "prefetch_terminated"] += 1
        self.prefetch_occupied -= op.tokens
        return done

    # ------------------------------------------------------------------ scheduling
    def arrive(self, rid: Hashable, keys: Sequence[str]) -> None:
        """Request ``rid`` joins the waiting queue; its storage prefetch is issued now."""
        if rid in self.waiting:
            raise ValueError(f"request {rid!r} is already waiting")
        w = _Waiting(keys)
        self.waiting[rid] = w
        if self.storage is not None:
            self._issue_prefetch(rid, w)

    def scheduling_pass(self, waiting_order: Sequence[Hashable]) -> None:
        """One scheduler iteration: re-ask storage about the due misses of the requests still
        waiting (queue order; the head is never held back)."""
        self.stats["scheduling_passes"] += 1
        for rid in self.retries.pop_ready(list(waiting_order)):
            w = self.waiting.get(rid)
            if w is None:
                continue
            self.stats["prefetch_retries"] += 1
            before = len(w.ops)
            self._issue_prefetch(rid, w)
            if len(w.ops) > before:
                self.stats["prefetch_retry_issued"] += 1
                self.stats["prefetch_retry_pages"] += len(w.ops[-1].keys)

    def serve(self, keys: Sequence[str], priority: int = 0) -> Dict[str, int]:
        """Arrival, one scheduling pass and admission of a request that waits for nothing."""
        self._serial += 1
        rid = ("serve", self._serial)
        self.arrive(rid, keys)
        self.scheduling_pass([rid])
        return self.admit(rid, priority)

    def _attach_prefetched(self, w: _Waiting, path: List[Node], locked: List[Node]) -> List[Node]:
        """Close the admission gate of each prefetch and hang the pages it read below the
        request's matched prefix as host-only nodes; pages another request brought in the
        meantime are freed, and so is a read that no longer joins the prefix."""
        staged: List[Node] = []
        for op in w.ops:
            done = self.finish_prefetch(op)
            self._check(op.keys[:done], op.host_pages[:done], self.read_host_page)
            have = len(path) + len(staged)
            skip = have - op.start                      # leading pages some tier already has
            keep = []
            if skip < 0:
                self.stats["prefetch_discarded_pages"] += done
            else:
                self.stats["prefetch_present_pages"] += min(skip, done)
                parent = staged[-1] if staged else (path[-1] if path else self.root)
                for k, hp in zip(op.keys[skip:done], op.host_pages[skip:done]):
                    if k in self.nodes:                 # cannot happen for chained keys; stay safe
                        break
                    n = self._new_node(k, parent)
                    n.host = hp
                    n.stored = True
                    n.lock += 1
                    locked.append(n)
                    staged.append(n)
                    keep.append(hp)
                    parent = n
            kept = set(keep)
            unused = [p for p in op.host_pages if p not in kept]
            if unused:
                self.hpool.free_pages(torch.tensor(unused))
        return staged

    def admit(self, rid: Hashable, priority: int = 0) -> Dict[str, int]:
        """Match, prefetch gate, load back and insert the waiting request ``rid``."""
        w = self.waiting.pop(rid)
        self.retries.forget(rid)
        keys = w.keys
        self.clock += 1
        out = {"device": 0, "host": 0, "storage": 0, "h2d_bytes": 0, "storage_bytes": 0}
        path = self._match(keys)
        ndev = 0
        while ndev < len(path) and path[ndev].dev is not None:
            ndev += 1
        locked: List[Node] = []
        for n in path:
            n.lock += 1
            locked.append(n)
        out["device"] = ndev
        fresh = set()
        staged = self._attach_prefetched(w, path, locked) if w.ops else []
        fresh.update(staged)
        out["storage"] = len(staged)
        self.stats["prefetch_pages"] += len(staged)
        out["storage_bytes"] = len(staged) * self.page_bytes
        # ---- load back host-only pages (the path's tail past the device prefix, then staged)
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
                    out["storage_bytes"] = 0
                    staged = []
            else:
                load.sort(key=lambda n: n.host)       # ascending on both sides (see _backup)
                dp = torch.sort(dp).values
                hp = torch.tensor([n.host for n in load])
                with self.meter.timing("h2d") as moved:
                    b = self.xfer.load(hp, dp)
                    self.xfer.synchronize()
                    moved.append(b)
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
        hits = out["device"] + out["host"] + out["storage"]
        self.stats["miss_pages"] += len(keys) - hits
        # ---- insert: the device prefix, then device pages for the rest (one allocation)
        on_path: List[Node] = []
        for n in path:
            if n.dev is None:
                break
            on_path.append(n)
        new_keys = keys[len(on_path):]
        if new_keys:
            need = len(new_keys)
            short = need - self.alloc.available_size() // self.ps
            if short > 0:
                self.evict_device(short)
            take = min(need, self.alloc.available_size() // self.ps)
            pages = self.alloc.alloc_pages(take).tolist() if take else []
            parent = on_path[-1] if on_path else self.root
            for k, p in zip(new_keys, pages):
                n = self.nodes.get(k)
                if n is None:                      # else: a host-only page we could not load: recompute
                    n = self._new_node(k, parent)
                    fresh.add(n)
                self._set_dev(n, p)
                self.write_device_page(p, self.expected_page(k))
                n.lock += 1
                locked.append(n)
                on_path.append(n)
                parent = n
        # ---- statistics the policies read; write-through backups (one chain)
        clock = self.clock
        deepest_flagged = None
        for n in on_path:
            n.last_access = clock
            if n not in fresh:
                n.hit_count += 1
            if self._inc_hit_and_check(n):
                deepest_flagged = n
        if on_path:
            last = on_path[-1]
            if priority:
                m = last
                while m is not self.root:
                    if priority > m.priority:
                        m.priority = priority
                    m = m.parent
            if self.policy.wants_touch:
                self.policy.on_touch(keys, hits, clock, last)
        if deepest_flagged is not None:
            self._backup_chain(deepest_flagged)
        for n in locked:
            n.lock -= 1
        return out

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Stop the prefetch IO thread (waits for the batch in flight) and drop waiting requests."""
        for w in self.waiting.values():
            for op in w.ops:
                op.stop.set()
        if self._io_thread is not None:
            self._io_queue.put(None)
            self._io_thread.join(timeout=10)
            self._io_thread = None

    #: meter direction -> the stats names its bytes and busy seconds are reported under
    TRANSFER_DIRECTIONS = ("d2h", "h2d", "storage_write", "storage_read")

    def summary_stats(self) -> Dict[str, float]:
        """``stats`` plus bytes, busy seconds and calls of each transfer direction."""
        out = dict(self.stats)
        for d in self.TRANSFER_DIRECTIONS:
            out[f"{d}_bytes"] = self.meter.bytes(d)
            out[f"{d}_seconds"] = self.meter.seconds(d)
            out[f"{d}_calls"] = self.meter.calls(d)
        out["prefetch_wait_seconds"] = self.meter.seconds("prefetch_wait")
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
            assert n.parent is self.root or self.nodes.get(n.parent.key) is n.parent, "orphan node"
            assert n in n.parent.kids
            if n.dev is not None and n.parent.parent is not None:
                assert n.parent.dev is not None, "device set must be prefix-closed"
