#!/usr/bin/env python3
"""Compile every Triton transfer-kernel configuration the project can launch, for CUDA GPUs
this machine need not have, and check what the PTX shows.

    python scripts/compile_kernels.py --targets sm_80,sm_89,sm_90

The configurations come from the project's own launch path (``TritonTransfer.plan_launches``
on tiny pools of every layout, MLA and MHA, both directions, all-layer and per-layer calls,
page sizes 1-256, element widths 1-8 bytes) bound by Triton's own binder, one per distinct
compile key (``sglang_hydra.memory.kernel_compile``).  Each is compiled per target in a
fresh ``TRITON_CACHE_DIR`` (nothing is reused from an earlier run) and checked: no local
memory (spills), no 64-bit integer division, and every data load/store as wide as the
configuration's alignment allows (128 bits unless rows/strides forbid it).

Prints a table per target and ends with ``N/N kernel configurations compiled for T targets``.
Exit 0 when every configuration compiles for every target and passes the checks, 1 when
not, 2 on bad input (unknown target, a Triton without the CUDA backend).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        sys.stderr.write(f"compile_kernels: {message}\n")
        raise SystemExit(2)


def parse_args(argv):
    p = _Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", default="sm_80,sm_89,sm_90",
                   help="comma-separated CUDA targets (default: sm_80,sm_89,sm_90: A100, L40S, H100/H200)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="compile processes (default: 2, or 1 on a single core)")
    p.add_argument("--json", metavar="PATH", help="also write every configuration's results as JSON")
    return p.parse_args(argv)


def _range(values):
    values = list(values)
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from sglang_hydra.memory import kernel_compile as kc

    problems = []
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not targets:
        problems.append("compile_kernels: --targets: no target given; allowed: " + ", ".join(kc.TARGETS))
    for t in targets:
        if t not in kc.TARGETS:
            problems.append(f"compile_kernels: --targets: unknown target {t!r}; allowed: {', '.join(kc.TARGETS)}")
    if args.jobs < 1:
        problems.append(f"compile_kernels: --jobs: must be at least 1, got {args.jobs}")
    try:
        kc.cuda_backend()
    except kc.CompileSetupError as exc:
        problems.append(f"compile_kernels: {exc}")
    if problems:
        for line in problems:
            print(line, file=sys.stderr)
        return 2

    cache = tempfile.mkdtemp(prefix="triton_cache_")   # compile for real: nothing from earlier runs
    os.environ["TRITON_CACHE_DIR"] = cache
    try:
        started = time.perf_counter()
        configs, launches = kc.launch_configurations(jobs=args.jobs)
        enumerated = time.perf_counter() - started
        print(f"{sum(launches.values())} launches planned ({len(kc.pool_shapes())} pool shapes x layouts x page sizes 1-256 x "
              f"backup/load x all/each layer) -> {len(configs)} distinct compile keys ({enumerated:.0f} s)")
        results = kc.compile_all(configs, targets, jobs=args.jobs)
        compiled_s = time.perf_counter() - started - enumerated
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    by_target = {t: [r for r in results if r["target"] == t] for t in targets}
    header = f"{'target':<8} {'configs':>7} {'compiled':>8} {'registers':>9} {'spills':>6} {'widest ld/st':>13}  PTX checks"
    print(header)
    print("-" * len(header))
    failures = []
    for t in targets:
        rows = by_target[t]
        ok = [r for r in rows if r["ok"]]
        spills = sum(1 for r in ok if r["local_bytes"] or r["stack_bytes"] or r["local_ops"])
        widest_ld = max((max(r["load_bits"], default=0) for r in ok), default=0)
        widest_st = max((max(r["store_bits"], default=0) for r in ok), default=0)
        bad = 0
        for cfg, r in zip(configs, rows):
            found = kc.ptx_problems(cfg, r)
            if found:
                bad += 1
                failures.append(f"{t} {cfg.name}: {'; '.join(found)} (from {cfg.origins[0]})")
        checks = "pass" if not bad else f"{bad} FAIL"
        print(f"{t:<8} {len(rows):>7} {len(ok):>8} {_range(r['registers'] for r in ok):>9} {spills:>6} "
              f"{f'{widest_ld}/{widest_st} bit':>13}  {checks}")

    narrow = [c for c in configs if c.vector_bits < 128]
    print(f"\n{len(configs) - len(narrow)} configurations move 128 bits per lane access; {len(narrow)} have rows or "
          "strides that allow only narrower aligned accesses (odd-sized rows):")
    for c in narrow:
        print(f"  {c.name}: {c.vector_bits}-bit accesses, e.g. {c.origins[0]}")
    for line in failures:
        print("FAIL", line)

    if args.json:
        payload = {"targets": targets, "launches": launches, "cache_dir": cache, "compile_seconds": round(compiled_s, 1),
                   "configurations": [{"name": c.name, "elem_bytes": c.elem_bytes, "mode": c.mode, "block": c.block,
                                       "vec": c.vec, "num_warps": c.num_warps,
                                       "origins": [str(o) for o in c.origins]} for c in configs],
                   "results": results}
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(payload, f, indent=1)
        os.replace(tmp, args.json)

    all_ok = [c for i, c in enumerate(configs) if all(by_target[t][i]["ok"] for t in targets)]
    print(f"{len(all_ok)}/{len(configs)} kernel configurations compiled for {len(targets)} targets")
    return 0 if len(all_ok) == len(configs) and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
