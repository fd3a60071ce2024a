"""How long job=deploy_search takes for 8 GPUs on the full conversation trace (pure Python; no GPU).

    python scripts/bench_deploy_search.py [--repeats 1] [--trace conversation] [--processes 2]

Evaluates every deployment the search enumerates for Llama-3.1-8B on 8 x H100 (TP 1/2/4/8, agg and
disagg: 86 deployments) against the issue's SLA (TTFT <= 2 s, TPOT <= 50 ms), as
``sglang-hydra job=deploy_search ... job.trace=conversation`` does after start-up, and prints as
medians over the repeats:

* the wall time with ``--processes`` worker processes, against the budget of 60 s on 2 cores;
* the CPU time of all processes (what 2 idle cores would need is CPU / 2: the machine this runs on
  may be shared, so the wall time alone can overstate it);
* the baseline from this run: the same work in one process (``--processes 1``), and the ratio.

The ranking is checked to be the same in both runs (results never depend on timing).
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time


def cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--trace", default="conversation")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()

    from sglang_hydra.config.compose import compose
    from sglang_hydra.jobs.deploy_eval import Sla
    from sglang_hydra.jobs.deploy_search import _Engines, _trace, enumerate_candidates, evaluate_all

    rec, comp = compose(["model=llama3_1_8b", "hardware=h100_80gb"])
    requests, _ = _trace({"trace": args.trace, "time_scale": 1.0})
    space = {"modes": ["agg", "disagg"], "tp": [1, 2, 4, 8], "hicache_ratio": [0.0], "policies": ["lru"],
             "router_policies": ["cache_aware"]}
    engines = _Engines(rec, comp.hardware)
    plans = [engines.plan(c) for c in enumerate_candidates(args.gpus, 8, space)]
    sla = Sla(2000.0, 50.0)
    print(f"{len(plans)} deployments of {args.gpus} GPUs, {len(requests):,} requests ({args.trace})")

    def timed(processes: int):
        w0, c0 = time.perf_counter(), cpu_s()
        res = evaluate_all(plans, requests, sla, rate=False, processes=processes)
        return time.perf_counter() - w0, cpu_s() - c0, res

    runs = {p: [timed(p) for _ in range(args.repeats)] for p in (args.processes, 1)}
    same = all(r[2] == runs[1][0][2] for p in runs for r in runs[p])
    base_wall = statistics.median(r[0] for r in runs[1])
    for p in (args.processes, 1):
        wall = statistics.median(r[0] for r in runs[p])
        cpu = statistics.median(r[1] for r in runs[p])
        print(f"processes={p}: wall {wall:6.1f} s  cpu {cpu:6.1f} s  ({wall / len(plans):.2f} s/deployment wall, "
              f"{cpu / len(plans):.2f} s CPU)  x{base_wall / wall:.2f} vs one process"
              + ("" if p == 1 else f"; budget 60 s on 2 cores: {'met' if cpu / 2 <= 60 else 'MISSED'} "
                 f"(CPU / 2 = {cpu / 2:.1f} s)"))
    print(f"same figures in every run: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
