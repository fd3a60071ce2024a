#!/usr/bin/env python
"""Share of the LRU->Belady gap each online policy closes (512-token pages; rules semantics unless --semantics).

Workloads: the conversation trace (first half = where parameters were chosen, second half
= held out, and the whole trace) and synthetic traces of different reuse shapes
(``workload/synthetic.py``; seeds other than the ones the defaults were chosen on; no
parameter was tuned on any synthetic shape).
Share = (policy - LRU) / (Belady - LRU) in hit blocks; ``-`` where Belady equals LRU.

    .venv/bin/python scripts/bench_policy_gap.py [--policies ghost_lru,ghost_lfu,auto_ghost_lfu,hit_density]
        [--workloads conversation,synthetic-quick] [--semantics sglang]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_hydra.config.testing import make_record  # noqa: E402
from sglang_hydra.workload import load_trace, replay  # noqa: E402
from sglang_hydra.workload.synthetic import generate_conversations  # noqa: E402
from sglang_hydra.workload.trace import trace_path  # noqa: E402

CAPACITIES = (1000, 4000, 16000)
SHAPES = {
    # many long conversations, one shared system prompt
    "synthetic-long": dict(conversations=1500, min_turns=2, max_turns=12, user_tokens_mean=1500,
                           output_tokens_mean=400, system_prompt_tokens=2048, think_time_s=60, seed=101),
    # short sessions over many shared prefixes (a tool/agent-like shape)
    "synthetic-shared": dict(conversations=3000, min_turns=1, max_turns=3, user_tokens_mean=800,
                             output_tokens_mean=200, system_prompt_tokens=6000, prefix_groups=40,
                             think_time_s=10, seed=202),
    # fast users: the next turn comes within seconds (re-reads come early, LRU's best case)
    "synthetic-quick": dict(conversations=1500, min_turns=2, max_turns=10, user_tokens_mean=1000,
                            output_tokens_mean=300, system_prompt_tokens=1024, think_time_s=3,
                            seed=303),
    # slow users over many concurrent conversations: re-reads come late, most after eviction
    "synthetic-slow": dict(conversations=2000, min_turns=1, max_turns=8, user_tokens_mean=1200,
                           output_tokens_mean=300, system_prompt_tokens=1024, arrival_rate=4.0,
                           think_time_s=600, seed=404),
}


def hits(reqs, policy, blocks, semantics="rules"):
    rec = make_record(page_size=512, max_total_tokens=blocks * 512)
    return replay(rec, reqs, policy=policy, cache_semantics=semantics).hit_blocks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="ghost_lru,ghost_lfu,auto_ghost_lfu,hit_density")
    ap.add_argument("--semantics", default="rules", choices=("rules", "sglang"),
                    help="cache semantics of every replay, Belady's included")
    ap.add_argument("--workloads", default="",
                    help="comma-separated prefixes of the workload names to run (default: all)")
    args = ap.parse_args()
    policies = args.policies.split(",")
    conv = list(load_trace(trace_path("conversation")))
    half = len(conv) // 2
    workloads = {"conversation (first half)": conv[:half], "conversation (held-out half)": conv[half:],
                 "conversation (whole)": conv}
    for name, cfg in SHAPES.items():
        if not args.workloads or any(name.startswith(w) for w in args.workloads.split(",")):
            workloads[name] = generate_conversations(**cfg)
    if args.workloads:
        wanted = args.workloads.split(",")
        workloads = {n: r for n, r in workloads.items() if any(n.startswith(w) for w in wanted)}
    print(f"{'workload':<30} {'blocks':>6} {'LRU':>7} {'Belady':>7} " + " ".join(f"{p:>16}" for p in policies))
    for name, reqs in workloads.items():
        for blocks in CAPACITIES:
            lru = hits(reqs, "lru", blocks, args.semantics)
            bel = hits(reqs, "belady", blocks, args.semantics)
            cells = []
            for p in policies:
                h = hits(reqs, p, blocks, args.semantics)
                share = f"{(h - lru) / (bel - lru):+.1%}" if bel > lru else "-"
                cells.append(f"{h:>8} {share:>7}")
            print(f"{name:<30} {blocks:>6} {lru:>7} {bel:>7} " + " ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
