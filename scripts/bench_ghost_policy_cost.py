"""Replay cost of the ghost policies against LRU, under both cache semantics (issue 20).

Under ``cache_semantics=sglang`` a ghost policy re-evaluates every candidate leaf's key at
each eviction, as SGLang's RadixCache does with our engine plugin; this measures what that
costs in the replay.  Prints, per semantics, each policy's hit blocks and the median CPU time
of ``--repeat`` full replays of the conversation trace, and the ratio to LRU's median from the
same run.

    python scripts/bench_ghost_policy_cost.py [--capacity 4000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

from sglang_hydra.workload.replay import replay
from sglang_hydra.workload.trace import load_trace, trace_path


def one(reqs, policy, semantics, capacity_blocks):
    record = SimpleNamespace(page_size=512, max_total_tokens=capacity_blocks * 512, disable_radix_cache=False,
                             radix_eviction_policy=policy, radix_eviction_policy_config=None)
    t0 = time.process_time()
    res = replay(record, reqs, keep_per_request=True, cache_semantics=semantics)
    return time.process_time() - t0, sum(res.per_request_hit_pages)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=4000, help="device capacity in 512-token blocks")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    reqs = list(load_trace(trace_path("conversation")))
    for semantics in ("rules", "sglang"):
        base = None
        for policy in ("lru", "ghost_lru", "ghost_lfu"):
            runs = [one(reqs, policy, semantics, args.capacity) for _ in range(args.repeat)]
            med = statistics.median(t for t, _ in runs)
            base = base or med
            print(f"C={args.capacity} {semantics:6s} {policy:9s} hits {runs[0][1]:6d}  "
                  f"cpu median {med:.2f} s  ratio vs lru {med / base:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
