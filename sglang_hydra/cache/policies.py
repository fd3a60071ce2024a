"""Eviction policies for :class:`~sglang_hydra.cache.radix.RadixTree`, and their registry.

A policy is a small class.  The tree asks it for a sortable ``key(node)`` whenever a leaf
becomes a candidate (smaller keys are evicted first) and, if the class sets the matching
flag, calls hooks when pages are inserted, when a request touches its chain and when a
page is evicted.  Built-in keys are packed into one Python ``int`` (``major << 40 | minor``)
because integer comparisons keep the heap fast; clocks therefore must stay below 2**40.

Each class lists its keyword parameters in ``PARAMS`` (name -> :class:`Param`), which is
what :func:`validate_policy_config` checks ``memory.radix_eviction_policy_config`` against.

Registering a policy with :func:`register_eviction_policy` also makes its name a legal
value of ``memory.radix_eviction_policy`` (through
``sglang_hydra.config.choices.add_radix_eviction_policy_choices``), unless it is
registered as replay-only (it needs knowledge of the future, like ``belady``) or as not
being a configuration choice (``fifo``, as in the reference engine).
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Type

from .hit_density_core import stable_hash
from .sglang_plugin import HOOKED_POLICIES, ghost_history

__all__ = [
    "Param",
    "EvictionPolicy",
    "PolicyInfo",
    "register_eviction_policy",
    "get_policy_info",
    "available_policies",
    "validate_policy_config",
    "make_policy",
    "LRUPolicy",
    "LFUPolicy",
    "FIFOPolicy",
    "SLRUPolicy",
    "PriorityPolicy",
    "TLRUPolicy",
    "BeladyPolicy",
    "GhostLRUPolicy",
    "GhostLFUPolicy",
    "AutoGhostLFUPolicy",
    "SpanLRUPolicy",
    "SGLANG_BUILTIN_POLICIES",
    "policy_needs_plugin",
    "policy_runs_in_sglang",
]

SHIFT = 40           # bits reserved for the tie-breaking part of packed keys
NEVER = 1 << 39      # "no next use" for Belady; larger than any request index


# ------------------------------------------------------------------- parameters
@dataclass(frozen=True)
class Param:
    """Declaration of one policy keyword argument.

    ``type`` is ``int`` or ``float`` (``float`` parameters accept ints); ``check`` returns
    True for acceptable values and ``constraint`` says in words what is acceptable.
    """

    type: type
    default: Any
    constraint: str = ""
    check: Optional[Callable[[Any], bool]] = None
    doc: str = ""

    def describe(self) -> str:
        kind = "an integer" if self.type is int else "a number"
        return f"{kind} {self.constraint}".strip()

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool):
            return False
        if self.type is int:
            if not isinstance(value, int):
                return False
        elif self.type is float:
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                return False
        elif not isinstance(value, self.type):
            return False
        return self.check is None or bool(self.check(value))


# --------------------------------------------------------------------- base class
class EvictionPolicy:
    """Base class.  Subclasses override :meth:`key` and, optionally, the hooks.

    Flags tell the tree which hooks to call so that unused ones cost nothing:
    ``wants_insert_hook`` (:meth:`on_insert` per new page), ``wants_touch``
    (:meth:`on_touch` once per served request), ``wants_evict_hook`` (:meth:`on_evict`).
    ``needs_future`` policies get :meth:`prepare` with every request's page keys before
    a replay starts.
    """

    name: str = "base"
    PARAMS: Mapping[str, Param] = {}
    wants_insert_hook = False
    wants_touch = False
    wants_evict_hook = False
    needs_future = False

    def __init__(self, page_size: int = 1, **params: Any):
        unknown = set(params) - set(self.PARAMS)
        if unknown:
            raise TypeError(f"{type(self).__name__} got unknown parameter(s): {sorted(unknown)}")
        self.page_size = page_size
        for pname, spec in self.PARAMS.items():
            setattr(self, pname, params.get(pname, spec.default))
        self.tree = None

    # configuration ------------------------------------------------------------
    @classmethod
    def check_config(cls, values: Mapping[str, Any]) -> List[str]:
        """Cross-parameter checks on the full set of values (defaults filled in)."""
        return []

    def params(self) -> Dict[str, Any]:
        return {p: getattr(self, p) for p in self.PARAMS}

    # tree protocol ------------------------------------------------------------
    def bind(self, tree) -> None:
        self.tree = tree

    def key(self, node) -> Any:
        raise NotImplementedError

    def on_insert(self, node) -> None:
        """A new page was created (its fields are initialised)."""

    def on_touch(self, page_keys: Sequence, k: int, clock: int, last_node) -> None:
        """A request with ``page_keys`` (first ``k`` were hits) now ends at ``last_node``."""

    def on_evict(self, node) -> None:
        """``node`` has just been removed from the tree."""

    def prepare(self, requests_page_keys: Sequence[Sequence]) -> None:
        """Offline policies see the whole workload here (clock = request index)."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"


