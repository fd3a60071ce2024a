"""Replay requests through the reference engine's own radix cache and print the hit lengths.

Runs inside the reference virtual environment (SGLang 0.5.23); it never imports
sglang_hydra.  The request loop is the one ``cache_semantics=sglang`` models
(``sglang_hydra/cache/radix.py``): match the prefix, pin its last node, evict until the
new pages fit the capacity, insert the prompt, unpin.

Input on stdin, one JSON object::

    {"requests": [[page id, ...], ...], "priorities": [int, ...] | null,
     "load_plugins": false,
     "runs": [{"policy": "lru", "policy_config": {...} | null, "page_tokens": 2,
               "capacity_pages": 1000, "clock": "logical" | "monotonic",
               "cache": "radix" | "server", "model_shape": {"is_hybrid_swa": false, ...}}, ...]}

Page ids are non-negative ints; page ``p`` becomes ``page_tokens`` token ids
``p * page_tokens + t``, and the engine runs with ``page_size = page_tokens``.  The
engine stamps nodes with ``time.monotonic()``; ``clock=logical`` replaces the radix
module's clock with a counter (one tick per call) so that the order of stamps is the
order of the calls, whatever the machine's timer resolution.  ``load_plugins`` runs the
engine's plugin loader first (entry points in ``sglang.srt.plugins``), which is how a
server finds an eviction policy shipped by a plugin.  ``cache=radix`` (the default) builds
SGLang's ``RadixCache`` directly; ``cache=server`` builds whatever a server would for these
arguments (``create_tree_cache`` after the server's arguments are parsed and published):
``UnifiedRadixCache`` for tlru, the plugin's hooked ``RadixCache`` for ghost_lru.

A run with ``"loop": "scheduler"`` instead takes trace requests, ``{"requests": [{"hash_ids":
[...], "input_length": n, "output_length": m, "priority": p}, ...]}``, builds their token ids
(each 512-token block from a generator seeded by its hash; the output from one seeded by the
prompt) and calls SGLang's ``RadixCache`` as its scheduler does, one request at a time
(``_run_scheduler``; run keys ``page_size``, ``pool_tokens``, ``chunk_tokens``); its ``hits`` are
cached tokens per request.

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

    def __init__(self, size=0):
        self.size = size          # tokens, as a real allocator's (the plugin sizes its ghost table by it)
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


_TINY_MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
               "num_key_value_heads": 2, "num_attention_heads": 4, "head_dim": 64, "hidden_size": 256,
               "intermediate_size": 1024, "vocab_size": 32000, "max_position_embeddings": 4096,
               "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5}


def _server_cache(spec, allocator):
    """The cache a server builds for ``--radix-eviction-policy <policy>`` (and its config):
    the server's arguments parsed and published as ``launch_server`` does, then the engine's
    own ``create_tree_cache`` (its default chain, the registered backends and what plugins
    hooked into them).  The model is a tiny stand-in ``config.json``: the cache never
    reads it."""
    import os
    import tempfile

    from sglang.srt.mem_cache import registry
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import prepare_server_args

    with tempfile.TemporaryDirectory(prefix="engine-radix-oracle-") as model:
        with open(os.path.join(model, "config.json"), "w", encoding="utf-8") as f:
            json.dump(_TINY_MODEL, f)
        argv = ["--model-path", model, "--device", "cpu", "--skip-tokenizer-init",
                "--page-size", str(int(spec["page_tokens"])), "--radix-eviction-policy", spec["policy"]]
        if spec.get("policy_config"):
            argv += ["--radix-eviction-policy-config", json.dumps(spec["policy_config"])]
        args = prepare_server_args(argv)
        args.resolve_once()
    get_context().set_server_args(args)
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                             page_size=int(spec["page_tokens"]), eviction_policy=spec["policy"],
                             eviction_policy_config=spec.get("policy_config") or None)
    shape = dict(is_hybrid_swa=False, is_hybrid_ssm=False, enable_hierarchical_cache=False)
    shape.update(spec.get("model_shape") or {})     # e.g. {"is_hybrid_swa": true}: a hybrid model
    ctx = registry.TreeCacheBuildContext(server_args=args, params=params, disable_radix_cache=False,
                                         tp_worker=None, model_config=None, tp_size=1, tp_rank=0,
                                         tp_group=None, **shape)
    return registry.create_tree_cache(ctx)


def _run(run, requests, priorities):
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    per = int(run["page_tokens"])
    cap = int(run["capacity_pages"]) * per
    allocator = _CountingAllocator(cap)
    if run.get("cache", "radix") == "server":
        if run.get("clock", "logical") == "logical":
            from sglang.srt.mem_cache import radix_cache
            from sglang.srt.mem_cache.unified_cache import unified_tree_core

            _logical_clock(radix_cache)
            _logical_clock(unified_tree_core)
        cache = _server_cache(run, allocator)
    else:
        cache = _radix_cache(run, allocator)
    hits = []
    for i, pages in enumerate(requests):
        tokens = array("q", [p * per + t for p in pages for t in range(per)])
        match = cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=tokens, extra_key=None)))
        hit = match.device_prefix_len
        node = match.last_device_node
        lock = cache.lock(node)
        need = cache.evictable_size() + cache.protected_size() + len(tokens) - hit - cap
        if need > 0:
            cache.evict(EvictParams(num_tokens=need))
        prio = priorities[i] if priorities else 0
        cache.insert(InsertParams(key=RadixKey(token_ids=tokens, extra_key=None), priority=prio))
        cache.unlock(lock)
        hits.append(hit // per)
    strategy = getattr(cache, "eviction_strategy", None)
    core = getattr(cache, "tree_core", None)
    return {"hits": hits, "evicted_tokens": allocator.freed, "cache_class": type(cache).__name__,
            "tree_core": type(core).__name__ if core is not None else None,
            "policy_class": type(strategy).__name__ if strategy is not None else None}


# ------------------------------------------------------------------ the scheduler's loop
def block_tokens(hash_id: int, block_size: int = 512):
    """The token ids of one trace block: a generator seeded by the block's hash (what a real
    client sends), so blocks with the same hash share their tokens."""
    import random

    rng = random.Random(int(hash_id))
    return [rng.randrange(1, 32000) for _ in range(block_size)]


def prompt_tokens(hash_ids, length: int, block_size: int = 512, memo=None):
    out = []
    for h in hash_ids:
        toks = memo.get(h) if memo is not None else None
        if toks is None:
            toks = block_tokens(h, block_size)
            if memo is not None:
                if len(memo) > 20000:      # bounded: a whole trace's blocks would not fit in memory
                    memo.clear()
                memo[h] = toks
        out.extend(toks)
    return out[:length]


def output_tokens(hash_ids, length: int, n: int):
    """A deterministic engine's answer: the same prompt gives the same tokens (greedy)."""
    import random

    rng = random.Random(repr((tuple(hash_ids), int(length))))
    return [rng.randrange(1, 32000) for _ in range(n)]


