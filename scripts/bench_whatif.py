"""What a what-if sweep costs: one simulated point, deployments, a 12-point joblib sweep, growth with trace length.

    python scripts/bench_whatif.py [--trace PATH] [--repeat 3] [--mode sim] [--json out.json]

* point: ``job=replay`` on model=llama3_1_8b hardware=h100_80gb memory=hicache, in process
  (the job function: the deployment simulation with decode, plan, files); the first call also
  parses the trace, later calls reuse it (as sweep points in one process do).  Goal: <= 3 s.
* deployments: the same job (metadata cache) for one engine (saturated), ``parallel.dp_size=8``,
  ``deploy.workers=4`` with the cache-aware router, and ``deploy=pd`` 3P1D over NIXL; CPU
  medians and the ratio to the one-engine point of the same run.
* sweep: ``sglang-hydra -m memory.hicache_ratio=1,2,4 memory.radix_eviction_policy=lru,lfu,slru,ghost_lru
  hydra/launcher=joblib hydra.launcher.n_jobs=2``, whole command wall time.  Goal: <= 30 s.
* growth: the point on the trace concatenated 1x, 4x and 16x (copy k shifted by k x the
  trace's duration, its block ids offset so copies do not share prefixes); CPU seconds per
  1,000 requests should stay flat (linear cost).  CPU time (process_time) is reported
  beside wall time because other processes on a shared machine inflate wall time.

Medians of ``--repeat`` runs are printed (the sweep and the 16x point run once each unless
``--repeat-slow`` says otherwise).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = ["model=llama3_1_8b", "hardware=h100_80gb", "memory=hicache"]
DEPLOYMENTS = {                     # name -> (overrides, deploy settings, PD sides or None)
    "1 engine": ([], None, None),
    "dp_size=8": (["parallel.dp_size=8"], None, None),
    "4 workers, cache_aware": ([], {"workers": 4, "router_policy": "cache_aware"}, None),
    "pd 3P1D nixl": (["disagg.disaggregation_transfer_backend=nixl"],
                     {"prefill_workers": 3, "decode_workers": 1, "router_policy": "round_robin"}, True),
}


def deployment_seconds(trace: str, repeat: int, out: Path) -> dict:
    """CPU and wall seconds of one job=replay point per deployment (median of ``repeat``)."""
    from types import SimpleNamespace
    from sglang_hydra.config.compose import compose
    from sglang_hydra.jobs.context import JobContext
    from sglang_hydra.jobs import replay as job_replay

    res = {}
    for name, (ovs, deploy, pd) in DEPLOYMENTS.items():
        record, composed = compose(["model=llama3_1_8b", "hardware=h100_80gb", f"job.trace={trace}",
                                    "job.progress=false"] + ovs)
        target = record
        if pd:
            target = SimpleNamespace(servers=(SimpleNamespace(role="prefill", record=record),
                                              SimpleNamespace(role="decode", record=record)))
        job_replay.load_requests(composed.job)            # parse once, outside the timing
        cpu, wall = [], []
        for i in range(repeat):
            ctx = JobContext(output_dir=out / f"{len(res)}-{i}", multirun=True, hardware=composed.hardware,
                             deploy=deploy)
            t0, c0 = time.perf_counter(), time.process_time()
            job_replay.run(target, composed.job, ctx)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        doc = json.loads((out / f"{len(res)}-{repeat - 1}" / "metrics.json").read_text())
        res[name] = {"cpu_s": statistics.median(cpu), "wall_s": statistics.median(wall), "status": doc["status"],
                     "ttft_p90_ms": doc["latency"]["ttft_p90_ms"], "tpot_p90_ms": doc["latency"]["tpot_p90_ms"],
                     "tokens_per_s_per_gpu": doc["throughput"]["tokens_per_s_per_gpu"],
                     "token_hit_rate": doc["cache"]["token_hit_rate"], "gpus": doc["deployment"]["gpus"]}
    return res


def point_seconds(trace: str, mode: str, repeat: int, out: Path) -> dict:
    from sglang_hydra.config.compose import compose
    from sglang_hydra.jobs.context import JobContext
    from sglang_hydra.jobs import replay as job_replay

    record, composed = compose(BASE + [f"job.trace={trace}", f"job.mode={mode}", "job.progress=false"])
    times, cpu = [], []
    value = None
    for i in range(repeat):
        ctx = JobContext(output_dir=out / f"point{i}", multirun=True, hardware=composed.hardware)
        t0, c0 = time.perf_counter(), time.process_time()
        value = job_replay.run(record, composed.job, ctx)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"first_s": times[0], "median_s": statistics.median(times[1:] or times), "runs": times,
            "first_cpu_s": cpu[0], "median_cpu_s": statistics.median(cpu[1:] or cpu), "objective": value}


def sweep_seconds(trace: str, mode: str, out: Path) -> float:
    cmd = [sys.executable, "-m", "sglang_hydra", "-m", *BASE, f"job.trace={trace}", f"job.mode={mode}",
           "memory.hicache_ratio=1,2,4", "memory.radix_eviction_policy=lru,lfu,slru,ghost_lru",
           "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={out}"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"sweep failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return wall


def scaled_trace(src: Path, copies: int, dest: Path) -> Path:
    """``copies`` time-shifted copies of ``src`` with disjoint block ids."""
    lines = [json.loads(x) for x in src.read_text().splitlines() if x.strip()]
    span = max(x["timestamp"] for x in lines) + 1
    top = max(max(x["hash_ids"] or [0]) for x in lines) + 1
    with dest.open("w") as fh:
        for k in range(copies):
            for x in lines:
                y = dict(x, timestamp=x["timestamp"] + k * span, hash_ids=[h + k * top for h in x["hash_ids"]])
                fh.write(json.dumps(y) + "\n")
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=None, help="a Mooncake JSONL trace (default: the packaged conversation trace)")
    ap.add_argument("--mode", default="sim", choices=("sim", "device_only"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--scales", default="1,4,16")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.trace is None:
        from sglang_hydra.workload.trace import trace_path
        args.trace = str(trace_path("conversation"))
    results: dict = {"trace": args.trace, "mode": args.mode, "cpu_count": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="bench_whatif_") as tmp:
        tmp = Path(tmp)
        p = point_seconds(args.trace, args.mode, args.repeat, tmp)
        results["point"] = p
        print(f"one point: first {p['first_s']:.2f} s (parses the trace), median of the rest {p['median_s']:.2f} s "
              f"wall, {p['median_cpu_s']:.2f} s CPU (goal <= 3 s)")
        dep = deployment_seconds(args.trace, args.repeat, tmp / "deployments")
        results["deployments"] = dep
        base = dep["1 engine"]["cpu_s"]
        print("deployment                 GPUs  CPU s  ratio  wall s  status     TTFT P90 ms  TPOT P90 ms  tok/s/GPU  hit")
        for name, d in dep.items():
            print(f"{name:<26} {d['gpus']:>4}  {d['cpu_s']:5.2f}  {d['cpu_s'] / base:5.2f}  {d['wall_s']:6.2f}  "
                  f"{d['status']:<9} {d['ttft_p90_ms']:12,.1f} {d['tpot_p90_ms']:12.2f} {d['tokens_per_s_per_gpu']:10.1f}"
                  f"  {d['token_hit_rate']:.3f}")
        if not args.skip_sweep:
            wall = sweep_seconds(args.trace, args.mode, tmp / "sweep")
            results["sweep_12_joblib2_s"] = wall
            print(f"12-point sweep, joblib n_jobs=2: {wall:.1f} s wall (goal <= 30 s)")
        growth = []
        n0 = None
        for k in [int(x) for x in args.scales.split(",")]:
            path = Path(args.trace) if k == 1 else scaled_trace(Path(args.trace), k, tmp / f"x{k}.jsonl")
            reps = args.repeat if k < 16 else 1
            g = point_seconds(str(path), args.mode, reps + (1 if reps > 1 else 0), tmp / f"g{k}")
            sec = g["median_s"] if reps > 1 else g["first_s"]
            cpu = g["median_cpu_s"] if reps > 1 else g["first_cpu_s"]
            from sglang_hydra.workload.trace import load_trace
            n = len(load_trace(str(path)).requests)
            n0 = n0 or n
            growth.append({"copies": k, "requests": n, "seconds": sec, "cpu_seconds": cpu,
                           "ms_per_1k_requests": 1e6 * sec / n, "cpu_ms_per_1k_requests": 1e6 * cpu / n})
            print(f"  {k:>2}x trace ({n:,} requests): {sec:.2f} s wall, {cpu:.2f} s CPU; "
                  f"{1e6 * cpu / n:.1f} CPU ms per 1,000 requests")
        results["growth"] = growth
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
