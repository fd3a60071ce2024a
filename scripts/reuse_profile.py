#!/usr/bin/env python
"""What an online eviction policy can know about reuse on the conversation trace.

Prints, per half of the trace: P(a block is read again | read n times) (the signal that
frequency/ghost policies use), the gap in requests between a block's first and second
read (what a waiting-queue lookahead of the requests sharing one timestamp could see),
how often a block read for the first time is read again by its depth, by how much of its
request was already seen and by prompt length (features a server has), and the split of
an infinite cache's hits into second reads (of blocks read once so far,
which no online policy can tell apart from the 76 % never read again) and later reads.

    .venv/bin/python scripts/reuse_profile.py
"""
from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_hydra.workload import load_trace  # noqa: E402
from sglang_hydra.workload.trace import trace_path  # noqa: E402


EDGES = (1, 4, 16, 64, 256)


def _bucket(x):
    for e in EDGES:
        if x < e:
            return f"<{e}"
    return f">={EDGES[-1]}"


def _order(label):
    return int(label.lstrip("<>="))+ (0.5 if label.startswith(">") else 0)


def profile(name, reqs):
    reads = defaultdict(list)
    for i, r in enumerate(reqs):
        for h in r.hash_ids:
            reads[h].append(i)
    count = Counter(len(v) for v in reads.values())
    print(f"{name}: {len(reqs)} requests, {sum(len(v) for v in reads.values())} block reads, "
          f"{len(reads)} distinct blocks")
    probs = []
    for n in range(1, 6):
        at_least = sum(c for k, c in count.items() if k >= n)
        more = sum(c for k, c in count.items() if k >= n + 1)
        probs.append(f"n={n}: {more / at_least:.2f}")
    print("  P(read again | read n times): " + ", ".join(probs))
    gaps = sorted(v[1] - v[0] for v in reads.values() if len(v) > 1)
    qs = ", ".join(f"{int(q * 100)} %: {gaps[int(q * (len(gaps) - 1))]}" for q in (0.1, 0.25, 0.5, 0.75, 0.9))
    print(f"  requests between first and second read (quantiles): {qs}")
    per_tick = Counter(Counter(r.timestamp for r in reqs).values())
    mean_tick = sum(k * c for k, c in per_tick.items()) / sum(per_tick.values())
    within = sum(1 for g in gaps if g <= mean_tick)
    print(f"  requests per timestamp (a real queue): {mean_tick:.1f} on average; second reads within "
          f"that distance: {within} of {len(gaps)}")
    by_feature = {"depth (block index)": defaultdict(lambda: [0, 0]),
                  "request's blocks already seen": defaultdict(lambda: [0, 0]),
                  "prompt length (blocks)": defaultdict(lambda: [0, 0])}
    seen = set()
    for r in reqs:
        ids = r.hash_ids
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        for j, h in enumerate(ids):
            if h in seen:
                continue
            seen.add(h)
            again = len(reads[h]) > 1
            for feature, x in (("depth (block index)", j), ("request's blocks already seen", k),
                               ("prompt length (blocks)", len(ids))):
                cell = by_feature[feature][_bucket(x)]
                cell[0] += 1
                cell[1] += again
    for feature, cells in by_feature.items():
        shown = ", ".join(f"{b}: {a / n:.2f} ({n})" for b, (n, a) in sorted(cells.items(), key=lambda c: _order(c[0])))
        print(f"  P(new block read again) by {feature}: {shown}")
    second = sum(1 for v in reads.values() if len(v) >= 2)
    later = sum(len(v) - 2 for v in reads.values() if len(v) >= 3)
    print(f"  infinite-cache hits: {second + later} = {second} second reads + {later} later reads")


def main() -> int:
    conv = list(load_trace(trace_path("conversation")))
    half = len(conv) // 2
    profile("conversation (first half)", conv[:half])
    profile("conversation (held-out half)", conv[half:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
