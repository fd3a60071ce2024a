"""Our eviction policies inside SGLang: a general plugin of the ``sglang.srt.plugins`` group.

With sglang-hydra installed next to SGLang 0.5.23, the engine's plugin loader (run at
start-up in every process) finds the entry point ``hydra_eviction_policies`` in this
package's metadata and calls :func:`register`, which

* adds each policy name to ``--radix-eviction-policy``'s choices
  (``add_radix_eviction_policy_choices``),
* adds its strategy class (``get_priority(node)``, the engine's strategy interface) to the
  table the engine builds strategies from, so ``RadixCache`` and the Python
  ``UnifiedRadixCache`` tree core use it,
* routes a cache that uses one of the key-only policies (``span_lru``) to the Python tree
  core: the default Rust core only knows the built-in policies by name, and
* for the policies that need to see insertions and evictions or every request's pages
  (:data:`HOOKED_POLICIES`: ``ghost_lru``, ``ghost_lfu``, ``hit_density``) registers the radix-cache backend
  :data:`BACKEND_NAME` (``--radix-cache-backend hydra_hooks``, SGLang's
  ``register_radix_cache_backend``) and makes the engine's default cache choice pick it
  whenever such a policy is selected, so ``--radix-eviction-policy ghost_lru`` alone is
  enough.  The backend is SGLang's own ``RadixCache`` with four hooks (see
  :func:`hooked_radix_cache_class`).

A hooked policy is a strategy with ``engine_node_hooks = True`` and four methods:
``bind(capacity_pages)`` once, ``evict_started(now)`` when ``evict()`` starts (``now``
read from the radix cache's own clock), ``on_insert(node, pages)`` when an insert creates a
node (``pages``: one stable id per page of the node, chained over the prefix), and
``on_evict(node, pages)`` when eviction deletes one; ``get_priority(node)`` as usual.  A
strategy with ``wants_requests = True`` also gets ``on_request(pages, now)`` after each
insert: the pages of the whole request, root first, and the insert's last clock stamp; one
with ``wants_evict_clock = False`` is not given (and the cache does not read) the clock at
``evict()``.
Adding such a class to :func:`strategy_classes` and its name to :data:`PLUGIN_POLICIES`
and :data:`HOOKED_POLICIES` is all a further policy needs.  The replay's
``cache_semantics=sglang`` drives the same :class:`GhostHistory` at the same points
(``sglang_hydra/cache/radix.py``), and ``hit_density``'s replay policy the same
:class:`~sglang_hydra.cache.hit_density_core.HitDensityCore` (a standard-library-only
sibling module, the one relative import here), which is what makes the engine differential
(tests/cache/test_engine_radix_differential.py) show identical hits.

This module imports nothing but the standard library (and its std-lib-only sibling
``hit_density_core``) at import time and SGLang inside
:func:`register`: a server's environment need not have Hydra, omegaconf or the rest of
sglang-hydra's dependencies.  Importing it loads no other project module but the two package
``__init__`` files (lazy) and the config layer's std-lib-only registry, where the package only
leaves its deferred registration (tests/cache/test_sglang_plugin.py checks the module set in a
fresh interpreter).  ``SGLANG_PLUGINS=hydra_eviction_policies`` loads only this
plugin.
"""
from __future__ import annotations

from collections import OrderedDict

from .hit_density_core import HIT_DENSITY_DEFAULTS, hit_density_core

#: Entry-point name (``SGLANG_PLUGINS`` filters on it).
PLUGIN_NAME = "hydra_eviction_policies"

#: Policies this plugin adds to SGLang, with their keyword parameters and defaults.
PLUGIN_POLICIES = {
    "span_lru": {"alpha": 1.0},
    "ghost_lru": {"alpha": 2.5, "ghost_factor": 8.0, "ewma": 0.01},
    "ghost_lfu": {"alpha": 2.0, "beta": 0.5, "cap": 8.0, "ghost_factor": 8.0, "ewma": 0.01},
    "hit_density": dict(HIT_DENSITY_DEFAULTS),
}

#: Policies that need insert/evict hooks, hence the radix-cache backend below.
HOOKED_POLICIES = ("ghost_lru", "ghost_lfu", "hit_density")

#: ``--radix-cache-backend`` name of the hooked ``RadixCache``.
BACKEND_NAME = "hydra_hooks"

_registered = False


def _check_alpha(alpha):
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
        raise ValueError(f"span_lru: 'alpha' must be a number >= 0, got {alpha!r}")
    return float(alpha)


def _number(policy, name, value, ok, allowed):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"{policy}: {name!r} must be {allowed}, got {value!r}")
    return float(value)


