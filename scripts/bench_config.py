#!/usr/bin/env python3
"""Config-layer benchmark: whole-process cold starts and in-process compose_record times.

Prints medians (and ratios to the baselines measured in the same run):
  cold starts: `sglang-hydra --hicache-ratio 2 job=resolve`, the same with Hydra overrides,
  a 4-point `-m` sweep, a minimal @hydra.main app, and `python -c "import omegaconf"`;
  in-process: compose_record with legacy flags only, with 5 Hydra overrides, with a group choice.

    python scripts/bench_config.py [--reps 9]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path


def wall_interleaved(cmds, cwd, reps):
    """Median/min/max wall time per command; the commands take turns in every round, so a
    busy machine slows them alike and the ratios stay meaningful."""
    times = {name: [] for name in cmds}
    for _ in range(reps):
        for name, cmd in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t0)
    return {n: (statistics.median(t), min(t), max(t)) for n, t in times.items()}


# One flag of every namespace (the operator command line of the "every flag" issue, and more).
ALL_NAMESPACES_ARGV = [
    "--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--tp", "2", "--quantization", "fp8",
    "--attention-backend", "fa3", "--context-length", "32768", "--enable-metrics", "--max-loras-per-batch", "4",
    "--hicache-ratio", "2", "--disaggregation-mode", "prefill", "--device", "cpu", "--page-size", "16",
    "--port", "30001", "--mm-attention-backend", "sdpa", "--speculative-num-steps", "3",
]


def in_process(reps: int):
    # Import cost is paid once, outside the timed region, like a long-lived caller.
    import logging
    from sglang_hydra import compose_record
    logging.getLogger("sglang_hydra").setLevel(logging.ERROR)  # rule notes would repeat every call
    cases = {
        "legacy flags only": dict(argv=["--hicache-ratio", "2", "--enable-hicache", "--page-size", "16",
                                        "--radix-eviction-policy", "lfu", "--tp-size", "2"]),
        "5 Hydra overrides": dict(overrides=["memory.hicache_ratio=2", "memory.enable_hierarchical_cache=true",
                                             "schedule.page_size=16", "memory.radix_eviction_policy=lfu",
                                             "parallel.tp_size=2"]),
        "group choice + override": dict(overrides=["memory=hicache_file", "model=llama3_8b", "memory.hicache_ratio=3"]),
        "flags of all 12 namespaces": dict(argv=ALL_NAMESPACES_ARGV),
    }
    out = {}
    for name, kw in cases.items():
        compose_record(**kw)  # warm caches (YAML presets, parser)
        ts = []
        for _ in range(reps * 5):
            t0 = time.perf_counter()
            compose_record(**kw)
            ts.append(time.perf_counter() - t0)
        out[name] = statistics.median(ts)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    py = sys.executable
    # An installed package has its bytecode cached; a source checkout under
    # PYTHONDONTWRITEBYTECODE=1 would recompile ~60 modules in every timed process.
    import compileall
    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "sglang_hydra"), quiet=1)
    with tempfile.TemporaryDirectory() as tmp:
        app = Path(tmp) / "minimal_app.py"
        app.write_text(textwrap.dedent("""
            import hydra
            from omegaconf import DictConfig, OmegaConf
            @hydra.main(version_base="1.3", config_path=None, config_name=None)
            def main(cfg: DictConfig) -> None:
                print(OmegaConf.to_yaml(cfg))
            main()
        """))
        cold = {
            "python -c 'import omegaconf'": [py, "-c", "import omegaconf"],
            "minimal @hydra.main app (baseline)": [py, str(app)],
            "sglang-hydra --hicache-ratio 2 job=resolve": [py, "-m", "sglang_hydra", "--hicache-ratio", "2", "job=resolve"],
            "sglang-hydra <flags of all 12 namespaces> job=resolve": [py, "-m", "sglang_hydra", *ALL_NAMESPACES_ARGV, "job=resolve"],
            "sglang-hydra ... job=resolve hydra.run.dir=... (@hydra.main path)": [
                py, "-m", "sglang_hydra", *ALL_NAMESPACES_ARGV, "job=resolve", f"hydra.run.dir={tmp}/run"],
            "sglang-hydra memory.hicache_ratio=2 (+4 overrides) job=resolve": [
                py, "-m", "sglang_hydra", "memory.hicache_ratio=2", "memory.enable_hierarchical_cache=true",
                "schedule.page_size=16", "memory.radix_eviction_policy=lfu", "parallel.tp_size=2", "job=resolve"],
            "sglang-hydra memory=hicache model=llama3_8b job=resolve": [py, "-m", "sglang_hydra", "memory=hicache", "model=llama3_8b", "job=resolve"],
            "sglang-hydra -m (4 points) job=resolve": [
                py, "-m", "sglang_hydra", "-m", "memory.radix_eviction_policy=lru,lfu",
                "memory.hicache_ratio=2,4", "job=resolve", f"hydra.sweep.dir={tmp}/sweep"],
        }
        results = wall_interleaved(cold, tmp, args.reps)
    base = results["minimal @hydra.main app (baseline)"][0]
    try:
        from rich.console import Console
        from rich.table import Table
        t = Table(title=f"whole-process wall time, median of {args.reps} (2-core box)")
        for c in ("command", "median ms", "min ms", "max ms", "x minimal Hydra app"):
            t.add_column(c, justify="right" if c != "command" else "left")
        for name, (med, lo, hi) in results.items():
            t.add_row(name, f"{med*1e3:.0f}", f"{lo*1e3:.0f}", f"{hi*1e3:.0f}", f"{med/base:.2f}")
        Console(width=130).print(t)
        ip = in_process(args.reps)
        t2 = Table(title="in-process compose_record (warm), median")
        t2.add_column("case")
        t2.add_column("median ms", justify="right")
        t2.add_column("goal ms", justify="right")
        goals = {"legacy flags only": 5, "5 Hydra overrides": 100, "group choice + override": 100,
                 "flags of all 12 namespaces": 5}
        for name, v in ip.items():
            t2.add_row(name, f"{v*1e3:.2f}", str(goals[name]))
        Console(width=130).print(t2)
    except ImportError:  # pragma: no cover
        print(results)


if __name__ == "__main__":
    main()
