"""A radix (prefix) tree of weighted page runs for KV-cache simulation.

A prompt is a sequence of *units*, each named by a key that already names the whole
prefix up to and including that unit: a hash id taken from a trace (Mooncake traces
guarantee that an id always has the same parent) or the chained hash produced by
:func:`chained_page_keys`.  With the plain API a unit is one page; with ``weights=`` a unit
(e.g. one 512-token trace block at page size 16) holds several pages and is stored as one
node whose *weight* is its page count, like the reference engine's radix cache, which
keeps a token segment per node.  A match that ends inside a node splits it.  Children
are looked up in a plain dict per node, so matching a prompt costs one dict probe per
node and there are no per-page objects.

Eviction follows the reference engine: only *leaves* (cached nodes without cached
children) are removed, always whole (all of a node's pages at once), nodes with a
positive ``lock_ref`` are never removed, and the leaf with the smallest policy key goes
first; leaves are evicted until the requested number of pages is freed.  Candidate leaves live in a binary heap with lazy
invalidation: an entry is ``(key, seq, node)`` and is only honoured when ``seq`` is still
the node's latest push and the node is still a cached, childless leaf.  A leaf is pushed
when it appears (insertion, or its last child was evicted) and again whenever a request
touches it, so the heap always holds one current entry per evictable leaf.

Capacity, ``size``, lock accounting and hit lengths are counted in pages.  ``size`` never
exceeds ``capacity`` after :meth:`serve` returns unless every evictable leaf is pinned.
With one page per unit (e.g. page size 512 on a trace) this is exactly the page-granular
tree of ``replay_rules.md``.

Two *cache semantics* (``semantics=``, the replay's ``job.cache_semantics``):

* ``"rules"``: ``replay_rules.md``.  A unit is the unit of eviction, the clock is the
  request index, a hit touches the matched units (``last_access``, ``hit_count``).
* ``"sglang"``: the decisions of SGLang 0.5.23's ``RadixCache`` for the request loop
  match -> pin -> evict until the new pages fit -> insert -> unpin.  The engine keeps one
  node per *insert* (the whole new suffix of a prompt) and splits it where a later match
  ends, so the unit of eviction is that engine node: here a *segment* of units sharing
  ``seg``, removed all at once.  Stamps follow the engine's update points on a logical
  clock (:attr:`now`, one tick per ``time.monotonic()`` the engine takes): a match stamps
  the matched path and the node it splits; an insert stamps the path again and counts
  one hit on each node of it (the engine counts hits at insert time, not at match time);
  a node made by a split or an insert gets a fresh access stamp and, one tick later, its
  creation stamp (``insert_time``), as the engine's node constructor reads the clock twice.  Only :meth:`serve` knows this
  loop, so the other entry points (``match_prefix``/``insert``) are rules-only.
"""
from __future__ import annotations

import hashlib
from heapq import heapify, heappop, heappush
from typing import Hashable, Iterator, List, Optional, Sequence, Tuple

__all__ = [
    "CACHE_SEMANTICS",
    "TreeNode",
    "RadixTree",
    "MatchResult",
    "chained_page_keys",
    "block_page_keys",
    "block_page_weights",
    "cut_units",
]


#: ``semantics=`` values of :class:`RadixTree` (and ``job.cache_semantics``).
CACHE_SEMANTICS = ("rules", "sglang")


def check_semantics(semantics: str) -> str:
    if semantics not in CACHE_SEMANTICS:
        raise ValueError(f"unknown cache semantics {semantics!r}; allowed: {', '.join(CACHE_SEMANTICS)}")
    return semantics