# ----------------------------------------------------------------- built-ins
class LRUPolicy(EvictionPolicy):
    """Least recently used: key = last access."""

    name = "lru"

    def key(self, node):
        return node.last_access


class LFUPolicy(EvictionPolicy):
    """In-cache LFU: key = (hit count, last access); counts restart on re-insertion."""

    name = "lfu"

    def key(self, node):
        return (node.hit_count << SHIFT) + node.last_access


class FIFOPolicy(EvictionPolicy):
    """First in, first out: key = insertion time."""

    name = "fifo"

    def key(self, node):
        return node.insert_time


class PriorityPolicy(EvictionPolicy):
    """Lower request priority first, LRU within a priority."""

    name = "priority"

    def key(self, node):
        return (node.priority << SHIFT) + node.last_access


def _positive_int(v):
    return v >= 1


class SLRUPolicy(EvictionPolicy):
    """Segmented LRU: pages hit at least ``protected_threshold`` times sit behind the rest."""

    name = "slru"
    PARAMS = {
        "protected_threshold": Param(int, 2, ">= 1", _positive_int,
                                     "hit count from which a page is protected"),
    }

    def key(self, node):
        return ((1 if node.hit_count >= self.protected_threshold else 0) << SHIFT) + node.last_access


def _non_negative(v):
    return v >= 0


class TLRUPolicy(EvictionPolicy):
    """Tail-optimised LRU (Zhang et al., arXiv:2510.15152).

    A page is *TEL-safe* when the pages cached before it already cover what the branch's
    next turn needs to stay under the TTFT budget: with ``high_water`` the deepest length (pages)
    any request reached through the page, it is safe when
    ``depth * page_size >= max(high_water * page_size + next_prompt_estimate - threshold, 0)``.
    Safe pages are evicted first (LRU among them), then the rest in LRU order.
    ``threshold`` and ``next_prompt_estimate`` are in tokens, as the reference engine
    takes them (the paper and ``replay_rules.md`` state them in 512-token blocks).
    """

    name = "tlru"
    wants_touch = True
    PARAMS = {
        "threshold": Param(int, 0, ">= 0 (tokens)", _non_negative,
                           "TTFT budget expressed as uncached tokens"),
        "next_prompt_estimate": Param(int, 0, ">= 0 (tokens)", _non_negative,
                                      "expected length of the next user prompt"),
    }

    @classmethod
    def check_config(cls, values):
        if values["threshold"] <= values["next_prompt_estimate"]:
            return [
                "eviction policy 'tlru' needs 'threshold' greater than 'next_prompt_estimate' "
                f"(got {values['threshold']} <= {values['next_prompt_estimate']}); otherwise no "
                "page is ever TEL-safe and the policy is plain LRU"
            ]
        return []

    def bind(self, tree):
        super().bind(tree)
        self._slack = self.next_prompt_estimate - self.threshold
        if getattr(tree, "semantics", "rules") == "sglang":
            self.key = self._engine_key

    def _engine_key(self, node):
        """SGLang's T-LRU (``UnifiedRadixCache``): a node is safe when the pages cached
        before its whole engine node (segment), not before its last page, cover the budget."""
        seg = node.seg
        top = node
        parent = node.parent
        while parent is not None and parent.seg == seg and parent.parent is not None:
            top = parent
            parent = top.parent
        ps = self.page_size
        budget = node.high_water * ps + self._slack
        safe = (top.depth - top.weight + 1) * ps >= (budget if budget > 0 else 0)
        return (0 if safe else 1 << SHIFT) + node.last_access

    def on_touch(self, page_keys, k, clock, last_node):
        n = last_node.depth + 1
        node = last_node
        root = self.tree.root
        while node is not root:
            if node.high_water < n:
                node.high_water = n
            node = node.parent

    def key(self, node):
        ps = self.page_size
        budget = node.high_water * ps + self._slack
        safe = node.depth * ps >= (budget if budget > 0 else 0)
        return (0 if safe else 1 << SHIFT) + node.last_access


