#!/usr/bin/env python
"""Benchmark the hierarchical cache: full replays of the conversation trace, no HiCache vs
HiCache (host tier) vs HiCache + file storage.

Each configuration (``memory=default``, ``memory=hicache``, ``memory=hicache_file``; the tiny
model) is one ``sglang-hydra job=replay job.mode=full`` command, run as a user runs it, its
``job.format=json`` document read back.  The file
storage lives in a fresh temporary directory per repetition, removed afterwards.  Reports,
as the median over ``--reps``: hit rate per tier, bytes moved per tier and direction, the
achieved GB/s of each direction next to its ceiling measured at start-up in the same run
(and the ratio; goal >= 0.5x), the TTFT estimate P50/P90 with the P90 ratio to no
HiCache, and wall time.

    .venv/bin/python scripts/bench_hicache.py [--requests 2000] [--reps 3] [--json out.json]

Torch runs one intra-op thread by default (``--torch-threads``): on a small shared machine
two OpenMP threads per copy were measured up to 20x slower than one.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

CONFIGS = ("default", "hicache", "hicache_file")
DIRECTIONS = (("d2h", "device->host"), ("h2d", "host->device"),
              ("storage_write", "host->storage"), ("storage_read", "storage->host"))
GOAL_RATIO = 0.5


def default_trace() -> Path:
    """The full conversation trace shipped with the package (``job.trace=conversation``)."""
    from sglang_hydra.workload.trace import trace_path
    return trace_path("conversation")


def overrides_for(config: str, page_size: int, device_pages: int, storage_dir: str):
    ov = [f"memory={config}", "model=tiny", f"schedule.page_size={page_size}",
          f"schedule.max_total_tokens={page_size * device_pages}"]
    if config == "hicache_file":
        extra = json.dumps({"file_storage_path": storage_dir})
        ov.append(f"memory.hicache_storage_backend_extra_config={json.dumps(extra)}")
    return ov


def run_once(config: str, args) -> dict:
    """One ``sglang-hydra job=replay job.mode=full`` run (the command line itself), read back."""
    import os
    import subprocess

    storage_dir = tempfile.mkdtemp(prefix="bench_hicache_")
    try:
        cmd = [sys.executable, "-m", "sglang_hydra", "job=replay", "job.mode=full", "hardware=h100_80gb",
               f"job.trace={args.trace}", f"job.max_requests={args.requests}", "job.format=json",
               "job.progress=false", "job.arrival=as_is",
               *overrides_for(config, args.page_size, args.device_pages, storage_dir)]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
                   OMP_NUM_THREADS=str(args.torch_threads))
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=storage_dir, env=env)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
        doc = json.loads(proc.stdout)
    finally:
        shutil.rmtree(storage_dir, ignore_errors=True)
    cache, full, lat = doc["cache"], doc.get("full_mode", {}), doc["latency"]
    dirs = [d for d, _ in DIRECTIONS]
    counts = cache.get("tier_counts", {})
    return {"hit_rate": {t: cache[f"{t}_hit_rate"] for t in ("device", "host", "storage")},
            "token_hit_rate": cache["token_hit_rate"],
            "bytes_moved": {d: full.get(f"{d}_bytes", 0) for d in dirs},
            "achieved_gbps": {d: full.get(f"{d}_achieved_gbps") for d in dirs},
            "ceiling_gbps": {d: full.get(f"{d}_ceiling_gbps") for d in dirs},
            "ratio": {d: full.get(f"{d}_ceiling_ratio") for d in dirs},
            "ttft_ms_p50": lat["ttft_p50_ms"], "ttft_ms_p90": lat["ttft_p90_ms"], "wall_s": wall,
            "verified_pages": full.get("verified_pages", 0),
            "verify_mismatch_pages": full.get("verify_mismatch_pages", 0),
            "prefetch": {"issued": counts.get("prefetch_issued", 0), "completed": counts.get("prefetch_completed", 0),
                         "terminated": counts.get("prefetch_terminated", 0), "pages": counts.get("prefetch_used_pages", 0)},
            "evictions": {"device": counts.get("device_evicted_pages", 0), "host": counts.get("host_evicted_pages", 0)}}


def median_of(runs, *path):
    vals = []
    for run in runs:
        v = run
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(default_trace()), help="Mooncake JSONL trace")
    ap.add_argument("--requests", type=int, default=2000, help="first N requests of the trace")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per configuration (median)")
    ap.add_argument("--page-size", type=int, default=512, help="tokens per page (512 = one trace block)")
    ap.add_argument("--device-pages", type=int, default=1000, help="device pool size in pages")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--json", help="also write every number (each repetition) to this file")
    ap.add_argument("--loopback-mib", type=int, default=256,
                    help="size of the raw process-to-process copy measured as the machine's ceiling (0: skip)")
    args = ap.parse_args(argv)
    if args.requests <= 0 or args.reps <= 0:
        ap.error("--requests and --reps must be positive")

    import torch

    from sglang_hydra.workload.trace import TraceError, load_trace

    torch.set_num_threads(max(1, args.torch_threads))
    con = Console(width=160)
    try:
        trace = load_trace(args.trace, max_requests=args.requests)
    except (OSError, TraceError) as exc:
        print(f"bench_hicache: cannot read the trace: {exc}", file=sys.stderr)
        return 2
    reqs = trace.requests
    con.print(f"trace {args.trace}: first {len(reqs):,} requests, {sum(r.input_length for r in reqs):,} "
              f"input tokens; page size {args.page_size}, device {args.device_pages:,} pages, "
              f"reps {args.reps}, torch threads {torch.get_num_threads()}")

    runs = {c: [] for c in CONFIGS}
    t_all = time.perf_counter()
    for rep in range(args.reps):
        for c in CONFIGS:
            runs[c].append(run_once(c, args))
            con.print(f"  rep {rep + 1}/{args.reps} {c}: {runs[c][-1]['wall_s']:.1f} s")
    total = time.perf_counter() - t_all
    loopback = None
    if args.loopback_mib > 0:   # the best plain memcpy between two processes: a machine-wide second ceiling
        sys.path.insert(0, str(ROOT / "scripts"))
        from loopback_ceiling import loopback_ceiling
        loopback = loopback_ceiling(args.loopback_mib << 20, repeats=2)["gbps"]
        con.print(f"loopback ceiling (shared-memory memcpy between processes, {args.loopback_mib} MiB): "
                  f"{loopback:.2f} GB/s")

    base_p90 = median_of(runs["default"], "ttft_ms_p90")
    t1 = Table(title=f"HiCache full replay: first {len(reqs):,} requests, median of {args.reps}")
    for col in ("config", "token hit %", "device %", "host %", "storage %", "TTFT P50 ms", "TTFT P90 ms",
                "P90 vs default", "verified pages (bad)", "wall s"):
        t1.add_column(col, justify="left" if col == "config" else "right")
    summary = {}
    for c in CONFIGS:
        p90 = median_of(runs[c], "ttft_ms_p90")
        row = {"token_hit_rate": median_of(runs[c], "token_hit_rate"),
               "hit_rate": {t: median_of(runs[c], "hit_rate", t) for t in ("device", "host", "storage")},
               "ttft_ms_p50": median_of(runs[c], "ttft_ms_p50"), "ttft_ms_p90": p90,
               "p90_vs_default": p90 / base_p90 if p90 is not None and base_p90 else None,
               "wall_s": median_of(runs[c], "wall_s"),
               "verified_pages": median_of(runs[c], "verified_pages"),
               "verify_mismatch_pages": max(r["verify_mismatch_pages"] for r in runs[c])}
        summary[c] = row
        t1.add_row(c, fmt(100 * row["token_hit_rate"], ".2f"),
                   *(fmt(100 * row["hit_rate"][t], ".2f") for t in ("device", "host", "storage")),
                   fmt(row["ttft_ms_p50"], ".1f"), fmt(p90, ".1f"), fmt(row["p90_vs_default"], ".3f"),
                   f"{row['verified_pages'] or 0:,.0f} ({row['verify_mismatch_pages']})", fmt(row["wall_s"], ".1f"))
    con.print(t1)

    t2 = Table(title=f"transfers per tier (median of {args.reps}); ceiling measured at start-up of each run; "
                     f"goal achieved >= {GOAL_RATIO}x ceiling")
    for col in ("config", "direction", "MB moved", "achieved GB/s", "ceiling GB/s", "achieved/ceiling", "goal",
                "loopback GB/s", "achieved/loopback"):
        t2.add_column(col, justify="left" if col in ("config", "direction") else "right")
    for c in CONFIGS[1:]:
        summary[c]["transfers"] = {}
        for d, label in DIRECTIONS:
            moved = median_of(runs[c], "bytes_moved", d)
            ceiling = median_of(runs[c], "ceiling_gbps", d)
            if not moved and ceiling is None:
                continue
            ach = median_of(runs[c], "achieved_gbps", d)
            ratio = median_of(runs[c], "ratio", d)
            vs_loop = ach / loopback if ach is not None and loopback else None
            summary[c]["transfers"][d] = {"bytes": moved, "achieved_gbps": ach, "ceiling_gbps": ceiling,
                                          "ratio": ratio, "loopback_gbps": loopback, "ratio_loopback": vs_loop}
            goal = "-" if ratio is None else ("met" if ratio >= GOAL_RATIO else "NOT met")
            t2.add_row(c, label, fmt(moved / 1e6 if moved is not None else None, ",.1f"), fmt(ach, ".3g"),
                       fmt(ceiling, ".3g"), fmt(ratio, ".2f"), goal, fmt(loopback, ".3g"), fmt(vs_loop, ".2f"))
    con.print(t2)
    con.print(f"total benchmark time {total:.1f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "requests": len(reqs), "summary": summary,
                                               "runs": runs, "total_s": total}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
