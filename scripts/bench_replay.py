#!/usr/bin/env python
"""Benchmark metadata replays of the Mooncake conversation trace, one policy at a time.

Reports, per policy: median wall time of ``replay()`` over ``--repeat`` runs (trace
already parsed, interpreter start excluded), page lookups per second, and the block hit
rate at each capacity; then memory per cached page (tracemalloc) and ghost_lru's
first-half / second-half / full-trace figures with the share of the LRU->Belady gap it
closes.

    .venv/bin/python scripts/bench_replay.py [--trace PATH] [--repeat 5] [--blocks 4000]

``--job`` instead times the command a user runs (issue 28): ``sglang-hydra job=replay
model=llama3_1_8b hardware=h100_80gb job.trace=conversation schedule.max_total_tokens=<blocks x
512>`` (``--blocks``, default 16,000 here), as CPU seconds (user + system) of the whole process
minus those of the same command with ``job.max_requests=1`` (start-up: imports, composition,
reading the trace), median of ``--repeat``; with ``--baseline DIR`` (a checkout, e.g. the main
branch) the same two commands run from it in the same loop, alternating, and the ratio is printed.

    .venv/bin/python scripts/bench_replay.py --job --repeat 5 [--baseline /path/to/other/checkout]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from sglang_hydra.cache import RadixTree, block_page_keys, make_policy  # noqa: E402
from sglang_hydra.config.testing import make_record  # noqa: E402
from sglang_hydra.workload import load_trace, replay  # noqa: E402

POLICIES = [
    ("lru", None), ("lfu", None), ("fifo", None), ("slru", None), ("priority", None),
    ("tlru", {"threshold": 16 * 512, "next_prompt_estimate": 4 * 512}),
    ("ghost_lru", None), ("belady", None),
]
CAPACITIES = (1000, 4000, 16000, 64000)
NEW = "ghost_lru"


def hit_rate(reqs, policy, cfg, blocks):
    rec = make_record(page_size=512, max_total_tokens=blocks * 512)
    return replay(rec, reqs, policy=policy, policy_config=cfg)


def job_command(blocks: int):
    return [sys.executable, "-m", "sglang_hydra", "job=replay", "model=llama3_1_8b", "hardware=h100_80gb",
            "job.trace=conversation", f"schedule.max_total_tokens={blocks * 512}", "job.progress=false",
            "job.format=json"]


def cpu_seconds(cmd, tree: Path) -> float:
    """User + system CPU seconds of ``cmd`` run with ``tree`` first on the path."""
    import os
    import resource
    import subprocess

    env = dict(os.environ, PYTHONPATH=str(tree))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd="/tmp", env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"bench_replay: {' '.join(cmd)} (from {tree}) failed: {proc.stderr[-1500:]}")
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def bench_job(args) -> int:
    blocks = args.blocks if args.blocks_set else 16000
    trees = [("this checkout", ROOT)] + ([("baseline", Path(args.baseline).resolve())] if args.baseline else [])
    full, start = {n: [] for n, _ in trees}, {n: [] for n, _ in trees}
    cmd = job_command(blocks)
    for _ in range(args.repeat):
        for name, tree in trees:
            full[name].append(cpu_seconds(cmd, tree))
            start[name].append(cpu_seconds(cmd + ["job.max_requests=1"], tree))
    out = {}
    for name, _ in trees:
        f, s0 = statistics.median(full[name]), statistics.median(start[name])
        out[name] = {"full_cpu_s": f, "startup_cpu_s": s0, "beyond_startup_cpu_s": f - s0,
                     "full_runs": full[name], "startup_runs": start[name]}
        print(f"{name}: {f:.2f} s CPU, start-up {s0:.2f} s, beyond start-up {f - s0:.3f} s "
              f"(median of {args.repeat})")
    if args.baseline:
        ratio = out["this checkout"]["beyond_startup_cpu_s"] / out["baseline"]["beyond_startup_cpu_s"]
        out["ratio_beyond_startup"] = ratio
        print(f"ratio this / baseline (beyond start-up): {ratio:.2f}")
    print("command: " + " ".join(cmd[1:]))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from sglang_hydra.workload.trace import trace_path
    default_trace = trace_path("conversation")   # the full trace shipped with the package
    ap.add_argument("--trace", default=str(default_trace))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=4000, help="capacity used for timing")
    ap.add_argument("--json", help="also write all numbers to this file")
    ap.add_argument("--job", action="store_true", help="time the job=replay command line instead (see above)")
    ap.add_argument("--baseline", help="with --job: another checkout timed in the same run")
    args = ap.parse_args(argv)
    args.blocks_set = any(a.startswith("--blocks") for a in (argv if argv is not None else sys.argv[1:]))
    if args.job:
        return bench_job(args)
    con = Console()

    t = time.perf_counter()
    trace = load_trace(args.trace)
    load_s = time.perf_counter() - t
    reqs = trace.requests
    lookups = sum(len(r.hash_ids) for r in reqs)
    con.print(f"trace {args.trace}: {len(reqs):,} requests, {lookups:,} block lookups, "
              f"parsed in {load_s:.2f} s")
    out = {"trace": args.trace, "requests": len(reqs), "lookups": lookups, "timing": {},
           "hit_rate": {}, "halves": {}}

    # ------------------------------------------------------------- timing
    tim = Table(title=f"metadata replay wall time, C = {args.blocks:,} blocks, "
                      f"median of {args.repeat}")
    for col in ("policy", "median s", "min s", "lookups/s", "evictions"):
        tim.add_column(col, justify="right" if col != "policy" else "left")
    for name, cfg in POLICIES:
        walls = []
        res = None
        for _ in range(args.repeat):
            res = hit_rate(reqs, name, cfg, args.blocks)
            walls.append(res.wall_time_s)
        med = statistics.median(walls)
        out["timing"][name] = {"median_s": med, "min_s": min(walls),
                               "lookups_per_s": lookups / med}
        tim.add_row(name, f"{med:.3f}", f"{min(walls):.3f}", f"{lookups / med:,.0f}",
                    f"{res.evictions:,}")
    con.print(tim)

    # ------------------------------------------------------------- memory
    keys = [block_page_keys(r.hash_ids, r.input_length, 512) for r in reqs]
    mem = Table(title="memory per cached page (tracemalloc, after a full replay)")
    for col in ("policy", "capacity", "cached pages", "bytes/page"):
        mem.add_column(col, justify="right" if col != "policy" else "left")
    out["memory"] = {}
    for name in ("lru", NEW):
        for cap in (16000, 64000):
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            pol = make_policy(name, page_size=512)
            tree = RadixTree(cap, pol)
            for i, k in enumerate(keys):
                tree.serve(k, i)
            tree._heap = [e for e in tree._heap if e[2].heap_seq == e[1] and e[2].parent]
            used = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
            per = used / max(tree.size, 1)
            out["memory"][f"{name}@{cap}"] = per
            mem.add_row(name, f"{cap:,}", f"{tree.size:,}", f"{per:,.0f}")
            del tree, pol
    con.print(mem)

    # ------------------------------------------------------------- hit rates
    hr = Table(title="block hit rate % (page_size 512, max_total_tokens = C*512)")
    hr.add_column("policy")
    for c in CAPACITIES:
        hr.add_column(f"C={c:,}", justify="right")
    rates = {}
    for name, cfg in POLICIES:
        rates[name] = {c: hit_rate(reqs, name, cfg, c).block_hit_rate for c in CAPACITIES}
        label = name if cfg is None else f"{name} {json.dumps(cfg)}"
        hr.add_row(label, *(f"{100 * rates[name][c]:.2f}" for c in CAPACITIES))
    gap = {c: (rates[NEW][c] - rates["lru"][c]) / (rates["belady"][c] - rates["lru"][c])
           if rates["belady"][c] > rates["lru"][c] else float("nan") for c in CAPACITIES}
    hr.add_row(f"{NEW}: share of LRU->Belady gap", *(f"{100 * gap[c]:.1f} %" for c in CAPACITIES))
    out["hit_rate"] = {n: {str(c): v for c, v in r.items()} for n, r in rates.items()}
    con.print(hr)

    # ------------------------------------------------------------- halves
    half = len(reqs) // 2
    parts = (("first half (tuning)", reqs[:half]), ("second half (held out)", reqs[half:]),
             ("full trace", reqs))
    ht = Table(title=f"{NEW} vs LRU / Belady on each half (cold cache per part)")
    for col in ("part", "C", "LRU %", f"{NEW} %", "Belady %", "gap closed"):
        ht.add_column(col, justify="right" if col != "part" else "left")
    for label, rs in parts:
        for c in CAPACITIES:
            lr = hit_rate(rs, "lru", None, c).block_hit_rate
            ours = hit_rate(rs, NEW, None, c).block_hit_rate
            bel = hit_rate(rs, "belady", None, c).block_hit_rate
            g = (ours - lr) / (bel - lr) if bel > lr else float("nan")
            out["halves"].setdefault(label, {})[str(c)] = {"lru": lr, NEW: ours, "belady": bel,
                                                          "gap_closed": g}
            ht.add_row(label, f"{c:,}", f"{100 * lr:.2f}", f"{100 * ours:.2f}",
                       f"{100 * bel:.2f}", f"{100 * g:.1f} %")
    con.print(ht)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    sys.exit(main())
