"""Replay requests through the reference engine's own radix cache and print the hit lengths.

Runs inside the reference virtual environment (SGLang 0.5.23); it never imports
sglang_hydra.  The request loop is the one ``cache_semantics=sglang`` models
(``sglang_hydra/cache/radix.py``): match the prefix, pin its last node, evict until the
new pages fit the capacity, insert the prompt, unpin.

Input on stdin, one JSON object::

    {"requests": [[page id, ...], ...], "priorities": [int, ...] | null,
     "load_plugins": false,
     "runs": [{"policy": "lru", "policy_config": {...} | null, "page_tokens": 2,
               "capacity_pages": 1000, "clock": "logical" | "monotonic"}, ...]}

Page ids are non-negative ints; page ``p`` becomes ``page_tokens`` token ids
``p * page_tokens + t``, and the engine runs with ``page_size = page_tokens``.  The
engine stamps nodes with ``time.monotonic()``; ``clock=logical`` replaces the radix
module's clock with a counter (one tick per call) so that the order of stamps is the
order of the calls, whatever the machine's timer resolution.  ``load_plugins`` runs the
engine's plugin loader first (entry points in ``sglang.srt.plugins``), which is how a
server finds an eviction policy shipped by a plugin.

Output on stdout: ``{"runs": [{"hits": [pages per request], "evicted_tokens": n,
"policy_class": "<strategy class>"} | {"error": "..."}, ...]}`` (exit status 1 when a
run failed).
"""
from __future__ import annotations

import itertools
import json
import logging
import sys
import time
import types
import warnings


class _CountingAllocator:
    """What the radix cache needs of a KV allocator when it only simulates: a device
    and somewhere to give freed pages back."""

    device = "cpu"

    def __init__(self):
        self.freed = 0

    def free_segment(self, value, start_pos=0):
        self.freed += len(value)

    def free(self, value):
        self.freed += len(value)


def _logical_clock(module):
    ticks = itertools.count(1)
    module.time = types.SimpleNamespace(monotonic=lambda: float(next(ticks)),
                                        perf_counter=time.perf_counter, time=time.time)


def _radix_cache(spec, allocator):
    from sglang.srt.mem_cache import radix_cache
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    if spec.get("clock", "logical") == "logical":
        _logical_clock(radix_cache)
    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=allocator,
                             page_size=int(spec["page_tokens"]),
                             eviction_policy=spec["policy"],
                             eviction_policy_config=spec.get("policy_config") or None)
    return radix_cache.RadixCache(params)


def _run(run, requests, priorities):
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    allocator = _CountingAllocator()
    cache = _radix_cache(run, allocator)
    per = int(run["page_tokens"])
    cap = int(run["capacity_pages"]) * per
    hits = []
    for i, pages in enumerate(requests):
        tokens = array("q", [p * per + t for p in pages for t in range(per)])
        match = cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=tokens, extra_key=None)))
        hit = match.device_prefix_len
        node = match.last_device_node
        cache.inc_lock_ref(node)
        need = cache.evictable_size() + cache.protected_size() + len(tokens) - hit - cap
        if need > 0:
            cache.evict(EvictParams(num_tokens=need))
        prio = priorities[i] if priorities else 0
        cache.insert(InsertParams(key=RadixKey(token_ids=tokens, extra_key=None), priority=prio))
        cache.dec_lock_ref(node)
        hits.append(hit // per)
    return {"hits": hits, "evicted_tokens": allocator.freed,
            "policy_class": type(cache.eviction_strategy).__name__}


def main() -> int:
    spec = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr          # the engine logs; stdout carries our JSON only
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    status = 0
    try:
        if spec.get("load_plugins"):
            from sglang.srt.plugins import load_plugins

            load_plugins()
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        json.dump({"error": f"{type(exc).__name__}: {exc}"}, real_stdout)
        real_stdout.write("\n")
        return 1
    outcomes = []
    for run in spec["runs"]:
        try:
            outcomes.append(_run(run, spec["requests"], spec.get("priorities")))
        except Exception as exc:  # noqa: BLE001 - one outcome per run
            outcomes.append({"error": f"{type(exc).__name__}: {exc}"})
            status = 1
    json.dump({"runs": outcomes}, real_stdout)
    real_stdout.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