class GhostHistory:
    """The state of ``ghost_lru`` / ``ghost_lfu`` at the engine's granularity: one radix
    node (a run of pages) is inserted, counted and evicted at once.

    * a bounded FIFO *ghost* table remembers the hit count of evicted pages
      (``ghost_factor`` x capacity pages); a new node resumes the largest count any of
      its pages left behind;
    * ``life`` is an exponential moving average (weight ``ewma``) of how long nodes read
      once stayed idle before eviction;
    * a node read at least twice gets a credit of ``alpha * life`` (``ghost_lru``), scaled
      by ``min((hits - 1) ** beta, cap)`` (``ghost_lfu``), on top of its last access.

    The engine strategy and the replay's ``cache_semantics=sglang`` both run this class,
    with the same calls in the same order."""

    __slots__ = ("alpha", "beta", "cap", "ghost_factor", "ewma", "ghost", "ghost_cap", "life")

    def __init__(self, alpha, ghost_factor, ewma, beta=0.0, cap=1.0):
        self.alpha, self.beta, self.cap = alpha, beta, cap
        self.ghost_factor, self.ewma = ghost_factor, ewma
        self.ghost = OrderedDict()
        self.ghost_cap = 0
        self.life = 0.0

    def bind(self, capacity_pages) -> None:
        self.ghost_cap = int(self.ghost_factor * (capacity_pages or 0))

    def admit(self, pages) -> int:
        """A node with these pages was inserted: the hits it resumes (0 if none)."""
        pop = self.ghost.pop
        best = 0
        for page in pages:
            c = pop(page, 0)
            if c > best:
                best = c
        return best

    def forget(self, pages, count, idle) -> None:
        """A node with these pages and ``count`` hits was evicted after ``idle`` time units."""
        cap = self.ghost_cap
        if cap:
            ghost = self.ghost
            for page in pages:
                ghost[page] = count
            while len(ghost) > cap:
                ghost.popitem(last=False)
        if count == 1:
            self.life += self.ewma * (idle - self.life)

    def credit(self, count) -> float:
        if count <= 1:
            return 0.0
        if not self.beta:
            return self.alpha * self.life
        m = (count - 1) ** self.beta
        return self.alpha * self.life * (m if m < self.cap else self.cap)

    def priority(self, count, last_access):
        """Smaller goes first; ties on the first element fall back to recency."""
        return (last_access + self.credit(count), last_access)


def ghost_history(name, params) -> GhostHistory:
    """A checked :class:`GhostHistory` for policy ``name`` (``ghost_lru``/``ghost_lfu``)."""
    v = dict(PLUGIN_POLICIES[name])
    unknown = set(params) - set(v)
    if unknown:
        raise ValueError(f"{name}: unknown parameter(s) {sorted(unknown)}; it takes {sorted(v)}")
    v.update(params)
    alpha = _number(name, "alpha", v["alpha"], lambda x: x > 0, "a number > 0")
    ghost_factor = _number(name, "ghost_factor", v["ghost_factor"], lambda x: x >= 0, "a number >= 0")
    ewma = _number(name, "ewma", v["ewma"], lambda x: 0 < x <= 1, "a number in (0, 1]")
    if name == "ghost_lru":
        return GhostHistory(alpha, ghost_factor, ewma)
    beta = _number(name, "beta", v["beta"], lambda x: x >= 0, "a number >= 0")
    cap = _number(name, "cap", v["cap"], lambda x: x >= 1, "a number >= 1")
    return GhostHistory(alpha, ghost_factor, ewma, beta, cap)