class BeladyPolicy(EvictionPolicy):
    """Offline optimum under the leaf/pin constraints: evict the leaf reused furthest ahead.

    Key = (-next_use, last_access); pages never used again share next_use = infinity and
    fall back to LRU.  Only usable in a replay, which calls :meth:`prepare` with the
    whole workload; the clock must be the request index.
    """

    name = "belady"
    wants_touch = True
    needs_future = True

    def prepare(self, requests_page_keys):
        nxt: List[List[int]] = [None] * len(requests_page_keys)  # type: ignore[list-item]
        seen: Dict[Any, int] = {}
        get = seen.get
        for i in range(len(requests_page_keys) - 1, -1, -1):
            keys = requests_page_keys[i]
            nxt[i] = [get(key, NEVER) for key in keys]
            for key in keys:
                seen[key] = i
        self._next = nxt

    def on_touch(self, page_keys, k, clock, last_node):
        nu = self._next[clock]
        node = last_node
        j = last_node.depth
        while j >= 0:
            node.next_use = nu[j]
            node = node.parent
            j -= 1

    def key(self, node):
        return ((NEVER - node.next_use) << SHIFT) + node.last_access


def _positive(v):
    return v > 0


def _unit_interval(v):
    return 0 < v <= 1


class GhostLRUPolicy(EvictionPolicy):
    """LRU in *virtual* time, with a bounded credit for pages that proved reusable.

    Most pages of a prefix-cache workload are read once (76 % of the blocks of the
    Mooncake conversation trace), so plain LRU spends its capacity on pages that will
    never be hit, while pages that were reused once are likely to be reused again.  The
    policy combines three ideas from the caching literature, adapted to a tree where only
    unpinned leaves can be evicted:

    * **ghost entries** (as in ARC / 2Q / S3-FIFO): when a page is evicted its key and hit
      count go into a bounded FIFO table of ``ghost_factor * capacity`` keys.  A page that
      is re-inserted while its ghost is remembered resumes its old count, so a reuse that
      arrived *after* eviction still proves the page's value.
    * **recency with a credit** (in the spirit of GreedyDual / LRFU): the eviction key is
      ``last_access + credit`` where ``credit = 0`` for pages seen once and ``credit =
      alpha * L`` for pages seen at least twice.  The credit is bounded, so pages that stop
      being used age out instead of squatting forever (in-cache LFU's failure at large
      capacities).
    * **self-tuning scale**: ``L`` is an exponential moving average (weight ``ewma``) of
      how long one-hit pages live between their last access and their eviction, i.e. the
      current probation lifetime.  A proven page therefore survives about ``1 + alpha``
      times as long as an unproven one, whatever the capacity or request rate.

    The clock is the tree's logical clock (the request index in a replay).

    Under ``cache_semantics=sglang`` the policy works as SGLang runs it through our engine
    plugin (:class:`~sglang_hydra.cache.sglang_plugin.GhostHistory`, shared with the
    plugin): one hit count per engine node (segment), a ghost entry per page, a new node
    resumes the largest count its pages left behind, the lifetime sample is taken per
    evicted node against the clock read when ``evict()`` starts, and every leaf's key is
    evaluated afresh when ``evict()`` starts (``engine_node_hooks``; ``radix.py``).
    """

    name = "ghost_lru"
    wants_insert_hook = True
    wants_evict_hook = True
    engine_node_hooks = False
    PARAMS = {
        "alpha": Param(float, 2.5, "> 0", _positive,
                       "credit of a reused page, in multiples of the one-hit page lifetime"),
        "ghost_factor": Param(float, 8.0, ">= 0", _non_negative,
                              "ghost table size as a multiple of the cache capacity"),
        "ewma": Param(float, 0.01, "in (0, 1]", _unit_interval,
                      "weight of each new sample in the lifetime average"),
    }

    def bind(self, tree):
        super().bind(tree)
        from collections import OrderedDict

        self._ghost = OrderedDict()
        cap = tree.capacity or 0
        self._ghost_cap = int(self.ghost_factor * cap)
        self._life = 0.0
        self._credit = 0.0
        if getattr(tree, "semantics", "rules") == "sglang" and self.name in HOOKED_POLICIES:
            self._engine_bind(cap)

    # ---- cache_semantics=sglang: the engine plugin's hooks, per engine node
    def _engine_bind(self, capacity):
        self.engine_node_hooks = True
        self.wants_insert_hook = self.wants_evict_hook = False
        self.history = ghost_history(self.name, self.params())
        self.history.bind(capacity)
        self._now = 0
        self.key = self._engine_key

    def evict_started(self, now):
        self._now = now

    @staticmethod
    def _pages(units):
        return [(n.key, p) for n in units for p in range(n.lo, n.lo + n.weight)]

    def on_insert_engine_node(self, units):
        """``units`` (top-down) form one new engine node; they share its hit count."""
        resumed = self.history.admit(self._pages(units))
        if resumed:
            for n in units:
                n.hit_count += resumed

    def on_evict_engine_node(self, units, bottom):
        self.history.forget(self._pages(units), bottom.hit_count, self._now - bottom.last_access)

    def _engine_key(self, node):
        return self.history.priority(node.hit_count, node.last_access)

    def rekey(self, entries):
        """``[(key(node), seq, node)]`` for heap entries ``(old key, seq, node)``: what
        :meth:`_engine_key` gives, with the credit computed once per hit count."""
        credit = self.history.credit
        memo = {}
        out = []
        for _, seq, node in entries:
            c = node.hit_count
            t = node.last_access
            if c > 1:
                cr = memo.get(c)
                if cr is None:
                    cr = memo[c] = credit(c)
                out.append(((t + cr, t), seq, node))
            else:
                out.append(((t + 0.0, t), seq, node))
        return out

    def on_insert(self, node):
        count = self._ghost.pop(node.key, None)
        if count is not None:
            node.hit_count = count + 1

    def on_evict(self, node):
        count = node.hit_count
        if self._ghost_cap:
            ghost = self._ghost
            ghost[node.key] = count
            if len(ghost) > self._ghost_cap:
                ghost.popitem(last=False)
        if count == 1:
            self._life += self.ewma * ((self.tree.now - node.last_access) - self._life)
            self._credit = self.alpha * self._life

    def key(self, node):
        if node.hit_count > 1:
            return node.last_access + self._credit
        return node.last_access

    @property
    def ghost_size(self) -> int:
        return len(self.history.ghost) if self.engine_node_hooks else len(self._ghost)


