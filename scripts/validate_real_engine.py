#!/usr/bin/env python3
"""The full check of the what-if against a real SGLang 0.5.23 server on this machine.

Every step is a ``sglang-hydra`` command a user could type (printed before it runs); each writes
its own directory under ``--out``.  Steps:

1. ``job=calibrate`` (through the engine): this machine's pass-time profile for ``model=tiny_llama``.
2. **One request at a time**, cached tokens identical on every request: policies ``lru``, ``lfu``
   and ``ghost_lru`` (ours, through the engine plugin) on the conversation trace and on a
   synthetic trace, with a pool small enough to evict.
3. **Capacity**: every request sent at once; the measured requests/s is the server's capacity,
   and the prediction must call the run saturated as the measurement does.
4. **Concurrent** at about 20 % and 80 % of that capacity (Poisson): token hit rate within 1
   point; TTFT P50, P90 and TPOT P50 within 25 %.
5. **Two workers behind sglang-router** (``cache_aware``, ``round_robin``): each worker's share of
   the requests within 5 points of the router's own count, hit rate within 2 points.

Prints one line per run (the checks and the worst figures) and writes ``results.json``.  Needs the
engine's interpreter: ``--python`` (default ``$SGLANG_HYDRA_REFERENCE_PYTHON``).
``--quick`` runs the small version CI runs.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

BASE = ["model=tiny_llama", "schedule.page_size=16"]


def sh(args, out: Path, log) -> dict:
    cmd = ["sglang-hydra", *args, f"hydra.run.dir={out}"]
    print("$ " + shlex.join(cmd), flush=True)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "sglang_hydra", *cmd[1:]], capture_output=True, text=True)
    log.write(f"$ {shlex.join(cmd)}\n{p.stdout}\n{p.stderr}\n")
    doc = {"rc": p.returncode, "seconds": round(time.monotonic() - t0, 1), "command": shlex.join(cmd)}
    if (out / "validation.json").exists():
        doc["validation"] = json.loads((out / "validation.json").read_text())
    if (out / "calibrate.json").exists():
        doc["calibrate"] = json.loads((out / "calibrate.json").read_text())
    if p.returncode not in (0, 1):
        print(p.stdout[-2000:] + p.stderr[-3000:], file=sys.stderr)
    return doc


def line(name: str, doc: dict) -> str:
    v = doc.get("validation")
    if not v:
        return f"{name:34} rc={doc['rc']} (no validation.json)"
    p, m, e = v["predicted"], v["measured"], v["errors"]

    def rel(k):
        a, b = p.get(k), m.get(k)
        return f"{(a - b) / b:+.0%}" if a is not None and b else "-"
    return (f"{name:34} rc={doc['rc']} n={v['paired_requests']:>3} cached-diff={e['cached_tokens']['mismatches']:>3} "
            f"hit {p['token_hit_rate']:.2%}/{m['token_hit_rate']:.2%} TTFT50 {rel('ttft_p50_ms'):>5} "
            f"TTFT90 {rel('ttft_p90_ms'):>5} TPOT50 {rel('tpot_p50_ms'):>5} sat {p['saturated']}/{m['saturated']} "
            f"shares {p['worker_shares']} / {m['worker_shares']} router {v.get('router_worker_counts')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default=os.environ.get("SGLANG_HYDRA_REFERENCE_PYTHON"))
    ap.add_argument("--out", default="outputs/validate_real_engine")
    ap.add_argument("--quick", action="store_true", help="the small version CI runs")
    ap.add_argument("--only-routers", type=float, default=None, metavar="CAPACITY_RPS",
                    help="run only the two-worker router checks, at half this capacity")
    a = ap.parse_args()
    if not a.python:
        print("give --python (an interpreter with SGLang 0.5.23; scripts/install_engine_env.sh builds one)",
              file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "commands.log", "w")
    py = [f"job.python={a.python}"]
    results = {}
    seq_n, conc_n = (100, 200) if a.quick else (300, 400)

    def routers(capacity_rps: float) -> None:
        """Two workers behind sglang-router, each policy, at half the capacity.  A deployment takes
        no hydra.searchpath, so the profile is fitted on its first worker (job.calibrate=true)."""
        base = ["job=validate", *BASE, *py, "job.trace=conversation", "job.max_input_tokens=2048",
                "job.max_output_tokens=16", f"job.max_requests={conc_n}", "hardware=local", "job.calibrate=true"]
        for policy in ("cache_aware", "round_robin"):
            name = f"two workers, router {policy}"
            results[name] = sh(base + ["deploy.workers=2", f"deploy.router_policy={policy}", "job.pacing=rate",
                                       f"job.rate={0.5 * capacity_rps:.3f}", "job.tolerance.hit_rate_points=2"],
                               out / f"router_{policy}", log)
            print(line(name, results[name]), flush=True)

    if a.only_routers:
        routers(a.only_routers)
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
        return 0 if all(v.get("rc") == 0 for v in results.values()) else 1
    cal_dir = out / "calibrate"
    results["calibrate"] = sh(["job=calibrate", "hardware=local", *BASE, *py], cal_dir, log)
    if results["calibrate"]["rc"] != 0:
        print("calibration failed", file=sys.stderr)
        return 1
    hw = [f"hydra.searchpath=[file://{cal_dir.resolve()}]", "hardware=local_engine"]
    cal = results["calibrate"]["calibrate"]
    print(f"calibrated: worst pass error {cal['max_abs_error_pct']:.0f}% over {len(cal['checks'])} passes")

    seq = ["job=validate", *BASE, *hw, *py, "job.pacing=sequential", "job.max_output_tokens=4",
           "job.tolerance.cached_token_mismatches=0"]
    traces = [("conversation", ["job.trace=conversation", "job.max_input_tokens=2048"]),
              ("synthetic", ["job.workload=synthetic", "job.conversations=30", "job.turns=4",
                             "job.max_input_tokens=4096"])]
    policies = ("lru",) if a.quick else ("lru", "lfu", "ghost_lru")
    for trace, targs in (traces[:1] if a.quick else traces):
        for policy in policies:
            name = f"sequential {trace} {policy}"
            results[name] = sh(seq + targs + [f"memory.radix_eviction_policy={policy}", f"job.max_requests={seq_n}",
                                              "schedule.max_total_tokens=12000"],
                               out / f"seq_{trace}_{policy}", log)
            print(line(name, results[name]), flush=True)

    conc = ["job=validate", *BASE, *hw, *py, "job.trace=conversation", "job.max_input_tokens=2048",
            "job.max_output_tokens=16", f"job.max_requests={conc_n}"]
    name = "saturated (all at once)"
    results[name] = sh(conc + ["job.pacing=rate", "job.rate=1000", "job.tolerance.ttft_p50=null",
                               "job.tolerance.ttft_p90=null", "job.tolerance.tpot_p50=null"], out / "saturated", log)
    print(line(name, results[name]), flush=True)
    meas = results[name].get("validation", {}).get("measured", {})
    span_s, done = None, []
    if meas:
        rows = [json.loads(x) for x in (out / "saturated" / "measured.jsonl").read_text().splitlines()]
        done = [r for r in rows if r["finished"]]
        span_s = max(r["arrival_ms"] + r["e2e_ms"] for r in done) / 1000.0
    capacity = len(done) / span_s if span_s else None
    print(f"measured capacity: {capacity:.2f} requests/s" if capacity else "capacity unknown", flush=True)
    results["capacity_rps"] = capacity
    if capacity:
        for share in (0.2, 0.8):
            name = f"concurrent {int(share * 100)}% of capacity"
            results[name] = sh(conc + ["job.pacing=rate", f"job.rate={share * capacity:.3f}"],
                               out / f"rate_{int(share * 100)}", log)
            print(line(name, results[name]), flush=True)
        routers(capacity)
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    failed = [k for k, v in results.items() if isinstance(v, dict) and v.get("rc") not in (0, None)]
    print(f"wrote {out}/results.json; {len(failed)} run(s) outside their tolerances: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