class TreeNode:
    """One cached run of pages (a *segment*).

    A node covers pages ``lo .. lo + weight - 1`` of the *unit* named by ``key``.  With the
    plain page-key API every unit is one page (``weight == 1``, ``lo == 0``).  With the
    weighted API (``weights=``) a unit is e.g. one 512-token trace block holding several
    pages, stored as one node; when a match ends inside a node the node is split, so a
    unit may be spread over a short chain of nodes with the same ``key`` (the lower one is
    the continuation of the upper one and is stored under the same key in its
    ``children``).

    ``parent`` is ``None`` once the node has been evicted (the root's parent is also
    ``None``; the root is never evicted).  ``depth`` is the 0-based position of the node's
    *deepest* page in the prompt (``depth - weight + 1`` pages are cached before it);
    ``unit_index`` is the 0-based position of its unit in the request.  ``high_water`` (the
    deepest prompt length, in pages, any request reached through the node) is T-LRU's and
    ``next_use`` (the index of the next request that reads the node) is Belady's.

    The tier fields belong to :class:`~sglang_hydra.cache.tiered.TieredCache`: ``device`` and
    ``host`` are the node's page handles on each tier (None = not there; what a handle is
    depends on the mover), ``stored`` says its pages were written to storage,
    ``device_children`` counts children that are on the device and ``backup_hits`` is the
    write-through counter (reference §5.2).
    """

    __slots__ = (
        "key", "parent", "children", "depth", "lock_ref", "last_access", "hit_count",
        "insert_time", "priority", "high_water", "next_use", "heap_seq", "weight", "lo", "unit_index",
        # tier state, used by the tiered cache (cache/tiered.py); a plain RadixTree leaves them unset
        "device", "host", "stored", "device_children", "backup_hits", "host_heap_seq",
        # cache_semantics="sglang": the engine node (segment) this unit belongs to
        "seg",
    )

    def __init__(self, key, parent, depth, clock, weight=1, lo=0, unit_index=0):
        self.key = key
        self.parent = parent
        self.children = {}
        self.depth = depth
        self.lock_ref = 0
        self.last_access = clock
        self.hit_count = 1
        self.insert_time = clock
        self.priority = 0
        self.high_water = 0
        self.next_use = None
        self.device = None
        self.host = None
        self.stored = False
        self.device_children = 0
        self.backup_hits = 0
        self.host_heap_seq = 0
        self.heap_seq = 0
        self.weight = weight
        self.lo = lo
        self.unit_index = unit_index
        self.seg = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def cached(self) -> bool:
        return self.parent is not None

    @property
    def hi(self) -> int:
        """Offset, within its unit, just past the node's last page."""
        return self.lo + self.weight

    def path_keys(self) -> List[Hashable]:
        """Keys of the nodes from the root's first child down to this node."""
        out = []
        node = self
        while node.parent is not None:
            out.append(node.key)
            node = node.parent
        out.reverse()
        return out

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"TreeNode(key={self.key!r}, lo={self.lo}, weight={self.weight}, "
                f"depth={self.depth}, lock_ref={self.lock_ref}, "
                f"last_access={self.last_access}, hit_count={self.hit_count})")


class MatchResult(Tuple[int, TreeNode]):
    """``(num_pages_matched, last_node)``; ``last_node`` is the root when nothing matched."""

    __slots__ = ()

    def __new__(cls, length: int, last_node: TreeNode):
        return tuple.__new__(cls, (length, last_node))

    @property
    def length(self) -> int:
        return self[0]

    @property
    def last_node(self) -> TreeNode:
        return self[1]


def _check_weights(keys, weights):
    if weights is None:
        return None
    if len(weights) != len(keys):
        raise ValueError(f"{len(keys)} keys but {len(weights)} weights")
    for w in weights:
        if w < 1:
            raise ValueError(f"unit weights must be >= 1 page, got {w}")
    return weights