def _at_least_one(v):
    return v >= 1


class GhostLFUPolicy(GhostLRUPolicy):
    """``ghost_lru`` whose credit grows with the number of proven reuses, up to a cap.

    On the conversation trace's first half a block read once is read again with probability
    0.23, one read twice 0.42, three times 0.47, four times 0.57
    (``scripts/reuse_profile.py``): each reuse is more evidence.
    Key = ``last_access + alpha * L * min((hit_count - 1) ** beta, cap)`` with ``L`` the
    self-tuned one-hit lifetime of ``ghost_lru`` and hit counts remembered across evictions
    by the same ghost table.  ``beta < 1`` and ``cap`` keep the credit bounded so that pages
    which stop being read still age out (in-cache LFU's failure at large capacities).
    """

    name = "ghost_lfu"
    PARAMS = {
        "alpha": Param(float, 2.0, "> 0", _positive,
                       "credit of a page reused once, in multiples of the one-hit page lifetime"),
        "beta": Param(float, 0.5, ">= 0", _non_negative,
                      "exponent of the reuse count in the credit (0 = ghost_lru)"),
        "cap": Param(float, 8.0, ">= 1", _at_least_one,
                     "largest credit multiplier, whatever the reuse count"),
        "ghost_factor": Param(float, 8.0, ">= 0", _non_negative,
                              "ghost table size as a multiple of the cache capacity"),
        "ewma": Param(float, 0.01, "in (0, 1]", _unit_interval,
                      "weight of each new sample in the lifetime average"),
    }

    def key(self, node):
        c = node.hit_count
        if c > 1:
            m = (c - 1) ** self.beta
            return node.last_access + self.alpha * self._life * (m if m < self.cap else self.cap)
        return node.last_access