def strategy_classes():
    """The strategy classes, built on the engine's ``EvictionStrategy`` base."""
    from sglang.srt.mem_cache.evict_policy import EvictionStrategy

    class SpanLRUStrategy(EvictionStrategy):
        """LRU with a credit for proven reuse: a node's age counts for less the longer it
        has been reused (``last_access + alpha * (last_access - creation)``); a node read
        once has no credit.  Unit-free: the same ``alpha`` in seconds or in logical ticks."""

        def __init__(self, alpha: float = PLUGIN_POLICIES["span_lru"]["alpha"]):
            self.alpha = _check_alpha(alpha)

        def get_priority(self, node):
            t = node.last_access_time
            return (t + self.alpha * (t - node.creation_time), t)

    class GhostStrategy(EvictionStrategy):
        """A :class:`GhostHistory` policy; needs the hooked radix cache (BACKEND_NAME)."""

        engine_node_hooks = True
        policy = ""

        def __init__(self, **params):
            self.history = ghost_history(self.policy, params)
            self._now = 0.0

        def bind(self, capacity_pages):
            self.history.bind(capacity_pages)

        def evict_started(self, now):
            self._now = now

        def on_insert(self, node, pages):
            node.hit_count += self.history.admit(pages)

        def on_evict(self, node, pages):
            self.history.forget(pages, node.hit_count, self._now - node.last_access_time)

        def get_priority(self, node):
            return self.history.priority(node.hit_count, node.last_access_time)

    class GhostLRUStrategy(GhostStrategy):
        """``ghost_lru``: a fixed credit ``alpha * life`` for nodes read twice or more."""

        policy = "ghost_lru"

    class GhostLFUStrategy(GhostStrategy):
        """``ghost_lfu``: the credit grows with the (ghost-remembered) hit count, capped."""

        policy = "ghost_lfu"

    class HitDensityStrategy(EvictionStrategy):
        """``hit_density``: a retention age per class of page, learned online
        (:class:`~sglang_hydra.cache.hit_density_core.HitDensityCore`, which the replay runs
        too).  Needs the hooked radix cache: it reads every request's pages after the insert
        (``on_request``).  The clock is the radix cache's own (``time.monotonic()``, whole
        seconds in a server), so ages and return gaps are in its units."""

        engine_node_hooks = True
        wants_requests = True
        wants_evict_clock = False      # its priorities need no clock read at evict()

        def __init__(self, **params):
            self.core = hit_density_core(params)

        def bind(self, capacity_pages):
            self.core.bind(capacity_pages)

        def evict_started(self, now):
            pass

        def on_insert(self, node, pages):
            pass

        def on_evict(self, node, pages):
            pass

        def on_request(self, pages, now):
            """An insert ended a request's pages (prefix order) at time ``now``."""
            self.core.touch(pages, int(now), len(pages))

        def get_priority(self, node):
            pages = getattr(node, "_hydra_pages", None) or (None,)
            above = pages[-2] if len(pages) > 1 else None
            t = node.last_access_time
            return (t + self.core.page_age(pages[-1], above), t)

    return {"span_lru": SpanLRUStrategy, "ghost_lru": GhostLRUStrategy, "ghost_lfu": GhostLFUStrategy,
            "hit_density": HitDensityStrategy}