class RadixTree:
    """Prefix tree of page runs with lock references and policy-driven leaf eviction.

    Every method takes the prompt as a sequence of *unit keys*.  Without ``weights`` each
    key is one page.  With ``weights`` (one positive int per key) unit ``j`` holds
    ``weights[j]`` pages and is stored as one node of that weight; two occurrences of a
    key may have different weights (a trace request's last, partial block), and they share
    their first ``min`` pages.  Keys must name the whole prefix up to and including their
    unit (trace hash ids and :func:`chained_page_keys` do), so a key never follows itself.

    Parameters
    ----------
    capacity:
        Maximum number of cached pages (``None`` = unbounded).
    policy:
        An :class:`~sglang_hydra.cache.policies.EvictionPolicy` instance (default LRU).
    semantics:
        ``"rules"`` (``replay_rules.md``) or ``"sglang"`` (the engine's node-granular
        decisions; see the module docstring).
    """

    def __init__(self, capacity: Optional[int] = None, policy=None, semantics: str = "rules"):
        if policy is None:
            from .policies import make_policy

            policy = make_policy("lru")
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0 pages, got {capacity}")
        self.capacity = capacity
        self.policy = policy
        self.root = TreeNode(None, None, -1, 0)
        self.root.lock_ref = 1
        self.size = 0              # cached pages (root excluded)
        self.protected_size = 0    # cached pages in nodes with lock_ref > 0
        self.evictions = 0         # pages evicted
        self.evicted_nodes = 0
        self._heap: list = []
        self._seq = 0
        self._clock = 0
        self._init_semantics(semantics)
        self._bind_policy(policy)

    def _bind_policy(self, policy) -> None:
        from .policies import BeladyPolicy

        # Belady's own on_touch assumes one node per page; the tree stamps next uses per
        # node from the policy's per-unit table instead (identical for weight-1 nodes).
        self._belady = isinstance(policy, BeladyPolicy)
        policy.bind(self)
        # engine-node hooks (the plugin's ghost policies), read once: insert and evict are hot
        self._node_hooks = bool(self._engine and getattr(policy, "engine_node_hooks", False))

    # ------------------------------------------------------------------ helpers
    def _init_semantics(self, semantics: str) -> None:
        self.semantics = check_semantics(semantics)
        self._engine = semantics == "sglang"
        self._mono = 0          # the engine's clock (sglang semantics)
        self._segs = 0          # last segment id handed out

    @property
    def now(self) -> int:
        """The time base of ``last_access``: the request index (rules) or the engine's
        logical clock (sglang).  Policies that age nodes compare against this."""
        return self._mono if self._engine else self._clock

    @property
    def evictable_size(self) -> int:
        return self.size - self.protected_size

    @property
    def num_nodes(self) -> int:
        return sum(1 for _ in self.iter_nodes())

    def _tick(self, clock):
        if clock is None:
            self._clock += 1
            return self._clock
        self._clock = clock
        return clock

    def _push(self, node: TreeNode) -> None:
        self._seq += 1
        node.heap_seq = self._seq
        heappush(self._heap, (self.policy.key(node), self._seq, node))

    def _split(self, child: TreeNode, m: int) -> TreeNode:
        """Split ``child`` after its first ``m`` pages; returns the new upper node.

        The upper node inherits every statistic and the lock count (a lock on ``child``
        or below also covers its new ancestor); ``child`` keeps its heap entry.
        """
        parent = child.parent
        key = child.key
        up = TreeNode(key, parent, child.depth - (child.weight - m), child.last_access,
                      m, child.lo, child.unit_index)
        up.hit_count = child.hit_count
        up.insert_time = child.insert_time
        up.priority = child.priority
        up.high_water = child.high_water
        up.next_use = child.next_use
        up.lock_ref = child.lock_ref
        up.seg = child.seg
        parent.children[key] = up
        up.children[key] = child
        child.parent = up
        child.lo += m
        child.weight -= m
        return up

    def _walk(self, keys, weights, clock, touch):
        """Follow the cached prefix; returns ``(pages, last node, unit, offset)`` where
        ``(unit, offset)`` is the first page that is not cached."""
        node = self.root
        k = 0
        n = len(keys)
        if weights is None:
            u = 0
            children = node.children
            for key in keys:
                child = children.get(key)
                if child is None or child.lo:
                    break
                if child.weight != 1:
                    child = self._split(child, 1)
                if touch:
                    child.last_access = clock
                    child.hit_count += 1
                node = child
                children = child.children
                u += 1
            return u, node, u, 0
        u = 0
        lo = 0
        while u < n:
            key = keys[u]
            w = weights[u]
            child = node.children.get(key)
            if child is None or child.lo != lo:
                break
            if child.lo + child.weight > w:
                child = self._split(child, w - lo)
            if touch:
                child.last_access = clock
                child.hit_count += 1
            k += child.weight
            node = child
            lo += child.weight
            if lo >= w:
                u += 1
                lo = 0
        return k, node, u, lo

    def _grow(self, node, keys, weights, u, lo, clock, priority):
        policy_insert = self.policy.on_insert if self.policy.wants_insert_hook else None
        depth = node.depth
        added = 0
        n = len(keys)
        while u < n:
            key = keys[u]
            wt = (1 if weights is None else weights[u]) - lo
            depth += wt
            child = TreeNode(key, node, depth, clock, wt, lo, u)
            if priority:
                child.priority = priority
            node.children[key] = child
            if policy_insert is not None:
                policy_insert(child)
            added += wt
            node = child
            u += 1
            lo = 0
        self.size += added
        return node

    def _touch(self, keys, k, clock, node):
        if self._belady:
            nu = self.policy._next[clock]
            root = self.root
            while node is not root:
                node.next_use = nu[node.unit_index]
                node = node.parent
        else:
            self.policy.on_touch(keys, k, clock, node)

    # ------------------------------------------------------------- public API
    def match_prefix(self, page_keys: Sequence[Hashable], clock=None,
                     weights: Optional[Sequence[int]] = None) -> MatchResult:
        """Longest cached prefix of ``page_keys``; touches the matched nodes.

        Matched nodes get ``last_access = clock`` and ``hit_count += 1``; a node in which
        the match ends is split first, so only the matched pages are touched.  Nothing is
        inserted or evicted.  The length is in pages.
        """
        weights = _check_weights(page_keys, weights)
        clock = self._tick(clock)
        k, node, _, _ = self._walk(page_keys, weights, clock, True)
        if k:
            if self.policy.wants_touch:
                self._touch(page_keys, k, clock, node)
            if not node.children:
                self._push(node)
        return MatchResult(k, node)

    def insert(self, page_keys: Sequence[Hashable], clock=None, priority: int = 0,
               weights: Optional[Sequence[int]] = None) -> MatchResult:
        """Insert ``page_keys``; returns ``(pages that were already cached, last node)``.

        Existing nodes on the path are not touched by ``insert`` (call
        :meth:`match_prefix` first for hit accounting), but may be split so that the
        returned node ends exactly at the prompt's end.  New nodes (one per unit) get
        ``insert_time = last_access = clock`` and ``hit_count = 1``.  Insertion may leave
        the tree above capacity; call :meth:`evict` (or use :meth:`serve`).
        """
        weights = _check_weights(page_keys, weights)
        clock = self._tick(clock)
        k, node, u, lo = self._walk(page_keys, weights, clock, False)
        if priority:
            self._raise_priority(node, priority)
        if u < len(page_keys):
            node = self._grow(node, page_keys, weights, u, lo, clock, priority)
            self._push(node)
        return MatchResult(k, node)

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Protect ``node`` and its ancestors; returns the change in evictable pages."""
        delta = 0
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                delta -= node.weight
            node.lock_ref += 1
            node = node.parent
        self.protected_size -= delta
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Undo one :meth:`inc_lock_ref`; returns the change in evictable pages."""
        delta = 0
        while node is not self.root and node is not None:
            if node.lock_ref <= 0:
                raise RuntimeError(f"dec_lock_ref on an unlocked node {node.key!r}")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                delta += node.weight
                if not node.children and node.parent is not None:
                    self._push(node)
            node = node.parent
        self.protected_size -= delta
        return delta

    def evict(self, num_pages: int) -> int:
        """Evict whole unlocked leaves until at least ``num_pages`` pages are freed (or
        nothing is evictable); returns the pages evicted (may exceed ``num_pages``).

        Under sglang semantics a victim is a whole engine node (segment)."""
        if num_pages <= 0:
            return 0
        if self._node_hooks:
            self._evict_started()
        evicted = self._evict_leaves(num_pages)
        self.size -= evicted
        self.evictions += evicted
        return evicted

    # The one eviction loop.  Every cache built on this tree (the single-tier replay, the
    # tiered cache's device tier, both semantics) pops its victims here; what a victim is
    # and what removing it means are the three hooks below, which the tiered cache
    # overrides for the device tier.
    def _evict_leaves(self, num_pages: int) -> int:
        """Pop the candidate leaf with the smallest key until ``num_pages`` are freed;
        pinned leaves are held back and returned to the heap afterwards."""
        heap = self._heap
        shielded = self._shielded
        remove = self._remove_victim
        offer = self._offer_parent
        held = []
        freed = 0
        while freed < num_pages and heap:
            entry = heappop(heap)
            node = entry[2]
            if node.heap_seq != entry[1] or shielded(node):
                continue
            if node.lock_ref:
                held.append(entry)
                continue
            pages, parent = remove(node)
            freed += pages
            offer(parent)
        for entry in held:
            heappush(heap, entry)
        return freed

    def _evict_started(self) -> None:
        """A policy with engine-node hooks, as the engine plugin's cache runs it: the clock
        is read once when ``evict()`` starts, and every candidate leaf's key is evaluated
        then (the engine builds its heap from all evictable leaves at each call)."""
        self.policy.evict_started(self._stamp())
        self.rekey_candidates()

    def _shielded(self, node) -> bool:
        """Not a candidate any more: it has a cached child, or it was evicted."""
        return bool(node.children) or node.parent is None

    def _offer_parent(self, parent) -> None:
        """A victim's parent that is now a leaf becomes a candidate."""
        if not parent.children and parent is not self.root:
            self._push(parent)

    def _remove_victim(self, node):
        """Remove ``node`` (rules) or its whole engine node (sglang); returns
        ``(pages freed, the parent to offer)``."""
        on_evict = self.policy.on_evict if self.policy.wants_evict_hook else None
        top = node
        if self._engine:
            seg = node.seg
            root = self.root
            units = [node]
            while top.parent is not root and top.parent.seg == seg:
                top = top.parent
                units.append(top)
            if self._node_hooks:
                units.reverse()
                self.policy.on_evict_engine_node(units, node)
        parent = top.parent
        del parent.children[top.key]
        pages = 0
        n = node
        while True:
            pages += n.weight
            self.evicted_nodes += 1
            up = n.parent
            n.parent = None
            if on_evict is not None:
                on_evict(n)
            if n is top:
                return pages, parent
            n = up

    def serve(self, page_keys: Sequence[Hashable], clock=None, priority: int = 0,
              weights: Optional[Sequence[int]] = None) -> int:
        """One request, as the replay rules describe it; returns the hit length in pages.

        Matches the longest cached prefix (touching it, splitting the node the match ends
        in), inserts the rest (one node per unit), then evicts whole leaves until the tree
        fits its capacity while the request's own pages are pinned.
        """
        if weights is not None:
            weights = _check_weights(page_keys, weights)
        clock = self._tick(clock)
        if self._engine:
            return self._serve_engine(page_keys, weights, priority)
        k, node, u, lo = self._walk(page_keys, weights, clock, True)
        policy = self.policy
        if priority:
            self._raise_priority(node, priority)
        if u < len(page_keys):
            node = self._grow(node, page_keys, weights, u, lo, clock, priority)
            if policy.wants_touch:
                self._touch(page_keys, k, clock, node)
            self._push(node)
        elif k:
            if policy.wants_touch:
                self._touch(page_keys, k, clock, node)
            if not node.children:
                self._push(node)
        cap = self.capacity
        if cap is not None and self.size > cap:
            node.lock_ref += 1
            self.evict(self.size - cap)
            node.lock_ref -= 1
        return k

    # ------------------------------------------------------- sglang semantics
    def _stamp(self) -> int:
        self._mono += 1
        return self._mono

    @staticmethod
    def _seg_child(node):
        """The child that continues ``node``'s segment (an engine node's interior has
        exactly one child), or None when ``node`` ends its segment."""
        seg = node.seg
        for child in node.children.values():
            if child.seg == seg:
                return child
        return None

    def _engine_walk(self, keys, weights):
        """SGLang's ``_match_prefix_helper``: one clock read stamps the matched path; an
        engine node the match ends inside is split (its upper part is a new node, whose
        constructor reads the clock twice).  Returns ``(pages, last node, unit, offset)``."""
        root = self.root
        t = self._stamp()
        k, last, u, lo = self._walk(keys, weights, t, False)
        node = last
        while node is not root:
            node.last_access = t
            node = node.parent
        if last is not root:
            below = self._seg_child(last)
            if below is not None:
                # the engine stamps the node before splitting it: its lower part (the old
                # node object) keeps this stamp, the upper part is a new node
                while True:
                    below.last_access = t
                    nxt = self._seg_child(below)
                    if nxt is None:
                        break
                    below = nxt
                fresh = self._stamp()
                created = self._stamp()
                self._segs += 1
                seg, old = self._segs, last.seg
                node = last
                while node is not root and node.seg == old:
                    node.seg = seg
                    node.last_access = fresh
                    node.insert_time = created
                    node = node.parent
                if not below.children:
                    # after the split: a key may look at the (now shorter) engine node
                    self._push(below)
        return k, last, u, lo

    # ------------------------------------------- the engine's scheduler, call by call
    # The deployment loop's engine (workload/engine.py) drives these under sglang semantics,
    # in the order SGLang 0.5.23's scheduler calls its RadixCache (docs/whatif.md, "Follows
    # the engine").  Keys are cut to whole pages before every call (the engine page-aligns).
    def engine_touch(self, keys, weights, pages: int) -> None:
        """``touch_prefix`` of a waiting request (the LRU waiting-prefix refresh): a match of
        its first ``pages`` pages that pins nothing."""
        keys, weights = cut_units(keys, weights, pages)
        if keys:
            _, last, _, _ = self._engine_walk(keys, weights)
            if last is not self.root and not last.children and not last.lock_ref:
                self._push(last)

    def engine_match(self, keys, weights, pages: int) -> Tuple[int, TreeNode]:
        """``match_prefix`` of an admitted request, its key cut to ``pages`` pages; the last
        matched node is pinned (release it with :meth:`engine_release`)."""
        keys, weights = cut_units(keys, weights, pages)
        last = self.root
        k = 0
        if keys:
            k, last, _, _ = self._engine_walk(keys, weights)
        last.lock_ref += 1
        return k, last

    def engine_release(self, node: TreeNode) -> None:
        """``unlock`` of a request's pinned node."""
        node.lock_ref -= 1
        if node is not self.root and not node.lock_ref and not node.children:
            self._push(node)

    def engine_checkpoint(self, keys, weights, pages: int, *, priority: int, inserted: int,
                          locked: TreeNode, prompt_pages: Optional[int] = None) -> TreeNode:
        """SGLang's ``RadixCache.checkpoint``: insert the request's first ``pages`` pages,
        with ``prompt_pages`` re-insert the prompt at ``priority + 1`` (it splits the leaf at
        the prompt's end), match the key again and move the pin from ``locked`` to the new
        last node, which is returned.  One hit is counted on each engine node of the insert
        that ends past ``inserted`` pages (what this request inserted before)."""
        keys, weights = cut_units(keys, weights, pages)
        root = self.root
        if not keys:
            new_last = root
        else:
            new_last = self._engine_insert(keys, weights, priority, inserted)
            if prompt_pages is not None and 0 < prompt_pages < pages:
                pk, pw = cut_units(keys, weights, prompt_pages)
                self._engine_insert(pk, pw, priority + 1, prompt_pages)
            _, new_last, _, _ = self._engine_walk(keys, weights)
        locked.lock_ref -= 1
        new_last.lock_ref += 1
        if locked is not root and not locked.lock_ref and not locked.children:
            self._push(locked)
        return new_last

    def _engine_insert(self, keys, weights, priority: int, inserted: int) -> TreeNode:
        """SGLang's ``_insert_helper`` (one clock read for the path, a split where the key
        ends or diverges inside an engine node, one new engine node for the rest)."""
        root = self.root
        k, last, u, lo = self._engine_walk(keys, weights)
        # hits and priorities on the path, per engine node: a node counts when it ends past
        # what this request inserted before
        node = last
        seg_end = last.depth
        seg = last.seg
        while node is not root:
            if node.seg != seg:
                seg, seg_end = node.seg, node.depth
            if seg_end > inserted:
                node.hit_count += 1
            if priority > node.priority:
                node.priority = priority
            node = node.parent
        end = last
        if u < len(keys):
            end = self._grow_segment(last, keys, weights, u, lo, priority,
                                     hit_count=lambda e: 1 if e.depth > inserted else 0)
        if self.policy.wants_touch and end is not root:
            # the plugin's hooked cache reports every insert's pages to the policy (on_request)
            self._touch(keys, k, self._clock, end)
        if end is not root and not end.children and not end.lock_ref:
            self._push(end)
        return end

    def _serve_engine(self, keys, weights, priority) -> int:
        """One request as SGLang's RadixCache serves it (see the module docstring)."""
        root = self.root
        policy = self.policy
        # ---- match_prefix: stamp the matched path; split the engine node it ends in
        k, last, u, lo = self._engine_walk(keys, weights)
        # ---- pin the match, evict until the new pages fit
        last.lock_ref += 1
        total = len(keys) if weights is None else sum(weights)
        cap = self.capacity
        if cap is not None:
            need = self.size + (total - k) - cap
            if need > 0:
                self.evict(need)
        # ---- insert: stamp the path again, one hit per node, priority upwards
        t = self._stamp()
        node = last
        while node is not root:
            node.last_access = t
            node.hit_count += 1
            if priority > node.priority:
                node.priority = priority
            node = node.parent
        end = last
        if u < len(keys):
            end = self._grow_segment(last, keys, weights, u, lo, priority)
        if policy.wants_touch:
            self._touch(keys, k, self._clock, end)
        if end is not root and not end.children:
            self._push(end)
        last.lock_ref -= 1
        return k

    def _grow_segment(self, last, keys, weights, u, lo, priority, hit_count=None):
        """Grow the keys from unit ``u`` below ``last`` as SGLang's insert does (a fresh access
        stamp, then a creation stamp), as one new segment; ``hit_count(end)``, when given, sets the
        new nodes' hit count.  The policy hears of the new nodes when it hooks them."""
        fresh = self._stamp()
        created = self._stamp()
        end = self._grow(last, keys, weights, u, lo, fresh, priority)
        self._segs += 1
        seg = self._segs
        hits = hit_count(end) if hit_count is not None else None
        node = end
        units = []
        while node is not last:
            node.seg = seg
            node.insert_time = created
            if hits is not None:
                node.hit_count = hits
            units.append(node)
            node = node.parent
        if self._node_hooks:
            units.reverse()
            self.policy.on_insert_engine_node(units)
        return end

    def _raise_priority(self, node, priority):
        while node is not self.root:
            if priority > node.priority:
                node.priority = priority
            node = node.parent

    def rekey_candidates(self) -> None:
        """The policy's keys changed for every node at once (``hit_density``'s new retention
        ages, a ghost policy's clock at ``evict()``): evaluate every candidate leaf's key
        afresh, dropping stale heap entries."""
        policy = self.policy
        shielded = self._shielded
        live = [e for e in self._heap if e[2].heap_seq == e[1] and not shielded(e[2])]
        rekey = getattr(policy, "rekey", None)
        if rekey is not None:          # the same keys as ``key``, computed in bulk
            heap = rekey(live)
        else:
            key = policy.key
            heap = [(key(e[2]), e[1], e[2]) for e in live]
        heapify(heap)
        self._heap = heap

    # ------------------------------------------------------------- inspection
    def iter_nodes(self) -> Iterator[TreeNode]:
        """All cached nodes (root excluded), parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def evictable_leaves(self) -> List[TreeNode]:
        return [n for n in self.iter_nodes() if not n.children and n.lock_ref == 0]

    def cached_pages(self) -> set:
        """``{(unit key, offset)}`` of every cached page (for tests; O(size))."""
        out = set()
        for node in self.iter_nodes():
            out.update((node.key, p) for p in range(node.lo, node.lo + node.weight))
        return out

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the structure is inconsistent (for tests)."""
        pages = 0
        locked = 0
        for node in self.iter_nodes():
            parent = node.parent
            assert node.parent is not None, "cached node without parent"
            assert parent.children.get(node.key) is node, "parent link broken"
            assert node.weight >= 1 and node.lo >= 0, "empty or negative run"
            assert node.depth == parent.depth + node.weight, "depth mismatch"
            if node.lo:
                assert parent.key == node.key and parent.lo + parent.weight == node.lo, \
                    "continuation run not below its unit's previous run"
            else:
                assert parent.key != node.key or parent is self.root, "key follows itself"
            pages += node.weight
            if node.lock_ref:
                locked += node.weight
                if parent is not self.root:
                    assert parent.lock_ref >= node.lock_ref, "lock not on ancestors"
        assert pages == self.size, f"size {self.size} != counted {pages}"
        assert locked == self.protected_size, f"protected {self.protected_size} != {locked}"

    def __len__(self) -> int:
        return self.size