class _MiniCache:
    """A flat, sampled stand-in for the cache (SHARDS-style miniature simulation) that
    runs the ``ghost_lfu`` key with one fixed ``alpha`` and counts its hits."""

    __slots__ = ("alpha", "beta", "cap", "capacity", "ghost_cap", "ewma", "pages", "heap",
                 "ghost", "life", "hits", "seq")

    def __init__(self, alpha, beta, cap, capacity, ghost_cap, ewma):
        from collections import OrderedDict

        self.alpha, self.beta, self.cap, self.ewma = alpha, beta, cap, ewma
        self.capacity, self.ghost_cap = capacity, ghost_cap
        self.pages = {}          # key -> [count, last access, seq]
        self.heap = []
        self.ghost = OrderedDict()
        self.life = 0.0
        self.hits = 0.0
        self.seq = 0

    def _push(self, key, entry):
        count, last = entry[0], entry[1]
        prio = last
        if count > 1 and self.alpha:
            m = (count - 1) ** self.beta
            prio = last + self.alpha * self.life * (m if m < self.cap else self.cap)
        self.seq += 1
        entry[2] = self.seq
        heappush(self.heap, (prio, self.seq, key))

    def access(self, key, now):
        entry = self.pages.get(key)
        if entry is not None:
            self.hits += 1
            entry[0] += 1
            entry[1] = now
            self._push(key, entry)
            return
        entry = [self.ghost.pop(key, 0) + 1, now, 0]
        self.pages[key] = entry
        self._push(key, entry)
        if len(self.pages) > self.capacity:
            self._evict(now)

    def _evict(self, now):
        pages, heap = self.pages, self.heap
        while len(pages) > self.capacity:
            _, seq, key = heappop(heap)
            entry = pages.get(key)
            if entry is None or entry[2] != seq:
                continue
            del pages[key]
            if self.ghost_cap:
                self.ghost[key] = entry[0]
                if len(self.ghost) > self.ghost_cap:
                    self.ghost.popitem(last=False)
            if entry[0] == 1:
                self.life += self.ewma * ((now - entry[1]) - self.life)


