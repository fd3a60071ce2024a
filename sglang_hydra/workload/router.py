"""Where a request goes: across servers (``sglang-router``) and inside one server (its DP controller).

**Inside a server** with ``parallel.dp_size`` N, SGLang 0.5.23's data-parallel controller picks a
replica by ``parallel.load_balance_method``: ``round_robin`` (a counter), ``total_requests`` (the
replica with the fewest running + waiting requests), ``total_tokens`` (the fewest KV tokens in use
plus queued prompt tokens, ties by requests; the chosen replica's figures grow by the request at
once), ``follow_bootstrap_room`` (the router's random 63-bit bootstrap room modulo N, i.e. uniform
at random) and ``auto`` (``follow_bootstrap_room`` on a PD prefill server, ``round_robin``
otherwise).  The controller reads its replicas' load snapshots; here they are exact at dispatch.

**Across servers** (``deploy.workers`` aggregated servers, or each side of ``deploy=pd``),
``deploy.router_policy`` as sglang-router does it: ``random``; ``round_robin``; ``power_of_two``
(two distinct servers at random, the one with fewer requests in flight); ``cache_aware`` (the
router's default): the load is the requests in flight per server; when the loads are imbalanced
(max - min > ``balance_abs_threshold`` 64 and max > ``balance_rel_threshold`` 1.5 x min) the least
loaded server takes it; otherwise the server whose approximate prefix tree matches the largest share
of the prompt takes it if that share exceeds ``cache_threshold`` 0.3, else the server with the
smallest tree.  The chosen server's tree then holds the prompt.  Every ``eviction_interval`` (120 s)
each tree is cut, least recently used first, to ``max_tree_size`` (67,108,864 characters; the router
counts characters, here 4 per token).  Defaults are sglang-router's; its tree is of text, here of the
trace's 512-token prefix blocks.
"""
from __future__ import annotations

import random
from typing import Dict, List, Optional, Sequence

__all__ = ["LOAD_BALANCE_METHODS", "ROUTER_POLICIES", "DataParallelDispatcher", "Router",
           "CACHE_AWARE_DEFAULTS", "effective_load_balance"]

LOAD_BALANCE_METHODS = ("auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens")
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
CACHE_AWARE_DEFAULTS = {"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5,
                        "eviction_interval_s": 120.0, "max_tree_size_chars": 67_108_864}
CHARS_PER_TOKEN = 4
BLOCK_TOKENS = 512


def effective_load_balance(method: Optional[str], role: str) -> str:
    """``auto`` (or unset) as SGLang resolves it for a server of this role."""
    if not method or method == "auto":
        return "follow_bootstrap_room" if role == "prefill" else "round_robin"
    if method not in LOAD_BALANCE_METHODS:
        raise ValueError(f"parallel.load_balance_method={method!r}; allowed: {', '.join(LOAD_BALANCE_METHODS)}")
    return method


class DataParallelDispatcher:
    """One server's DP controller over its replicas (engines)."""

    def __init__(self, engines: Sequence, method: str, rng: random.Random):
        self.engines = list(engines)
        self.method = method
        self.rng = rng
        self._rr = 0

    def pick(self, s):
        engines = self.engines
        if len(engines) == 1:
            return engines[0]
        m = self.method
        if m == "round_robin":
            e = engines[self._rr % len(engines)]
            self._rr += 1
            return e
        if m == "follow_bootstrap_room":
            return engines[self.rng.getrandbits(63) % len(engines)]
        if m == "total_requests":
            return min(engines, key=lambda e: e.num_requests)
        # total_tokens, ties by requests
        return min(engines, key=lambda e: (e.num_tokens, e.num_requests))


class Router:
    """sglang-router's choice among servers (each server: a list of engines)."""

    def __init__(self, n: int, policy: str, rng: random.Random, **cache_aware):
        if policy not in ROUTER_POLICIES:
            raise ValueError(f"deploy.router_policy={policy!r} is not modelled; allowed: {', '.join(ROUTER_POLICIES)}")
        self.n = n
        self.policy = policy
        self.rng = rng
        self.in_flight = [0] * n
        self._rr = 0
        cfg = dict(CACHE_AWARE_DEFAULTS)
        cfg.update({k: v for k, v in cache_aware.items() if v is not None})
        self.cfg = cfg
        self.trees: List[Dict[int, float]] = [dict() for _ in range(n)]
        self._next_eviction = cfg["eviction_interval_s"]
        self.cache_routed = 0
        self.balance_routed = 0

    def pick(self, s, now: float) -> int:
        n = self.n
        if n == 1:
            i = 0
        elif self.policy == "round_robin":
            i = self._rr % n
            self._rr += 1
        elif self.policy == "random":
            i = self.rng.randrange(n)
        elif self.policy == "power_of_two":
            a, b = self.rng.sample(range(n), 2)
            i = a if self.in_flight[a] <= self.in_flight[b] else b
        else:
            i = self._cache_aware(s, now)
        self.in_flight[i] += 1
        return i

    def done(self, i: int) -> None:
        self.in_flight[i] -= 1

    def _cache_aware(self, s, now: float) -> int:
        cfg = self.cfg
        if now >= self._next_eviction:
            self._evict(now)
        loads = self.in_flight
        hi, lo = max(loads), min(loads)
        blocks = s.hash_ids
        if hi - lo > cfg["balance_abs_threshold"] and hi > cfg["balance_rel_threshold"] * lo:
            i = loads.index(lo)
            self.balance_routed += 1
        else:
            best, best_len = 0, -1
            for j, tree in enumerate(self.trees):
                k = 0
                for h in blocks:
                    if h not in tree:
                        break
                    k += 1
                if k > best_len:
                    best, best_len = j, k
            matched = min(best_len * BLOCK_TOKENS, s.input_len)
            ratio = matched / s.input_len if s.input_len else 0.0
            if ratio > cfg["cache_threshold"]:
                i = best
                self.cache_routed += 1
            else:
                i = min(range(self.n), key=lambda j: len(self.trees[j]))
        tree = self.trees[i]
        for h in blocks:
            tree[h] = now
        return i

    def _evict(self, now: float) -> None:
        cfg = self.cfg
        cap_blocks = max(1, int(cfg["max_tree_size_chars"] // (CHARS_PER_TOKEN * BLOCK_TOKENS)))
        for j, tree in enumerate(self.trees):
            if len(tree) > cap_blocks:
                # the newest cap_blocks blocks, oldest first (a stable sort: ties keep the tree's order)
                keep = sorted(tree, key=tree.__getitem__)[len(tree) - cap_blocks:]
                self.trees[j] = {h: tree[h] for h in keep}
        interval = cfg["eviction_interval_s"]
        while self._next_eviction <= now:
            self._next_eviction += interval