def _run_scheduler(run, requests):
    """Requests one at a time through SGLang's own RadixCache, called as SGLang 0.5.23's
    scheduler calls it (``touch_waiting_prefix`` every 32nd scheduling call for lru,
    ``init_next_round_input``'s match capped at len-1 tokens, ``alloc_for_extend`` per chunk
    with its one-page over-estimate, ``checkpoint`` after every chunk and after the prefill,
    ``alloc_for_decode`` per decode step, ``release_kv_cache(checkpoint=True)`` at finish),
    with a page-exact pool of ``pool_tokens``.  Returns the cached tokens of each request."""
    from array import array
    from types import SimpleNamespace

    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    ps = int(run["page_size"])
    pool_pages = int(run["pool_tokens"]) // ps
    chunk = run.get("chunk_tokens")
    allocator = _CountingAllocator(pool_pages * ps)
    spec = dict(run, page_tokens=ps)
    if run.get("cache", "radix") == "server":
        from sglang.srt.mem_cache import radix_cache

        _logical_clock(radix_cache)
        cache = _server_cache(spec, allocator)
    else:
        cache = _radix_cache(spec, allocator)
    lru = run["policy"].lower() == "lru"
    state = {"private": 0, "next": 1}

    def tree_tokens():
        return cache.evictable_size() + cache.protected_size()

    def evict_for(tokens):
        available = pool_pages * ps - tree_tokens() - state["private"] * ps
        if tokens > available:
            cache.evict_for_alloc(EvictParams(num_tokens=tokens - available))

    def hold(req, tokens):
        before = -(-req.kv.committed // ps)
        req.kv.committed += tokens
        state["private"] += -(-req.kv.committed // ps) - before
        row = req.row
        start = req.kv.filled
        row[0, start:req.kv.committed] = torch.arange(state["next"], state["next"] + req.kv.committed - start)
        state["next"] += req.kv.committed - start
        req.kv.filled = req.kv.committed

    def checkpoint(req, up_to):
        before = req.kv.cache_protected_len
        cache.checkpoint(req, up_to=up_to)
        state["private"] -= (req.kv.cache_protected_len - before) // ps

    memo = {}
    calls = 0
    hits = []
    for r in requests:
        L, n = int(r["input_length"]), max(1, int(r["output_length"]))
        prompt = prompt_tokens(r["hash_ids"], L, memo=memo)
        fill = array("q", prompt + output_tokens(r["hash_ids"], L, n))
        row = torch.zeros((1, L + n + ps), dtype=torch.int64)
        req = SimpleNamespace(
            kv=SimpleNamespace(req_pool_idx=0, cache_inserted_len=0, cache_protected_len=0, swa_evict_floor=0,
                               committed=0, filled=0),
            full_untruncated_fill_ids=fill, origin_input_ids=array("q", prompt), extra_key=None, cache_salt=None,
            priority=int(r.get("priority") or 0), lock=None, last_node=None, row=row)
        cache.req_to_token_pool = SimpleNamespace(
            req_to_token=row, write=lambda idx, values, row=row: row.__setitem__(idx, values))
        if lru:                       # SchedulePolicy._touch_waiting_prefixes
            if calls % 32 == 0:
                cache.touch_prefix(RadixKey(token_ids=array("q", prompt), extra_key=None))
            calls += 1
        match = cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=array("q", prompt), extra_key=None,
                                                                  limit=L - 1)))
        prefix = match.device_prefix_len
        hits.append(prefix)
        node = match.last_device_node
        req.lock = cache.lock(node)
        req.last_node = node
        if prefix:
            row[0, :prefix] = cache.path_device_indices(node)[:prefix]
        req.kv.committed = req.kv.filled = prefix
        req.kv.cache_protected_len = prefix
        while req.kv.committed < L:                 # prefill, chunk by chunk
            step = L - req.kv.committed if not chunk else min(int(chunk), L - req.kv.committed)
            evict_for(step + (ps if ps > 1 else 0))
            hold(req, step)
            if req.kv.committed < L:
                checkpoint(req, req.kv.committed)
        if n > 1:
            checkpoint(req, L)
            for _ in range(n - 1):                  # decode steps
                if ps > 1 and req.kv.committed % ps == 0:
                    evict_for(ps)                   # check_decode_mem: the pages the step starts
                evict_for(ps if ps > 1 else 1)      # alloc_for_decode: one page per request
                hold(req, 1)
        req.finished = lambda: True              # release_kv_cache(checkpoint=True)
        checkpoint(req, req.kv.committed)
        state["private"] -= -(-req.kv.committed // ps) - req.kv.cache_protected_len // ps
        cache.unlock(req.lock)
        req.lock = None
    return {"hits": hits, "evicted_tokens": allocator.freed, "cache_class": type(cache).__name__,
            "policy_class": type(getattr(cache, "eviction_strategy", None)).__name__}


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
            if run.get("loop") == "scheduler":
                outcomes.append(_run_scheduler(run, spec["requests"]))
            else:
                outcomes.append(_run(run, spec["requests"], spec.get("priorities")))
        except Exception as exc:  # noqa: BLE001 - one outcome per run
            outcomes.append({"error": f"{type(exc).__name__}: {exc}"})
            status = 1
    json.dump({"runs": outcomes}, real_stdout)
    real_stdout.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
