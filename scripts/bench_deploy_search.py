"""How long job=deploy_search takes for 8 GPUs on the full conversation trace, against a baseline
commit measured in the same run (pure Python; no GPU).

    python scripts/bench_deploy_search.py [--deployments 40] [--repeats 1] [--processes 2] \
        [--baseline-ref 91ff75a] [--trace conversation]
    python scripts/bench_deploy_search.py --identity [--baseline-ref 91ff75a]

The deployments are the search's own for Llama-3.1-8B on 8 x H100 (TP 1/2/4/8, agg and disagg:
86 of them), evaluated against the issue's SLA (TTFT <= 2 s, TPOT <= 50 ms) as
``sglang-hydra job=deploy_search ... job.trace=conversation`` does after start-up.
``--deployments 40`` takes 15 aggregated and 25 disaggregated ones drawn with ``random.Random(0)``
(``all``: every one).  Each repeat runs the same work twice, in fresh processes, one after the other:

* **baseline**: the source tree of ``--baseline-ref`` (a git commit, extracted with ``git archive``
  into a temporary directory; 91ff75a is main before the event loop's speed-ups);
* **current**: this checkout.

It prints, as medians over the repeats, the CPU time of all processes (what 2 idle cores need is
CPU / 2; the machine may be shared, so wall time alone can overstate it), the wall time, the
ratio baseline / current, and the issue's budget (>= 40 deployments in <= 60 s on 2 cores).  The
figures of every deployment must be identical in both trees and every repeat (a digest of them is
compared): the speed-ups change no result.  Exit status 1 if they differ.

``--identity`` runs only the byte-identity check: a fixed small search through the real command
line (``IDENTITY_SEARCH``: 1,200 conversation requests, up to 4 GPUs, TP 1/2, HiCache off and x2,
two router policies; agg and disagg) in both trees, comparing their ``summary.csv`` byte for byte.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 60.0          # issue 19: >= 40 deployments for 8 GPUs in <= 60 s on 2 cores


def _worker(args) -> int:
    """Evaluate the deployments in this process tree; print one JSON line (cpu, wall, digest)."""
    import hashlib
    import random
    import resource
    import time

    from sglang_hydra.config.compose import compose
    from sglang_hydra.jobs.deploy_eval import Sla
    from sglang_hydra.jobs.deploy_search import _Engines, _trace, enumerate_candidates, evaluate_all

    rec, comp = compose(["model=llama3_1_8b", "hardware=h100_80gb"])
    requests, _ = _trace({"trace": args.trace, "time_scale": 1.0})
    space = {"modes": ["agg", "disagg"], "tp": [1, 2, 4, 8], "hicache_ratio": [0.0], "policies": ["lru"],
             "router_policies": ["cache_aware"]}
    cands = enumerate_candidates(args.gpus, 8, space)
    if args.deployments != "all":
        agg = [c for c in cands if c.mode == "agg"]
        dis = [c for c in cands if c.mode == "disagg"]
        k = int(args.deployments)
        rng = random.Random(0)
        n_agg = min(len(agg), round(k * 15 / 40))
        cands = rng.sample(agg, n_agg) + rng.sample(dis, min(len(dis), k - n_agg))
    engines = _Engines(rec, comp.hardware)
    plans = [engines.plan(c) for c in cands]

    def cpu_s() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    w0, c0 = time.perf_counter(), cpu_s()
    res = evaluate_all(plans, requests, Sla(2000.0, 50.0), rate=False, processes=args.processes)
    wall, cpu = time.perf_counter() - w0, cpu_s() - c0
    text = json.dumps([[c.layout, r] for c, r in zip(cands, res)], sort_keys=True, default=repr)
    print(json.dumps({"cpu": cpu, "wall": wall, "n": len(plans), "requests": len(requests),
                      "ok": sum(r["status"] == "ok" for r in res),
                      "digest": hashlib.sha256(text.encode()).hexdigest()}))
    return 0


IDENTITY_SEARCH = ("job=deploy_search", "model=llama3_1_8b", "hardware=h100_80gb", "deploy.total_gpus=4",
                   "job.trace=conversation", "job.max_requests=1200", "job.sla.ttft_ms=3000", "job.sla.tpot_ms=50",
                   "job.search.tp=[1,2]", "job.search.hicache_ratio=[0,2]",
                   "job.search.router_policies=[cache_aware,round_robin]", "job.top=200", "job.processes=2")


def _identity(base_tree: Path, tmp: Path) -> int:
    """The fixed small search in both trees: summary.csv must be byte-identical."""
    import time
    texts = {}
    for name, tree in (("baseline", base_tree), ("current", REPO)):
        out = tmp / f"search_{name}"
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "sglang_hydra", *IDENTITY_SEARCH, f"job.output_dir={out}"],
                           env=dict(os.environ, PYTHONPATH=str(tree)), cwd=str(tmp), capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name}: the search failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
            return 1
        texts[name] = (out / "summary.csv").read_bytes()
        rows = texts[name].count(b"\n") - 1
        print(f"{name:8s}: {rows} deployments ranked, summary.csv {len(texts[name]):,} bytes, "
              f"{time.perf_counter() - t0:.1f} s wall")
    same = texts["baseline"] == texts["current"]
    print(f"summary.csv byte-identical in both trees: {same}")
    return 0 if same else 1


def _extract(ref: str, into: Path) -> Path:
    """The source tree of ``ref`` (package and conf/) under ``into``."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", ref, "sglang_hydra", "conf"], capture_output=True,
                         check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    link = into / "sglang_hydra" / "conf"
    if not link.exists():
        link.symlink_to("../conf")
    return into


