"""A page-granular radix (prefix) tree for KV-cache simulation.

Every node stands for exactly one page of a prompt.  A page is identified by a *page key*
that already names the whole prefix up to and including that page: either a hash id taken
from a trace (Mooncake traces guarantee that an id always has the same parent) or the
chained hash produced by :func:`chained_page_keys`.  Children are looked up in a plain
dict per node, so matching a prompt costs one dict probe per page and there are no
per-token objects anywhere.

Eviction follows the reference engine: only *leaves* (cached nodes without cached
children) are removed, nodes with a positive ``lock_ref`` are never removed, and the leaf
with the smallest policy key goes first.  Candidate leaves live in a binary heap with lazy
invalidation: an entry is ``(key, seq, node)`` and is only honoured when ``seq`` is still
the node's latest push and the node is still a cached, childless leaf.  A leaf is pushed
when it appears (insertion, or its last child was evicted) and again whenever a request
touches it, so the heap always holds one current entry per evictable leaf.

Capacity is counted in pages.  ``size`` never exceeds ``capacity`` after :meth:`serve`
returns unless every cached page is locked.
"""
from __future__ import annotations

from heapq import heappop, heappush
from typing import Hashable, Iterable, Iterator, List, Optional, Sequence, Tuple

__all__ = [
    "TreeNode",
    "RadixTree",
    "MatchResult",
    "chained_page_keys",
    "block_page_keys",
]


