"""scripts/bench_pass_model.py runs and prints what docs/benchmarks.md records (no timing asserted)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_pass_model_prints_rates_and_the_estimate_time():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_pass_model.py"), "--repeats", "1",
                        "--calls", "2000"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "passes/s" in out and "the 100,000 budget" in out and "job=estimate model time" in out
