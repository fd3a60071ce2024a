"""Our eviction policies inside SGLang: a general plugin of the ``sglang.srt.plugins`` group.

With sglang-hydra installed next to SGLang 0.5.23, the engine's plugin loader (run at
start-up in every process) finds the entry point ``hydra_eviction_policies`` in this
package's metadata and calls :func:`register`, which

* adds each policy name to ``--radix-eviction-policy``'s choices
  (``add_radix_eviction_policy_choices``),
* adds its strategy class (``get_priority(node)``, the engine's strategy interface) to the
  table the engine builds strategies from, so ``RadixCache`` and the Python
  ``UnifiedRadixCache`` tree core use it, and
* routes a cache that uses one of these policies to the Python tree core: the default
  Rust core only knows the built-in policies by name.

This module imports nothing but the standard library at import time and SGLang inside
:func:`register`: a server's environment need not have Hydra, omegaconf or the rest of
sglang-hydra's dependencies.  ``SGLANG_PLUGINS=hydra_eviction_policies`` loads only this
plugin.  The replay computes the same keys (``sglang_hydra.cache.policies``); the engine
differential (tests/cache/test_engine_radix_differential.py) checks the hits agree.
"""
from __future__ import annotations

#: Entry-point name (``SGLANG_PLUGINS`` filters on it).
PLUGIN_NAME = "hydra_eviction_policies"

#: Policies this plugin adds to SGLang, with their keyword parameters and defaults.
PLUGIN_POLICIES = {
    "span_lru": {"alpha": 1.0},
}

_registered = False


def _check_alpha(alpha):
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
        raise ValueError(f"span_lru: 'alpha' must be a number >= 0, got {alpha!r}")
    return float(alpha)


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

    return {"span_lru": SpanLRUStrategy}


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
    from sglang.srt.mem_cache import utils as mem_cache_utils
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    classes = strategy_classes()
    new = [name for name in classes if name not in RADIX_EVICTION_POLICY_CHOICES]
    if new:
        add_radix_eviction_policy_choices(new)
    for name, cls in classes.items():
        mem_cache_utils._EVICTION_POLICY_FACTORIES.setdefault(name, cls)
    HookRegistry.register(
        "sglang.srt.mem_cache.unified_cache.tree_core_registry.resolve_tree_core_backend",
        _python_core_for_our_policies,
        HookType.AROUND,
    )
    _registered = True


__all__ = ["PLUGIN_NAME", "PLUGIN_POLICIES", "register", "strategy_classes"]