def hooked_radix_cache_class():
    """SGLang's ``RadixCache`` with the hooks a hooked strategy needs.

    * ``_insert_helper``: a node the insert created gets its page ids (a chained hash of
      each page's tokens over the prefix, so a page has the same id whatever node holds it)
      and the strategy's ``on_insert``; ``_split_node`` divides the ids between the halves;
    * ``evict``: reads the radix cache's clock once and passes it to ``evict_started``
      (the engine then builds its heap, evaluating every leaf's priority, as always), unless
      the strategy sets ``wants_evict_clock = False``;
    * ``_delete_leaf``: the strategy's ``on_evict`` after the node left the tree;
    * ``insert``: for a strategy with ``wants_requests``, ``on_request`` with the pages of
      the path the insert ended on (the whole request) and the later of that node's
      access and creation stamps (the insert's last clock read: no extra one is taken).

    A strategy without ``engine_node_hooks`` makes it a plain ``RadixCache``."""
    from sglang.srt.mem_cache import radix_cache as rc

    class HydraHookedRadixCache(rc.RadixCache):
        def __init__(self, params):
            super().__init__(params)
            strategy = self.eviction_strategy
            self._hydra_hooks = strategy if getattr(strategy, "engine_node_hooks", False) else None
            if self._hydra_hooks is not None:
                allocator = self.token_to_kv_pool_allocator
                tokens = int(getattr(allocator, "size", 0) or 0)
                strategy.bind(tokens // max(1, self.page_size))

        def _page_ids(self, node):
            above = getattr(node.parent, "_hydra_pages", None)
            prev = above[-1] if above else hash(("sglang-hydra", node.key.extra_key, node.key.cache_salt))
            units = list(node.key)
            ps = self.page_size
            out = []
            for j in range(0, len(units), ps):
                prev = hash((prev, tuple(units[j:j + ps])))
                out.append(prev)
            return tuple(out)

        def _insert_helper(self, node, key, value, priority=0, inserted_len=0):
            prefix_len, last = super()._insert_helper(node, key, value, priority, inserted_len)
            hooks = getattr(self, "_hydra_hooks", None)
            if hooks is not None and last is not self.root_node and getattr(last, "_hydra_pages", None) is None:
                last._hydra_pages = self._page_ids(last)
                hooks.on_insert(last, last._hydra_pages)
            return prefix_len, last

        def _split_node(self, key, child, split_len):
            new_node = super()._split_node(key, child, split_len)
            pages = getattr(child, "_hydra_pages", None)
            if pages is not None:
                k = split_len // self.page_size
                new_node._hydra_pages, child._hydra_pages = pages[:k], pages[k:]
            return new_node

        def insert(self, params):
            result = super().insert(params)
            hooks = getattr(self, "_hydra_hooks", None)
            if hooks is not None and getattr(hooks, "wants_requests", False):
                last = result.last_device_node
                if last is not None and last is not self.root_node:
                    # the request's pages, root first; its clock: the insert's last stamp
                    # (the path's access time, or a new node's creation just after it)
                    runs = []
                    node = last
                    while node is not self.root_node and node is not None:
                        runs.append(getattr(node, "_hydra_pages", ()))
                        node = node.parent
                    pages = [p for run in reversed(runs) for p in run]
                    hooks.on_request(pages, max(last.last_access_time, last.creation_time))
            return result

        def evict(self, params):
            hooks = getattr(self, "_hydra_hooks", None)
            if (hooks is not None and not self.disable and params.num_tokens > 0
                    and getattr(hooks, "wants_evict_clock", True)):
                hooks.evict_started(rc.time.monotonic())
            return super().evict(params)

        def _delete_leaf(self, node):
            super()._delete_leaf(node)
            hooks = getattr(self, "_hydra_hooks", None)
            if hooks is not None:
                hooks.on_evict(node, getattr(node, "_hydra_pages", ()))

    return HydraHookedRadixCache


def _why_not_hooked(ctx):
    """Why the hooked radix cache cannot serve this engine (None: it can)."""
    from sglang.srt.runtime_context import get_memory

    mem = get_memory()
    reasons = []
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        reasons.append("a hybrid (sliding-window or state-space) model")
    if ctx.enable_hierarchical_cache or getattr(mem, "enable_hierarchical_cache", False):
        reasons.append("--enable-hierarchical-cache")
    for flag in ("enable_lmcache", "enable_flexkv", "enable_unified_cache_external_linker",
                 "enable_session_radix_cache"):
        if getattr(mem, flag, False):
            reasons.append("--" + flag.replace("_", "-"))
    return ", ".join(reasons) or None


def _hooked_cache_factory(ctx):
    """``--radix-cache-backend hydra_hooks``: the hooked ``RadixCache``."""
    if not ctx.disable_radix_cache:
        why = _why_not_hooked(ctx)
        if why:
            raise ValueError(f"--radix-eviction-policy {ctx.params.eviction_policy} (sglang-hydra's plugin) runs "
                             f"in SGLang's RadixCache only, which this server cannot use ({why})")
    return hooked_radix_cache_class()(ctx.params)


def _hooked_cache_for_our_policies(original, ctx, *args, **kwargs):
    """``default_radix_cache_factory`` hook: a hooked policy gets the hooked cache."""
    policy = str(getattr(ctx.params, "eviction_policy", "") or "").lower()
    if policy in HOOKED_POLICIES and not ctx.disable_radix_cache:
        return _hooked_cache_factory(ctx)
    return original(ctx, *args, **kwargs)


def _python_core_for_our_policies(original, name, params, *args, **kwargs):
    """``resolve_tree_core_backend`` hook: the Rust tree core cannot call a Python
    strategy, so a cache that uses one of our policies gets the Python core."""
    policy = str(getattr(params, "eviction_policy", "") or "").lower()
    if policy in PLUGIN_POLICIES:
        return "python"
    return original(name, params, *args, **kwargs)


def register() -> None:
    """Entry point: make our policies legal values of ``--radix-eviction-policy`` and
    usable by the engine's radix caches (idempotent)."""
    global _registered
    if _registered:
        return
    from sglang.srt.arg_groups.choices import (
        RADIX_EVICTION_POLICY_CHOICES,
        add_radix_eviction_policy_choices,
    )
    from sglang.srt.mem_cache import registry
    from sglang.srt.mem_cache import utils as mem_cache_utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    classes = strategy_classes()
    new = [name for name in classes if name not in RADIX_EVICTION_POLICY_CHOICES]
    if new:
        add_radix_eviction_policy_choices(new)
    for name, cls in classes.items():
        mem_cache_utils._EVICTION_POLICY_FACTORIES.setdefault(name, cls)
    if registry.get_radix_cache_factory(BACKEND_NAME) is None:
        registry.register_radix_cache_backend(BACKEND_NAME, _hooked_cache_factory)
    HookRegistry.register(
        "sglang.srt.mem_cache.unified_cache.tree_core_registry.resolve_tree_core_backend",
        _python_core_for_our_policies,
        HookType.AROUND,
    )
    HookRegistry.register(
        "sglang.srt.mem_cache.registry.default_radix_cache_factory",
        _hooked_cache_for_our_policies,
        HookType.AROUND,
    )
    _registered = True


__all__ = ["BACKEND_NAME", "GhostHistory", "HOOKED_POLICIES", "PLUGIN_NAME", "PLUGIN_POLICIES",
           "ghost_history", "hooked_radix_cache_class", "register", "strategy_classes"]