# ---------------------------------------------------------------- page keys
def cut_units(keys, weights, pages: int):
    """The first ``pages`` pages of a request's units: ``(keys, weights)`` with the last unit
    shortened (a unit per page when ``weights`` is None)."""
    if pages <= 0:
        return [], (None if weights is None else [])
    if weights is None:
        return keys[:pages], None
    out_w = []
    total = 0
    for w in weights:
        if total + w >= pages:
            out_w.append(pages - total)
            return keys[:len(out_w)], out_w
        out_w.append(w)
        total += w
    return keys, weights


def chained_page_keys(tokens: Sequence[int], page_size: int, seed: int = 0) -> List[int]:
    """Chained hashes of the full pages of ``tokens``.

    Page ``j``'s key hashes page ``j-1``'s key together with the page's tokens, so equal
    keys mean equal prefixes (up to hash collisions).  A trailing partial page is dropped,
    as the reference engine page-aligns keys before matching or inserting.  The hash is
    BLAKE2b over a fixed byte encoding, so keys are the same in every process (Python's own
    ``hash`` of strings changes with ``PYTHONHASHSEED``, which would make a persistent
    storage tier miss across runs).  Keys are 63-bit ints.
    """
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    out = []
    prev = hashlib.blake2b(b"sglang-hydra-page/" + str(int(seed)).encode(), digest_size=8).digest()
    full = len(tokens) - len(tokens) % page_size
    for start in range(0, full, page_size):
        h = hashlib.blake2b(prev, digest_size=8)
        h.update(",".join(str(int(t)) for t in tokens[start:start + page_size]).encode())
        prev = h.digest()
        out.append(int.from_bytes(prev, "little") >> 1)
    return out