class AutoGhostLFUPolicy(GhostLFUPolicy):
    """``ghost_lfu`` whose ``alpha`` is chosen online by miniature simulations.

    How much credit proven pages deserve depends on the workload and the capacity: on the
    conversation trace a large credit helps at 1-4k blocks and hurts at 16k, and on a trace
    whose reuse LRU already captures any credit hurts.  So the policy samples one page key
    in ``sample`` (by hash, so a sampled page is always sampled) and replays the sampled
    references through flat miniature caches of ``capacity / sample`` pages, one per
    candidate ``alpha`` (0 = plain LRU).  Every ``epoch`` requests it adopts the candidate
    with the most (exponentially decayed) miniature hits; ``alpha`` is the value used
    before the first choice.  Only past references are used.
    """

    name = "auto_ghost_lfu"
    wants_touch = True
    CANDIDATES = (0.0, 1.0, 2.0, 4.0, 8.0)
    DECAY = 0.9          # per epoch: the choice looks back about ten epochs
    PARAMS = dict(GhostLFUPolicy.PARAMS)
    PARAMS.update({
        "alpha": Param(float, 2.0, ">= 0", _non_negative,
                       "credit used until the first choice (0 = start as LRU)"),
        "sample": Param(int, 4, ">= 1", _positive_int,
                        "one page key in this many feeds the miniature caches"),
        "epoch": Param(int, 200, ">= 1", _positive_int,
                       "requests between two choices of alpha"),
    })

    def bind(self, tree):
        super().bind(tree)
        cap = tree.capacity or 0
        mini = max(1, cap // self.sample)
        self._minis = [_MiniCache(a, self.beta, self.cap, mini, int(self.ghost_factor * mini), self.ewma)
                       for a in self.CANDIDATES] if cap else []
        self._accesses = [m.access for m in self._minis]
        self._requests = 0
        self._scores = [0.0] * len(self._minis)

    def on_touch(self, page_keys, k, clock, last_node):
        minis = self._minis
        if not minis:
            return
        s = self.sample
        accesses = self._accesses
        for key in page_keys:
            h = (key * 0x9E3779B1) >> 7 if type(key) is int else stable_hash(key)
            if h % s == 0:
                for access in accesses:
                    access(key, clock)
        self._requests += 1
        if self._requests % self.epoch == 0:
            scores = self._scores
            for i, m in enumerate(minis):
                scores[i] = self.DECAY * scores[i] + m.hits
                m.hits = 0.0
            best = max(range(len(scores)), key=scores.__getitem__)
            self.alpha = minis[best].alpha

    def key(self, node):
        if not self.alpha:
            return node.last_access
        return super().key(node)


class SpanLRUPolicy(EvictionPolicy):
    """LRU with a credit for proven reuse, computable by the engine from its own node stamps.

    Key = ``(last_access + alpha * (last_access - insert_time), last_access)``: a node
    read once (``last_access == insert_time``) is plain LRU, a node that kept being read
    over a span of time survives ``alpha`` times that span longer.  It needs no hooks and
    no clock unit (seconds on a server, logical ticks in the replay), which is what lets
    the engine plugin (:mod:`sglang_hydra.cache.sglang_plugin`, where the same key is the
    strategy's ``get_priority``) give the replay's hits.
    """

    name = "span_lru"
    PARAMS = {
        "alpha": Param(float, 1.0, ">= 0", _non_negative,
                       "credit per unit of observed reuse span"),
    }

    def key(self, node):
        t = node.last_access
        return (t + self.alpha * (t - node.insert_time), t)


# ------------------------------------------------------- what SGLang can run
#: ``--radix-eviction-policy`` choices of SGLang 0.5.23 itself.
SGLANG_BUILTIN_POLICIES = ("lru", "lfu", "slru", "priority", "tlru")


def policy_needs_plugin(name: str) -> bool:
    """True when SGLang accepts ``name`` only with sglang-hydra's engine plugin installed
    (entry point ``sglang.srt.plugins``: ``hydra_eviction_policies``)."""
    from .sglang_plugin import PLUGIN_POLICIES

    return name in PLUGIN_POLICIES


def policy_runs_in_sglang(name: str) -> bool:
    """True when SGLang 0.5.23 can run ``name``, natively or through the plugin."""
    return name in SGLANG_BUILTIN_POLICIES or policy_needs_plugin(name)


# ------------------------------------------------------------------- registry
@dataclass(frozen=True)
class PolicyInfo:
    name: str
    cls: Type[EvictionPolicy]
    replay_only: bool
    config_choice: bool


_POLICIES: Dict[str, PolicyInfo] = {}

#: Built-in policies defined in their own module (which imports this one, so this one names it
#: instead of importing it); loaded before the registry is first read.
_POLICY_MODULES = ["hit_density"]


def _load_policy_modules() -> None:
    while _POLICY_MODULES:
        importlib.import_module(f"{__package__}.{_POLICY_MODULES.pop(0)}")


def register_eviction_policy(name: str, cls: Type[EvictionPolicy], *, replay_only: bool = False,
                             config_choice: Optional[bool] = None, replace: bool = False) -> None:
    """Make ``cls`` available under ``name``.

    Unless ``replay_only`` (or ``config_choice=False``), the name also becomes a legal
    value of ``memory.radix_eviction_policy`` in the config layer.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"policy names must be non-empty strings, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, EvictionPolicy)):
        raise TypeError(f"{cls!r} is not an EvictionPolicy subclass")
    if name in _POLICIES and not replace and _POLICIES[name].cls is not cls:
        raise ValueError(f"eviction policy {name!r} is already registered")
    if config_choice is None:
        config_choice = not replay_only
    if replay_only and config_choice:
        raise ValueError("a replay-only policy cannot be a configuration choice")
    _POLICIES[name] = PolicyInfo(name, cls, replay_only, config_choice)
    if config_choice:
        from sglang_hydra.config.choices import add_radix_eviction_policy_choices

        add_radix_eviction_policy_choices(name)


def get_policy_info(name: str) -> PolicyInfo:
    _load_policy_modules()
    try:
        return _POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; known policies: {', '.join(available_policies())}"
        ) from None


def available_policies(*, include_replay_only: bool = True) -> List[str]:
    _load_policy_modules()
    return [n for n, info in _POLICIES.items() if include_replay_only or not info.replay_only]


def _fill(cls: Type[EvictionPolicy], cfg: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    values = {p: spec.default for p, spec in cls.PARAMS.items()}
    if cfg:
        values.update(cfg)
    return values


def validate_policy_config(name: str, cfg: Optional[Mapping[str, Any]]) -> List[str]:
    """Error messages for ``memory.radix_eviction_policy_config`` under policy ``name``.

    Returns an empty list when the combination is fine.  ``None`` and ``{}`` mean
    "all defaults" (cross-parameter rules still apply, so ``tlru`` with no config is an
    error, as in the reference engine).
    """
    _load_policy_modules()
    info = _POLICIES.get(name)
    if info is None:
        return [f"unknown eviction policy {name!r}; known policies: "
                f"{', '.join(available_policies())}"]
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, Mapping):
        return [f"radix_eviction_policy_config must be a mapping of parameter names to values, "
                f"got {type(cfg).__name__}"]
    cls = info.cls
    errors: List[str] = []
    for key, value in cfg.items():
        spec = cls.PARAMS.get(key)
        if spec is None:
            accepted = (", ".join(repr(p) for p in cls.PARAMS)
                        if cls.PARAMS else "no parameters")
            errors.append(f"unknown key {key!r} in radix_eviction_policy_config for eviction "
                          f"policy {name!r} (it accepts {accepted})")
        elif not spec.accepts(value):
            errors.append(f"parameter {key!r} of eviction policy {name!r} must be "
                          f"{spec.describe()}, got {value!r}")
    if not errors:
        errors.extend(cls.check_config(_fill(cls, cfg)))
    return errors


def make_policy(name: str, config: Optional[Mapping[str, Any]] = None, *,
                page_size: int = 1) -> EvictionPolicy:
    """Validate ``config`` and build a fresh policy instance for one tree."""
    errors = validate_policy_config(name, config)
    if errors:
        raise ValueError("; ".join(errors))
    info = _POLICIES[name]
    return info.cls(page_size=page_size, **dict(config or {}))


register_eviction_policy("lru", LRUPolicy)
register_eviction_policy("lfu", LFUPolicy)
register_eviction_policy("fifo", FIFOPolicy, config_choice=False)
register_eviction_policy("slru", SLRUPolicy)
register_eviction_policy("priority", PriorityPolicy)
register_eviction_policy("tlru", TLRUPolicy)
register_eviction_policy("belady", BeladyPolicy, replay_only=True)
register_eviction_policy("ghost_lru", GhostLRUPolicy)
register_eviction_policy("ghost_lfu", GhostLFUPolicy)
register_eviction_policy("auto_ghost_lfu", AutoGhostLFUPolicy)
register_eviction_policy("span_lru", SpanLRUPolicy)


def _tell_config_what_sglang_runs() -> None:
    from sglang_hydra.config.choices import set_engine_policy_support

    from .sglang_plugin import PLUGIN_NAME, PLUGIN_POLICIES

    set_engine_policy_support(SGLANG_BUILTIN_POLICIES, PLUGIN_POLICIES, PLUGIN_NAME, HOOKED_POLICIES)


_tell_config_what_sglang_runs()
