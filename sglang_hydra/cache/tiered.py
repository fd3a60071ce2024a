"""One tree, three tiers (device, host, storage), two movers.

:class:`TieredCache` is the hierarchical cache of the reference engine (§5) over the same
weighted radix tree as the single-tier replay (:class:`~sglang_hydra.cache.radix.RadixTree`:
one node per trace block or page run, ``weight`` pages).  It decides every hit, eviction,
write-through / write-back backup, host eviction, load-back, storage write and prefetch;
the *mover* only carries a decision out:

* :class:`~sglang_hydra.cache.movers.CountingMover` moves nothing (``job.mode=sim``);
* :class:`~sglang_hydra.cache.movers.BytesMover` moves real KV bytes between the device
  pool, the host pool and a storage backend (``job.mode=full``).

Because page counts, free space and every choice live here, both movers give the same
counts page for page (tests/cache/test_tiered_identity.py).

Semantics (reference §5.2-§5.7):

* write policies: ``write_through`` backs a node up at its first insert-time count,
  ``write_through_selective`` at its second, ``write_back`` only when a device leaf is
  evicted.  Backups run root-most first and stop at the first node the host cannot take,
  so backed-up nodes stay prefix-closed.  With storage, every backup is also written to
  storage (pages storage already holds are skipped).
* device eviction of a device leaf (on device, no child on device, unlocked): backed up ->
  demoted (the host copy stays); not backed up -> dropped with its host-only subtree
  (``write_back`` first tries to back it up).  Eviction order is the policy's key.
* host eviction: ``write_back`` first frees host copies of nodes that are also on device
  (sparing device leaves, then not), then host-only leaves in policy order.
* load-back: the host-only part of the matched path (and what storage prefetched) is
  loaded to the device when it is at least ``load_back_threshold`` tokens and fits.
* storage prefetch: issued when a request *arrives* for the pages no tier holds past its
  prefix (at least ``prefetch_threshold`` tokens, at most ``prefetch_capacity_limit`` in
  flight, host pages reserved at issue); retried while the request waits (every
  ``retry_poll_interval`` scheduling passes, at most ``retry_max_attempts`` times).

Timing never comes from the wall clock: a prefetch issued at ``t_issue`` has read
``floor((t - t_issue) * storage_read_bytes_per_s / page_bytes)`` pages by time ``t``
(every page at once when no bandwidth is given).  At admission (time ``start_s``)
``best_effort`` takes what has landed, ``wait_complete`` waits for the rest and
``timeout`` waits at most ``prefetch_timeout_base + pages * prefetch_timeout_per_page``
seconds; the extra wait is reported as the request's ``storage_wait_s``.  Concurrent
prefetches do not share bandwidth in this model.
"""
from __future__ import annotations

from heapq import heappop, heappush
from typing import Any, Dict, Hashable, List, Optional, Sequence, Tuple

from .radix import RadixTree, TreeNode, _check_weights

__all__ = ["TieredCache", "PrefetchRetries", "Admission", "WRITE_POLICIES", "PREFETCH_POLICIES",
           "HOST_MODES", "DEFAULT_RETRY_POLL_INTERVAL", "DEFAULT_RETRY_MAX_ATTEMPTS", "UNBOUNDED_PAGES"]

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")
HOST_MODES = ("cache", "buffer_only")
#: reference defaults of ``hicache_storage_prefetch_retry_poll_interval`` / ``..._max_attempts``
DEFAULT_RETRY_POLL_INTERVAL = 8
DEFAULT_RETRY_MAX_ATTEMPTS = 8
#: a device tier with no capacity limit (``max_total_tokens`` unset)
UNBOUNDED_PAGES = 1 << 62


