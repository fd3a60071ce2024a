#!/usr/bin/env python
"""Cost per request and hits of the two cache semantics (rules / sglang) on the conversation trace.

For each policy and semantics: the median process CPU time of ``replay()`` over ``--repeat`` runs
(trace already parsed), as microseconds per request and as a ratio to LRU under the same
semantics in the same run, and the hit blocks at ``--blocks``.

    .venv/bin/python scripts/bench_engine_semantics.py [--repeat 3] [--blocks 4000] [--policies lru,ghost_lfu]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_hydra.config.testing import make_record  # noqa: E402
from sglang_hydra.workload import load_trace, replay  # noqa: E402
from sglang_hydra.workload.trace import trace_path  # noqa: E402

POLICIES = ("lru", "span_lru", "ghost_lru", "ghost_lfu", "auto_ghost_lfu")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=4000)
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="comma-separated; the first is the baseline of the ratios")
    args = ap.parse_args()
    policies = args.policies.split(",")
    trace = load_trace(trace_path("conversation"))
    rec = make_record(page_size=512, max_total_tokens=args.blocks * 512)
    print(f"conversation trace, {len(trace)} requests, {args.blocks} blocks, median of {args.repeat} "
          "(process CPU time; the policies take turns within each repeat, so a load change on a "
          "shared machine hits them alike)")
    print(f"{'semantics':<9} {'policy':<15} {'hit blocks':>10} {'us/request':>11} {'x LRU':>6}")
    for semantics in ("rules", "sglang"):
        times = {p: [] for p in policies}
        hits = {}
        for _ in range(args.repeat):
            for policy in policies:
                t0 = time.process_time()
                res = replay(rec, trace, policy=policy, cache_semantics=semantics)
                times[policy].append(time.process_time() - t0)
                hits[policy] = res.hit_blocks
        base = statistics.median(times[policies[0]])
        for policy in policies:
            t = statistics.median(times[policy])
            print(f"{semantics:<9} {policy:<15} {hits[policy]:>10} {t / len(trace) * 1e6:>11.1f} "
                  f"{t / base:>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