def _run(tree: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", "--deployments", str(args.deployments),
           "--processes", str(args.processes), "--trace", args.trace, "--gpus", str(args.gpus)]
    out = subprocess.run(cmd, env=env, cwd=str(tree), capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the run in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deployments", default="40", help="how many deployments (15/40 of them agg), or 'all' (86)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--baseline-ref", default="91ff75a", help="git commit of the baseline tree")
    ap.add_argument("--trace", default="conversation")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--identity", action="store_true", help="only the byte-identity check of a fixed small search")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return _worker(args)
    with tempfile.TemporaryDirectory(prefix="bench_deploy_search_") as tmp:
        base_tree = _extract(args.baseline_ref, Path(tmp))
        if args.identity:
            return _identity(base_tree, Path(tmp))
        runs = {"baseline": [], "current": []}
        for i in range(args.repeats):
            for name, tree in (("baseline", base_tree), ("current", REPO)):
                r = _run(tree, args)
                runs[name].append(r)
                print(f"repeat {i + 1} {name:8s}: cpu {r['cpu']:6.1f} s  wall {r['wall']:6.1f} s  "
                      f"({r['n']} deployments, {r['ok']} ok)", flush=True)
    first = runs["baseline"][0]
    print(f"\n{first['n']} deployments of {args.gpus} GPUs, {first['requests']:,} requests ({args.trace}), "
          f"processes={args.processes}, medians of {args.repeats} repeat(s):")
    med = {name: (statistics.median(r["cpu"] for r in rs), statistics.median(r["wall"] for r in rs))
           for name, rs in runs.items()}
    for name, (cpu, wall) in med.items():
        print(f"  {name:8s} ({args.baseline_ref if name == 'baseline' else 'this checkout'}): CPU {cpu:6.1f} s "
              f"(CPU / 2 = {cpu / 2:5.1f} s; {cpu / first['n']:.2f} s per deployment), wall {wall:6.1f} s")
    ratio = med["baseline"][0] / med["current"][0]
    print(f"  ratio baseline / current: x{ratio:.2f} CPU, x{med['baseline'][1] / med['current'][1]:.2f} wall")
    need = med["current"][0] / 2 * 40 / first["n"]
    print(f"  budget (40 deployments in <= {BUDGET_S:g} s on 2 cores): CPU / 2 scaled to 40 = {need:.1f} s: "
          f"{'met' if need <= BUDGET_S else 'MISSED'}")
    same = len({r["digest"] for rs in runs.values() for r in rs}) == 1
    print(f"  same figures in every run and both trees: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