class PrefetchRetries:
    """When a waiting request asks storage again about pages it missed (reference
    ``storage_prefetch.py:StoragePrefetchRetries``).

    A registered miss becomes due ``interval`` passes after the first pass that sees it; a
    request re-issues at most ``max_attempts`` times; the queue head is never held back by a
    speculative retry (its pending miss is dropped, it is admitted with what the tiers
    hold).  ``interval <= 0`` or ``max_attempts <= 0`` disables retries.

    Due misses sit in a heap keyed by the pass they are due at, so a pass costs the retries
    it returns, not the length of the queue (a long queue behind a busy engine would
    otherwise make every pass scan it).  Ready requests come back in queue order: arrival
    order when :meth:`note_arrival` was told, else their position in ``waiting``.
    """

    def __init__(self, interval: int, max_attempts: int):
        self.interval = int(interval)
        self.max_attempts = int(max_attempts)
        self.step = 0
        self._due: Dict[Hashable, int] = {}
        self._heap: list = []
        self._pushes = 0
        self._attempts: Dict[Hashable, int] = {}
        self._arrival: Dict[Hashable, int] = {}
        self._arrivals = 0

    @property
    def enabled(self) -> bool:
        return self.interval > 0 and self.max_attempts > 0

    def note_arrival(self, rid: Hashable) -> None:
        self._arrivals += 1
        self._arrival[rid] = self._arrivals

    def poll_miss(self, rid: Hashable) -> None:
        if self.enabled and self._attempts.get(rid, 0) < self.max_attempts:
            # first seen by the next pass (step + 1), due ``interval`` passes after that
            due = self.step + 1 + self.interval
            self._due[rid] = due
            self._pushes += 1
            heappush(self._heap, (due, self._pushes, rid))

    def attempts(self, rid: Hashable) -> int:
        return self._attempts.get(rid, 0)

    def forget(self, rid: Hashable) -> None:
        self._due.pop(rid, None)
        self._attempts.pop(rid, None)
        self._arrival.pop(rid, None)

    def pop_ready(self, waiting: Sequence[Hashable]) -> List[Hashable]:
        """One scheduling pass: the waiting requests (queue order) whose retry is due now."""
        self.step += 1
        if not waiting or not self._due:
            return []
        due_of = self._due
        due_of.pop(waiting[0], None)
        heap = self._heap
        ready = []
        while heap and heap[0][0] <= self.step:
            due, _, rid = heappop(heap)
            if due_of.get(rid) != due:          # dropped, re-registered later, or already served
                continue
            del due_of[rid]
            n = self._attempts.get(rid, 0)
            if n >= self.max_attempts:
                continue
            self._attempts[rid] = n + 1
            ready.append(rid)
        if len(ready) > 1:
            arrival = self._arrival
            if all(r in arrival for r in ready):
                ready.sort(key=arrival.__getitem__)
            else:
                pos = {r: i for i, r in enumerate(waiting)}
                ready.sort(key=lambda r: pos.get(r, len(pos)))
        return ready


class _Prefetch:
    """Storage -> host reads of request pages ``start .. start + pages - 1``, issued at
    ``issued_s``; ``host`` is the mover's handle of the reserved host pages."""

    __slots__ = ("start", "pages", "issued_s", "host")

    def __init__(self, start, pages, issued_s, host):
        self.start = start
        self.pages = pages
        self.issued_s = issued_s
        self.host = host


class _Waiting:
    __slots__ = ("keys", "weights", "prefetches", "covered", "page_starts")

    def __init__(self, keys, weights):
        self.keys = keys
        self.weights = weights
        self.prefetches: List[_Prefetch] = []
        self.covered = 0            # request pages up to here are on a tier or asked from storage
        self.page_starts = None     # page index at which each unit starts (built on demand)

    def unit_starts(self) -> List[int]:
        if self.page_starts is None:
            out = [0] * (len(self.keys) + 1)
            w = self.weights
            for u in range(len(self.keys)):
                out[u + 1] = out[u] + (1 if w is None else w[u])
            self.page_starts = out
        return self.page_starts

    def total_pages(self) -> int:
        return self.unit_starts()[-1]


class Admission:
    """What one admitted request got from each tier, in pages (and storage wait time)."""

    __slots__ = ("device_pages", "host_pages", "storage_pages", "lookup_pages", "storage_wait_s")

    def __init__(self, lookup_pages):
        self.device_pages = 0
        self.host_pages = 0
        self.storage_pages = 0
        self.lookup_pages = lookup_pages
        self.storage_wait_s = 0.0

    @property
    def hit_pages(self) -> int:
        return self.device_pages + self.host_pages + self.storage_pages

    def as_dict(self) -> Dict[str, Any]:
        return {"device": self.device_pages, "host": self.host_pages, "storage": self.storage_pages,
                "lookup": self.lookup_pages, "storage_wait_s": self.storage_wait_s}


def _new_counts() -> Dict[str, int]:
    return {
        "device_hit_pages": 0, "host_hit_pages": 0, "storage_hit_pages": 0, "miss_pages": 0,
        "device_evicted_pages": 0, "device_demoted_pages": 0, "device_dropped_pages": 0,
        "host_evicted_pages": 0, "host_reclaimed_pages": 0, "host_dropped_pages": 0,
        "host_written_pages": 0, "host_write_failed_pages": 0,
        "storage_written_pages": 0, "storage_write_skipped_pages": 0,
        "load_back_pages": 0, "load_back_skipped": 0, "recomputed_pages": 0,
        "prefetch_issued": 0, "prefetch_issued_pages": 0, "prefetch_used_pages": 0,
        "prefetch_dropped_pages": 0, "prefetch_present_pages": 0,
        "prefetch_below_threshold": 0, "prefetch_rate_limited": 0, "prefetch_no_host_space": 0,
        "prefetch_completed": 0, "prefetch_terminated": 0,
        "prefetch_retries": 0, "prefetch_retry_issued": 0, "prefetch_retry_pages": 0,
        "scheduling_passes": 0, "device_truncated_pages": 0,
    }