def block_page_keys(hash_ids: Sequence[int], input_length: int, page_size: int,
                    block_size: int = 512) -> List[int]:
    """Page keys for a trace request whose prompt is described by ``block_size`` blocks.

    * ``page_size == block_size``: the block ids themselves.
    * ``page_size`` divides ``block_size``: block ``b`` splits into sub-pages keyed
      ``b * (block_size // page_size) + sub``; the last (partial) block only yields the
      pages its tokens occupy.
    * ``page_size`` a multiple of ``block_size``: consecutive blocks are grouped and a
      page is keyed by the id of its last block (which names the whole prefix).
    """
    if page_size == block_size:
        return list(hash_ids)
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    if block_size % page_size == 0:
        per = block_size // page_size
        out = []
        nb = len(hash_ids)
        for j, b in enumerate(hash_ids):
            base = b * per
            if j == nb - 1:
                tokens = input_length - block_size * j
                m = -(-tokens // page_size) if tokens > 0 else per
                m = min(m, per)
            else:
                m = per
            out.extend(range(base, base + m))
        return out
    if page_size % block_size == 0:
        per = page_size // block_size
        nb = len(hash_ids)
        return [hash_ids[min(j + per, nb) - 1] for j in range(0, nb, per)]
    raise ValueError(
        f"page_size {page_size} must divide or be a multiple of the trace block size {block_size}")



def block_page_weights(hash_ids: Sequence[int], input_length: int, page_size: int,
                       block_size: int = 512) -> List[int]:
    """Pages per trace block when ``page_size`` divides ``block_size`` (weighted API).

    Every block holds ``block_size // page_size`` pages except the last, which holds
    ``ceil(tokens / page_size)`` for the tokens it carries; this is the same page count
    as :func:`block_page_keys` yields per block.
    """
    if page_size <= 0 or block_size % page_size:
        raise ValueError(f"page_size {page_size} must divide the trace block size {block_size}")
    per = block_size // page_size
    nb = len(hash_ids)
    if nb == 0:
        return []
    out = [per] * nb
    tokens = input_length - block_size * (nb - 1)
    m = -(-tokens // page_size) if tokens > 0 else per
    out[-1] = min(m, per)
    return out