class TreeNode:
    """One cached page.

    ``parent`` is ``None`` once the node has been evicted (the root's parent is also
    ``None``; the root is never evicted).  ``depth`` is the 0-based page position in the
    prompt.  ``aux`` belongs to the eviction policy (e.g. Belady's next use).
    """

    __slots__ = (
        "key", "parent", "children", "depth", "lock_ref", "last_access", "hit_count",
        "insert_time", "priority", "hw", "aux", "hseq",
    )

    def __init__(self, key, parent, depth, clock):
        self.key = key
        self.parent = parent
        self.children = {}
        self.depth = depth
        self.lock_ref = 0
        self.last_access = clock
        self.hit_count = 1
        self.insert_time = clock
        self.priority = 0
        self.hw = 0
        self.aux = None
        self.hseq = 0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def cached(self) -> bool:
        return self.parent is not None

    def path_keys(self) -> List[Hashable]:
        """Keys from the root's first child down to this node."""
        out = []
        node = self
        while node.parent is not None:
            out.append(node.key)
            node = node.parent
        out.reverse()
        return out

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return (f"TreeNode(key={self.key!r}, depth={self.depth}, lock_ref={self.lock_ref}, "
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


class RadixTree:
    """Prefix tree of pages with lock references and policy-driven leaf eviction.

    Parameters
    ----------
    capacity:
        Maximum number of cached pages (``None`` = unbounded).
    policy:
        An :class:`~sglang_hydra.cache.policies.EvictionPolicy` instance (default LRU).
    """

    def __init__(self, capacity: Optional[int] = None, policy=None):
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
        self.protected_size = 0    # cached pages with lock_ref > 0
        self.evictions = 0
        self._heap: list = []
        self._seq = 0
        self._clock = 0
        policy.bind(self)

    # ------------------------------------------------------------------ helpers
    @property
    def evictable_size(self) -> int:
        return self.size - self.protected_size

    def _tick(self, clock):
        if clock is None:
            self._clock += 1
            return self._clock
        self._clock = clock
        return clock

    def _push(self, node: TreeNode) -> None:
        self._seq += 1
        node.hseq = self._seq
        heappush(self._heap, (self.policy.key(node), self._seq, node))

    # ------------------------------------------------------------- public API
    def match_prefix(self, page_keys: Sequence[Hashable], clock=None) -> MatchResult:
        """Longest cached prefix of ``page_keys``; touches the matched pages.

        Matched pages get ``last_access = clock`` and ``hit_count += 1``.  Nothing is
        inserted or evicted.
        """
        clock = self._tick(clock)
        node = self.root
        children = node.children
        k = 0
        for key in page_keys:
            child = children.get(key)
            if child is None:
                break
            child.last_access = clock
            child.hit_count += 1
            node = child
            children = child.children
            k += 1
        if k:
            if self.policy.wants_touch:
                self.policy.on_touch(page_keys[:k], k, clock, node)
            if not children:
                self._push(node)
        return MatchResult(k, node)

    def insert(self, page_keys: Sequence[Hashable], clock=None, priority: int = 0) -> MatchResult:
        """Insert ``page_keys``; returns ``(pages that were already cached, last node)``.

        Existing pages on the path are not touched by ``insert`` (call
        :meth:`match_prefix` first for hit accounting).  New pages get
        ``insert_time = last_access = clock`` and ``hit_count = 1``.  Insertion may leave
        the tree above capacity; call :meth:`evict` (or use :meth:`serve`).
        """
        clock = self._tick(clock)
        node = self.root
        k = 0
        n = len(page_keys)
        while k < n:
            child = node.children.get(page_keys[k])
            if child is None:
                break
            if priority > child.priority:
                child.priority = priority
            node = child
            k += 1
        if k < n:
            node = self._grow(node, page_keys, k, clock, priority)
            self._push(node)
        return MatchResult(k, node)

    def _grow(self, node, page_keys, start, clock, priority):
        policy_insert = self.policy.on_insert
        depth = node.depth
        for j in range(start, len(page_keys)):
            depth += 1
            child = TreeNode(page_keys[j], node, depth, clock)
            if priority:
                child.priority = priority
            node.children[child.key] = child
            policy_insert(child)
            node = child
        self.size += len(page_keys) - start
        return node

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Protect ``node`` and its ancestors; returns the change in evictable pages."""
        delta = 0
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                delta -= 1
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
                delta += 1
                if not node.children and node.parent is not None:
                    self._push(node)
            node = node.parent
        self.protected_size -= delta
        return delta

    def evict(self, num_pages: int) -> int:
        """Evict at least ``num_pages`` pages if possible; returns pages evicted."""
        if num_pages <= 0:
            return 0
        heap = self._heap
        root = self.root
        policy = self.policy
        on_evict = policy.on_evict if policy.wants_evict_hook else None
        key_of = policy.key
        held = []
        evicted = 0
        while evicted < num_pages and heap:
            entry = heappop(heap)
            node = entry[2]
            if node.hseq != entry[1] or node.children or node.parent is None:
                continue
            if node.lock_ref:
                held.append(entry)
                continue
            parent = node.parent
            del parent.children[node.key]
            node.parent = None
            evicted += 1
            if on_evict is not None:
                on_evict(node)
            if not parent.children and parent is not root:
                self._seq += 1
                parent.hseq = self._seq
                heappush(heap, (key_of(parent), self._seq, parent))
        for entry in held:
            heappush(heap, entry)
        self.size -= evicted
        self.evictions += evicted
        return evicted

    def serve(self, page_keys: Sequence[Hashable], clock=None, priority: int = 0) -> int:
        """One request, as the replay rules describe it; returns the hit length.

        Matches the longest cached prefix (touching it), inserts the rest, then evicts
        leaves until the tree fits its capacity while the request's own pages are pinned.
        """
        clock = self._tick(clock)
        node = self.root
        children = node.children
        k = 0
        for key in page_keys:
            child = children.get(key)
            if child is None:
                break
            child.last_access = clock
            child.hit_count += 1
            node = child
            children = child.children
            k += 1
        policy = self.policy
        if priority:
            self._raise_priority(node, priority)
        n = len(page_keys)
        if k < n:
            node = self._grow(node, page_keys, k, clock, priority)
            if policy.wants_touch:
                policy.on_touch(page_keys, k, clock, node)
            self._push(node)
        elif k:
            if policy.wants_touch:
                policy.on_touch(page_keys, k, clock, node)
            if not children:
                self._push(node)
        cap = self.capacity
        if cap is not None and self.size > cap:
            node.lock_ref += 1
            self.evict(self.size - cap)
            node.lock_ref -= 1
        return k

    def _raise_priority(self, node, priority):
        while node is not self.root:
            if priority > node.priority:
                node.priority = priority
            node = node.parent

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

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the structure is inconsistent (for tests)."""
        count = 0
        locked = 0
        for node in self.iter_nodes():
            count += 1
            assert node.parent is not None, "cached node without parent"
            assert node.parent.children.get(node.key) is node, "parent link broken"
            assert node.depth == node.parent.depth + 1, "depth mismatch"
            if node.lock_ref:
                locked += 1
                if node.parent is not self.root:
                    assert node.parent.lock_ref >= node.lock_ref, "lock not on ancestors"
        assert count == self.size, f"size {self.size} != counted {count}"
        assert locked == self.protected_size, f"protected {self.protected_size} != {locked}"

    def __len__(self) -> int:
        return self.size


# ---------------------------------------------------------------- page keys
def chained_page_keys(tokens: Sequence[int], page_size: int, seed: int = 0) -> List[int]:
    """Chained hashes of the full pages of ``tokens``.

    Page ``j``'s key hashes page ``j-1``'s key together with the page's tokens, so equal
    keys mean equal prefixes (up to hash collisions).  A trailing partial page is dropped,
    as the reference engine page-aligns keys before matching or inserting.  Python's hash
    of ints and tuples of ints is not randomised, so keys are stable across runs.
    """
    if page_size <= 0:
        raise ValueError(f"page_size must be positive, got {page_size}")
    out = []
    prev = hash((seed, "sglang-hydra-page"))
    full = len(tokens) - len(tokens) % page_size
    for start in range(0, full, page_size):
        prev = hash((prev, tuple(tokens[start:start + page_size])))
        out.append(prev)
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