class TieredCache(RadixTree):
    """Device / host / storage tiers over one weighted radix tree; moves go through ``mover``.

    ``mover`` fixes the tier sizes (``device_pages``, ``host_pages``; ``has_storage``) and
    carries out each move.  ``hierarchical=False`` gives the single-tier cache of
    ``replay_rules.md`` (then it counts exactly like :meth:`RadixTree.serve`).
    Units and weights are given per request exactly as to :meth:`RadixTree.serve`.
    """

    def __init__(self, mover, *, policy, page_size: int = 1, hierarchical: bool = True,
                 write_policy: str = "write_through", host_mode: str = "cache",
                 prefetch_policy: str = "best_effort", prefetch_threshold: int = 256,
                 prefetch_timeout_base: float = 1.0, prefetch_timeout_per_ki_token: float = 0.25,
                 load_back_threshold: int = 10,
                 retry_poll_interval: int = DEFAULT_RETRY_POLL_INTERVAL,
                 retry_max_attempts: int = DEFAULT_RETRY_MAX_ATTEMPTS,
                 storage_read_bytes_per_s: Optional[float] = None, semantics: str = "rules"):
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"Invalid write policy: {write_policy!r}; allowed: {', '.join(WRITE_POLICIES)}")
        if prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(f"Invalid prefetch policy: {prefetch_policy!r}; allowed: {', '.join(PREFETCH_POLICIES)}")
        if host_mode not in HOST_MODES:
            raise ValueError(f"Invalid host memory mode: {host_mode!r}; allowed: {', '.join(HOST_MODES)}")
        if storage_read_bytes_per_s is not None and not storage_read_bytes_per_s > 0:
            raise ValueError(f"storage_read_bytes_per_s must be > 0 (or None = unbounded), "
                             f"got {storage_read_bytes_per_s!r}")
        self.mover = mover
        self.page_size = int(page_size)
        self.device_pages = int(mover.device_pages)
        self.host_pages = int(mover.host_pages) if hierarchical else 0
        self.hierarchical = bool(hierarchical) and self.host_pages > 0
        self.has_storage = self.hierarchical and bool(mover.has_storage)
        self.buffer_only = self.hierarchical and host_mode == "buffer_only"
        if self.buffer_only and not self.has_storage:
            raise ValueError("hicache_host_memory_mode=buffer_only needs a storage backend")
        if self.buffer_only and write_policy == "write_back":
            write_policy = "write_through"
        self.write_policy = write_policy
        self.is_write_back = write_policy == "write_back"
        self.backup_threshold = 1 if write_policy == "write_through" else 2
        self.prefetch_policy = prefetch_policy
        self.prefetch_threshold = max(int(prefetch_threshold), self.page_size) if self.has_storage else 0
        self.prefetch_timeout_base = float(prefetch_timeout_base)
        self.prefetch_timeout_per_page = self.page_size / 1024 * float(prefetch_timeout_per_ki_token)
        self.load_back_threshold = int(load_back_threshold)
        self.storage_read_bytes_per_s = storage_read_bytes_per_s
        self.page_bytes = int(getattr(mover, "page_bytes", 0) or 0)
        self.prefetch_capacity_limit = int((0.9 if self.buffer_only else 0.5) * self.host_pages * self.page_size)
        self.prefetch_in_flight_tokens = 0
        self.retries = PrefetchRetries(retry_poll_interval, retry_max_attempts)
        self.waiting: Dict[Hashable, _Waiting] = {}
        self.counts = _new_counts()
        self.device_used = 0
        self.host_used = 0
        self._host_heap: list = []
        self._duplicates: set = set()       # nodes on device and host (write_back reclaim)
        # RadixTree state (the policy reads capacity, _clock and root)
        self.capacity = self.device_pages + (0 if self.buffer_only else self.host_pages)
        self.policy = policy
        self.root = TreeNode(None, None, -1, 0)
        self.root.lock_ref = 1
        self.root.device = True
        self.size = 0
        self.protected_size = 0
        self.evictions = 0
        self.evicted_nodes = 0
        self._heap = []
        self._seq = 0
        self._clock = 0
        self._init_semantics(semantics)
        if self._engine and self.hierarchical:
            raise ValueError("cache_semantics=sglang models the engine's device radix cache only; "
                             "use cache_semantics=rules with a host tier (HiCache)")
        self._bind_policy(policy)

    # ------------------------------------------------------------------ tree helpers
    def _split(self, child: TreeNode, m: int) -> TreeNode:
        up = super()._split(child, m)
        mover = self.mover
        if child.device is not None:
            up.device, child.device = mover.split_handle(child.device, m)
            up.device_children = 1
            if child in self._duplicates:
                self._duplicates.add(up)
        if child.host is not None:
            up.host, child.host = mover.split_handle(child.host, m)
        up.stored = child.stored
        up.backup_hits = child.backup_hits
        return up

    def _push_host(self, node: TreeNode) -> None:
        self._seq += 1
        node.host_heap_seq = self._seq
        heappush(self._host_heap, (self.policy.key(node), self._seq, node))

    def _is_device_leaf(self, node) -> bool:
        return (node.device is not None and node.device_children == 0 and node.lock_ref == 0
                and node.parent is not None)

    def _is_host_leaf(self, node) -> bool:
        return (node.device is None and node.host is not None and not node.children
                and node.lock_ref == 0 and node.parent is not None)

    def _set_device(self, node, handle) -> None:
        had = node.device is not None
        node.device = handle
        if had != (handle is not None):
            parent = node.parent
            if handle is None:
                self.device_used -= node.weight
                node.heap_seq = -1
                if parent is not None:
                    parent.device_children -= 1
                self._duplicates.discard(node)
            else:
                self.device_used += node.weight
                node.host_heap_seq = -1
                if parent is not None:
                    parent.device_children += 1
                if node.host is not None and self.is_write_back:
                    self._duplicates.add(node)

    def _set_host(self, node, handle) -> None:
        had = node.host is not None
        node.host = handle
        if had != (handle is not None):
            if handle is None:
                self.host_used -= node.weight
                node.host_heap_seq = -1
                self._duplicates.discard(node)
            else:
                self.host_used += node.weight
                if node.device is not None and self.is_write_back:
                    self._duplicates.add(node)

    def _unlink(self, node) -> None:
        parent = node.parent
        del parent.children[node.key]
        node.parent = None
        self.evicted_nodes += 1
        if self.policy.wants_evict_hook:
            self.policy.on_evict(node)

    def _drop_subtree(self, node) -> None:
        """Remove ``node`` (a device leaf) and its host-only descendants from every tier."""
        order = [node]
        i = 0
        while i < len(order):
            order.extend(order[i].children.values())
            i += 1
        mover = self.mover
        counts = self.counts
        for m in reversed(order):        # children before parents
            if m.device is not None:
                mover.free_device(m.device)
                counts["device_dropped_pages"] += m.weight
                self._set_device(m, None)
            if m.host is not None:
                mover.free_host(m.host)
                counts["host_dropped_pages"] += m.weight
                self._set_host(m, None)
            self._unlink(m)

    # ------------------------------------------------------------------ backup (D->H, H->storage)
    def _backup(self, chain: List[TreeNode]) -> int:
        """D->H for ``chain`` (root-most first); stops at the first node the host cannot
        take, so backed-up nodes stay prefix-closed; then H->storage."""
        todo = [n for n in chain if n.host is None and n.device is not None]
        if not todo:
            return 0
        need = 0
        for n in todo:
            need += n.weight
        free = self.host_pages - self.host_used
        if free < need:
            self.evict_host(need - free)
            free = self.host_pages - self.host_used
        if free < need:
            fit = 0
            room = free
            for n in todo:
                if n.weight > room:
                    break
                room -= n.weight
                fit += 1
            failed = sum(n.weight for n in todo[fit:])
            self.counts["host_write_failed_pages"] += failed
            todo = todo[:fit]
            if not todo:
                return 0
        handles = self.mover.backup(todo)
        written = 0
        dups = self._duplicates if self.is_write_back else None
        for n, h in zip(todo, handles):
            n.host = h                  # on device too
            written += n.weight
            if dups is not None:
                dups.add(n)
        self.host_used += written
        self.counts["host_written_pages"] += written
        if self.has_storage:
            self._write_storage(todo)
        if self.buffer_only:          # the host was only staging
            for n in todo:
                self.mover.free_host(n.host)
                self._set_host(n, None)
        return written

    def _write_storage(self, nodes: List[TreeNode]) -> None:
        todo = [n for n in nodes if not n.stored]
        if not todo:
            return
        written = self.mover.write_storage(todo)
        total = 0
        for n in todo:
            n.stored = True
            total += n.weight
        self.counts["storage_written_pages"] += written
        self.counts["storage_write_skipped_pages"] += total - written

    def _count_backup_hit(self, node) -> bool:
        """Reference ``_inc_hit_count_and_check``: True when ``node`` is due for a backup."""
        if self.is_write_back or node.device is None:
            return False
        node.backup_hits += 1
        backed = node.stored if self.buffer_only else node.host is not None
        return not backed and node.backup_hits >= self.backup_threshold

    def _backup_chain(self, node) -> int:
        chain = []
        m = node
        while m.parent is not None:
            if (m.stored if self.buffer_only else m.host is not None):
                break
            chain.append(m)
            m = m.parent
        chain.reverse()
        return self._backup(chain)

    # ------------------------------------------------------------------ evictions
    def evict_device(self, num_pages: int) -> int:
        """Free at least ``num_pages`` device pages (whole device leaves); returns pages freed.

        The victims come from the tree's one eviction loop (:meth:`RadixTree._evict_leaves`);
        the hooks below say what a device leaf is and what evicting it does."""
        if num_pages <= 0:
            return 0
        if self._engine:
            return self.evict(num_pages)
        self._dropped_nodes = self._dropped_pages = self._demoted_pages = 0
        freed = self._evict_leaves(num_pages)
        counts = self.counts
        self.device_used -= self._dropped_pages + self._demoted_pages
        counts["device_demoted_pages"] += self._demoted_pages
        self.evicted_nodes += self._dropped_nodes
        counts["device_dropped_pages"] += self._dropped_pages
        counts["device_evicted_pages"] += freed
        self.evictions += freed
        return freed

    def _shielded(self, node) -> bool:
        # an entry is current while its seq is the node's: freeing the device copy resets
        # heap_seq, so only "has a device child now" is left to check
        if self._engine:
            return RadixTree._shielded(self, node)
        return node.device_children > 0

    def _offer_parent(self, parent) -> None:
        if self._engine:
            return RadixTree._offer_parent(self, parent)
        if parent is not self.root and parent.device_children == 0 and parent.device is not None:
            self._push(parent)

    def _remove_victim(self, node):
        """Demote a backed-up device leaf (its host copy stays), else drop it (with its
        host-only subtree); ``write_back`` first tries to back it up."""
        if self._engine:
            return RadixTree._remove_victim(self, node)
        parent = node.parent
        w = node.weight
        if node.host is None and self.is_write_back and self.hierarchical:
            self._backup([node])
        if node.host is not None:           # demote: the host copy stays
            self.mover.free_device(node.device)
            node.device = None
            node.heap_seq = -1
            parent.device_children -= 1
            self._demoted_pages += w
            if self.is_write_back:
                self._duplicates.discard(node)
            if not node.children:
                self._push_host(node)
        elif not node.children:             # plain drop, the single-tier case: kept short
            self.mover.free_device(node.device)
            node.device = None
            node.heap_seq = -1
            parent.device_children -= 1
            del parent.children[node.key]
            node.parent = None
            self._dropped_nodes += 1
            self._dropped_pages += w
            if self.policy.wants_evict_hook:
                self.policy.on_evict(node)
        else:
            self._drop_subtree(node)
        return w, parent

    def evict_host(self, num_pages: int) -> int:
        """Free at least ``num_pages`` host pages; returns pages freed."""
        if self.buffer_only or num_pages <= 0:
            return 0
        freed = 0
        counts = self.counts
        mover = self.mover
        key_of = self.policy.key
        if self.is_write_back and self._duplicates:
            for spare_device_leaves in (True, False):
                if freed >= num_pages:
                    break
                dups = [n for n in self._duplicates if n.lock_ref == 0
                        and not (spare_device_leaves and n.device_children == 0)]
                dups.sort(key=lambda n: (key_of(n), n.insert_time, n.depth))
                for n in dups:
                    if freed >= num_pages:
                        break
                    mover.free_host(n.host)
                    freed += n.weight
                    counts["host_reclaimed_pages"] += n.weight
                    self._set_host(n, None)
        heap = self._host_heap
        held = []
        on_evict = self.policy.on_evict if self.policy.wants_evict_hook else None
        free_host = mover.free_host
        evicted = nodes = 0
        while freed < num_pages and heap:
            entry = heappop(heap)
            node = entry[2]
            # current while its seq is the node's: freeing the host copy or loading the node
            # to the device resets host_heap_seq; only "has a child now" is left to check
            if node.host_heap_seq != entry[1] or node.children:
                continue
            if node.lock_ref:
                held.append(entry)
                continue
            parent = node.parent
            free_host(node.host)
            w = node.weight
            freed += w
            evicted += w
            nodes += 1
            node.host = None           # host-only node: not a duplicate
            node.host_heap_seq = -1
            del parent.children[node.key]
            node.parent = None
            if on_evict is not None:
                on_evict(node)
            if (parent.device is None and parent.host is not None and not parent.children
                    and not parent.lock_ref and parent.parent is not None):
                self._push_host(parent)
        for entry in held:
            heappush(heap, entry)
        self.host_used -= evicted
        self.evicted_nodes += nodes
        counts["host_evicted_pages"] += evicted
        return freed

    # ------------------------------------------------------------------ prefetch
    def prefetch_timeout_s(self, pages: int) -> float:
        return self.prefetch_timeout_base + pages * self.prefetch_timeout_per_page

    def _matched_pages(self, keys, weights) -> int:
        """Pages of the request some tier holds (no touching, no splitting)."""
        node = self.root
        pages = 0
        lo = 0
        u = 0
        n = len(keys)
        while u < n:
            child = node.children.get(keys[u])
            if child is None or child.lo != lo:
                break
            w = 1 if weights is None else weights[u]
            if child.lo + child.weight > w:
                return pages + (w - lo)
            pages += child.weight
            lo += child.weight
            node = child
            if lo >= w:
                u += 1
                lo = 0
        return pages

    def _page_runs(self, w: _Waiting, start: int, count: int):
        """``(unit index, offset, pages)`` runs covering request pages ``start .. start+count-1``."""
        starts = w.unit_starts()
        out = []
        # first unit whose range holds ``start``
        lo, hi = 0, len(w.keys)
        while lo < hi:
            mid = (lo + hi) // 2
            if starts[mid + 1] <= start:
                lo = mid + 1
            else:
                hi = mid
        u = lo
        end = start + count
        p = start
        append = out.append
        while p < end:
            first = starts[u]
            stop = starts[u + 1]
            if stop > end:
                stop = end
            append((u, p - first, stop - p))
            p = stop
            u += 1
        return out

    def _issue_prefetch(self, rid, w: _Waiting, now_s: float) -> None:
        start = max(self._matched_pages(w.keys, w.weights), w.covered)
        rest = w.total_pages() - start
        ps = self.page_size
        if rest <= 0 or rest * ps < self.prefetch_threshold:
            return
        runs = self._page_runs(w, start, rest)
        hit = self.mover.storage_leading([(w.keys[u], a, n) for u, a, n in runs])
        counts = self.counts
        if hit < rest:
            self.retries.poll_miss(rid)
        if hit * ps < self.prefetch_threshold:
            counts["prefetch_below_threshold"] += 1
            return
        room = (self.prefetch_capacity_limit - self.prefetch_in_flight_tokens) // ps
        if room * ps < self.prefetch_threshold:
            counts["prefetch_rate_limited"] += 1
            self.retries.poll_miss(rid)
            return
        hit = min(hit, room)
        free = self.host_pages - self.host_used
        if free < hit:
            self.evict_host(hit - free)
            free = self.host_pages - self.host_used
            if free < hit:
                if free * ps < self.prefetch_threshold:
                    counts["prefetch_no_host_space"] += 1
                    self.retries.poll_miss(rid)
                    return
                hit = free
        host = self.mover.reserve_host(hit)
        self.host_used += hit
        self.prefetch_in_flight_tokens += hit * ps
        w.prefetches.append(_Prefetch(start, hit, now_s, host))
        w.covered = start + hit
        counts["prefetch_issued"] += 1
        counts["prefetch_issued_pages"] += hit

    def _landed(self, op: _Prefetch, now_s: float) -> Tuple[int, float]:
        """Pages of ``op`` usable at admission time ``now_s`` and the extra wait (s)."""
        bw = self.storage_read_bytes_per_s
        if bw is None or self.page_bytes <= 0:
            return op.pages, 0.0
        elapsed = max(0.0, now_s - op.issued_s)
        per_page = self.page_bytes / bw
        ready = min(op.pages, int(elapsed * bw // self.page_bytes))
        if ready >= op.pages or self.prefetch_policy == "best_effort":
            return ready, 0.0
        needed = op.pages * per_page - elapsed
        if self.prefetch_policy == "wait_complete":
            return op.pages, needed
        wait = min(needed, self.prefetch_timeout_s(op.pages))
        return min(op.pages, int((elapsed + wait) * bw // self.page_bytes)), wait

    def _attach_prefetched(self, w: _Waiting, tail: TreeNode, have: int, clock: int,
                           locked: List[TreeNode], adm: Admission, now_s: float) -> List[TreeNode]:
        """Close each prefetch's admission gate and hang the pages it read below the
        request's matched prefix as host-only nodes; the rest of its host pages is freed."""
        staged: List[TreeNode] = []
        counts = self.counts
        mover = self.mover
        parent = tail
        for op in w.prefetches:
            done, wait = self._landed(op, now_s)
            if wait > adm.storage_wait_s:
                adm.storage_wait_s = wait
            self.prefetch_in_flight_tokens -= op.pages * self.page_size
            counts["prefetch_completed" if done == op.pages else "prefetch_terminated"] += 1
            done = mover.read_storage(op.host, [(w.keys[u], a, n)
                                                for u, a, n in self._page_runs(w, op.start, done)]) if done else 0
            skip = have - op.start
            kept = 0
            if 0 <= skip < done:
                counts["prefetch_present_pages"] += skip
                offset = skip
                for u, a, n in self._page_runs(w, have, done - skip):
                    key = w.keys[u]
                    if key in parent.children:       # another run already hangs here
                        break
                    node = TreeNode(key, parent, parent.depth + n, clock, n, a, u)
                    node.stored = True
                    parent.children[key] = node
                    if self.policy.wants_insert_hook:
                        self.policy.on_insert(node)
                    node.host = mover.take_host(op.host, offset, n)
                    self.host_used += n        # re-booked below when the reservation is released
                    node.lock_ref += 1
                    locked.append(node)
                    staged.append(node)
                    offset += n
                    kept += n
                    have += n
                    parent = node
            elif skip >= done:
                counts["prefetch_present_pages"] += done
            counts["prefetch_dropped_pages"] += op.pages - kept
            mover.release_host(op.host)
            self.host_used -= op.pages
        return staged

    # ------------------------------------------------------------------ scheduling
    def arrive(self, rid: Hashable, keys: Sequence[Hashable], weights: Optional[Sequence[int]] = None,
               now_s: float = 0.0) -> None:
        """Request ``rid`` joins the waiting queue; its storage prefetch is issued now."""
        if rid in self.waiting:
            raise ValueError(f"request {rid!r} is already waiting")
        w = _Waiting(keys, _check_weights(keys, weights))
        self.waiting[rid] = w
        self.retries.note_arrival(rid)
        if self.has_storage:
            self._issue_prefetch(rid, w, now_s)

    def scheduling_pass(self, waiting_order: Sequence[Hashable], now_s: float = 0.0) -> None:
        """One scheduler iteration: re-ask storage about the due misses of the requests
        still waiting (queue order; the head is never held back)."""
        self.counts["scheduling_passes"] += 1
        for rid in self.retries.pop_ready(waiting_order):
            w = self.waiting.get(rid)
            if w is None:
                continue
            self.counts["prefetch_retries"] += 1
            before = len(w.prefetches)
            self._issue_prefetch(rid, w, now_s)
            if len(w.prefetches) > before:
                self.counts["prefetch_retry_issued"] += 1
                self.counts["prefetch_retry_pages"] += w.prefetches[-1].pages

    def serve(self, keys, clock=None, priority: int = 0, weights=None) -> int:
        """Arrival, one scheduling pass and admission of a request that waits for nothing;
        returns the pages hit on any tier (the signature of :meth:`RadixTree.serve`)."""
        self._seq += 1
        rid = ("serve", self._seq)
        self.arrive(rid, keys, weights)
        self.scheduling_pass([rid])
        return self.admit(rid, clock=clock, priority=priority).hit_pages

    def admit(self, rid: Hashable, *, clock=None, priority: int = 0, now_s: float = 0.0) -> Admission:
        """Match, prefetch gate, load-back, insert and backup of waiting request ``rid``."""
        w = self.waiting.pop(rid)
        self.retries.forget(rid)
        keys, weights = w.keys, w.weights
        clock = self._tick(clock)
        counts = self.counts
        mover = self.mover
        root = self.root
        adm = Admission(len(keys) if weights is None else (
            w.page_starts[-1] if w.page_starts is not None else sum(weights)))
        if self._engine:
            # one tier, the engine's own request loop and node-granular eviction (radix.py)
            adm.device_pages = self._serve_engine(keys, weights, priority)
            counts["device_hit_pages"] += adm.device_pages
            counts["miss_pages"] += adm.lookup_pages - adm.hit_pages
            self.device_used = self.size
            return adm
        k, last, u, lo = self._walk(keys, weights, clock, True)
        locked: List[TreeNode] = []
        staged: List[TreeNode] = []
        recompute: List[TreeNode] = []
        tail = last
        if self.hierarchical:
            path: List[TreeNode] = []
            node = last
            while node is not root:
                path.append(node)
                node.lock_ref += 1
                node = node.parent
            path.reverse()
            locked.extend(path)
            ndev = 0
            device_pages = 0
            for n in path:
                if n.device is None:
                    break
                ndev += 1
                device_pages += n.weight
            adm.device_pages = device_pages
            if w.prefetches:
                staged = self._attach_prefetched(w, last, k, clock, locked, adm, now_s)
            if ndev < len(path) or staged:
                recompute = self._load_back(path[ndev:] + staged, staged, locked, adm)
                if staged and staged[-1].parent is not None:
                    tail = staged[-1]
                    u, lo = tail.unit_index, tail.lo + tail.weight
                    if lo >= (1 if weights is None else weights[u]):
                        u += 1
                        lo = 0
            for n in staged:
                n.last_access = clock
        else:
            adm.device_pages = k
            last.lock_ref += 1
            locked.append(last)
        counts["device_hit_pages"] += adm.device_pages
        counts["host_hit_pages"] += adm.host_pages
        counts["storage_hit_pages"] += adm.storage_pages
        counts["prefetch_used_pages"] += adm.storage_pages
        # ---- insert: device pages for the new units and for host pages not loaded back
        fresh: List[TreeNode] = []
        if u < len(keys):
            node = self._grow(tail, keys, weights, u, lo, clock, priority)
            while node is not tail:
                fresh.append(node)
                node = node.parent
            fresh.reverse()
        need_nodes = recompute + fresh if recompute else fresh
        if need_nodes:
            need = 0
            for n in need_nodes:
                need += n.weight
            free = self.device_pages - self.device_used
            if free < need:
                self.evict_device(need - free)
                free = self.device_pages - self.device_used
                if free < need:
                    need_nodes = self._truncate(need_nodes, free)
            if need_nodes:
                handles = mover.allocate_device(need_nodes)
                if recompute:
                    for n in recompute:
                        if n.parent is not None and n.device is None:
                            counts["recomputed_pages"] += n.weight
                for n, h in zip(need_nodes, handles):
                    if n.host is None:          # new node: the common case, kept short
                        n.device = h
                        n.parent.device_children += 1
                        self.device_used += n.weight
                    else:
                        self._set_device(n, h)
        self.size = self.device_used
        counts["miss_pages"] += adm.lookup_pages - adm.hit_pages
        # ---- the deepest node of the request on the device; policy statistics; backups
        end = need_nodes[-1] if need_nodes else tail
        while end.device is None:
            end = end.parent
        if end is not root:
            if priority:
                self._raise_priority(end, priority)
            if self.policy.wants_touch:
                self._touch(keys, adm.hit_pages, clock, end)
            if self.hierarchical and not self.is_write_back:
                # reference _inc_hit_count_and_check on every node of the request on the
                # device; the deepest one due for a backup is backed up with its ancestors
                threshold = self.backup_threshold
                buffer_only = self.buffer_only
                flagged = None
                node = end
                while node is not root:
                    node.backup_hits += 1
                    if (flagged is None and node.backup_hits >= threshold
                            and not (node.stored if buffer_only else node.host is not None)):
                        flagged = node
                    node = node.parent
                if flagged is not None:
                    self._backup_chain(flagged)
        for n in locked:
            n.lock_ref -= 1
        if end is not root and not end.device_children and not end.lock_ref:
            self._push(end)
        return adm

    def _load_back(self, load: List[TreeNode], staged: List[TreeNode], locked: List[TreeNode],
                   adm: Admission) -> List[TreeNode]:
        """Host -> device for ``load`` (the path's host-only tail, then what storage brought);
        returns the nodes that still need device pages (recomputed) when it is skipped."""
        counts = self.counts
        mover = self.mover
        pages = 0
        for n in load:
            pages += n.weight
        ok = pages * self.page_size >= self.load_back_threshold
        if ok:
            free = self.device_pages - self.device_used
            if free < pages:
                self.evict_device(pages - free)
            ok = self.device_pages - self.device_used >= pages
        if ok:
            handles = mover.load_back(load)
            for n, h in zip(load, handles):
                self._set_device(n, h)
            if self.buffer_only:
                for n in load:
                    mover.free_host(n.host)
                    self._set_host(n, None)
            counts["load_back_pages"] += pages
            staged_pages = 0
            for n in staged:
                staged_pages += n.weight
            adm.storage_pages = staged_pages
            adm.host_pages = pages - staged_pages
            return []
        counts["load_back_skipped"] += 1
        for n in staged:
            counts["prefetch_dropped_pages"] += n.weight
        if self.buffer_only and staged:
            for n in reversed(staged):
                n.lock_ref -= 1
                locked.remove(n)
                mover.free_host(n.host)
                self._set_host(n, None)
                self._unlink(n)
            staged.clear()
            return [n for n in load if n.parent is not None]
        return load

    def _truncate(self, need_nodes: List[TreeNode], room: int) -> List[TreeNode]:
        """The request does not fit on the device even after eviction: keep the leading
        nodes that do; new nodes past them leave the tree."""
        fit = 0
        for n in need_nodes:
            if n.weight > room:
                break
            room -= n.weight
            fit += 1
        cut = need_nodes[fit:]
        self.counts["device_truncated_pages"] += sum(n.weight for n in cut)
        for n in reversed(cut):
            if n.host is None and n.parent is not None and not n.children:
                self._unlink(n)
            elif self._is_host_leaf(n):
                self._push_host(n)
        return need_nodes[:fit]

    # ------------------------------------------------------------------ teardown / checks
    def close(self) -> None:
        """Give back the host pages of requests that never got admitted."""
        for w in self.waiting.values():
            for op in w.prefetches:
                self.mover.release_host(op.host)
                self.host_used -= op.pages
            w.prefetches = []
        self.waiting.clear()

    def tier_of(self, node: TreeNode) -> str:
        t = []
        if node.device is not None:
            t.append("device")
        if node.host is not None:
            t.append("host")
        if node.stored:
            t.append("storage")
        return "+".join(t) or "none"

    def check_invariants(self) -> None:
        if self._engine:        # one tier, the tree's own bookkeeping (no page handles)
            RadixTree.check_invariants(self)
            assert self.device_used == self.size, "device pages != tree pages"
            return
        dev = host = 0
        for n in self.iter_nodes():
            assert n.parent.children.get(n.key) is n, "parent link broken"
            assert n.device is not None or n.host is not None or self.buffer_only, "node on no tier"
            assert n.lock_ref == 0, "lock left behind"
            if n.device is not None:
                dev += n.weight
                if n.parent is not self.root:
                    assert n.parent.device is not None, "device set must be prefix-closed"
            if n.host is not None:
                host += n.weight
            kids = sum(1 for c in n.children.values() if c.device is not None)
            assert kids == n.device_children, "device child count"
        assert dev == self.device_used <= self.device_pages, (dev, self.device_used)
        assert host <= self.host_used <= self.host_pages, (host, self.host_used)
