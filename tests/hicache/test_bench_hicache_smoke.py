"""scripts/bench_hicache.py runs end to end on a few requests (the real run takes minutes)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_hicache.py"


def test_bench_hicache_smoke(tmp_path):
    from sglang_hydra.workload.trace import default_trace_path

    out = tmp_path / "bench.json"
    # the bundled sample stands in for the shared trace, which a checkout may not have
    cmd = [sys.executable, str(SCRIPT), "--trace", str(default_trace_path()), "--requests", "30", "--reps", "1",
           "--page-size", "128", "--device-pages", "64", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HiCache full replay" in proc.stdout and "achieved/ceiling" in proc.stdout
    data = json.loads(out.read_text())
    s = data["summary"]
    assert set(s) == {"default", "hicache", "hicache_file"} and data["requests"] == 30
    assert s["default"]["p90_vs_default"] == pytest.approx(1.0)
    assert all(s[c]["verify_mismatch_pages"] == 0 for c in s)
    file_dirs = s["hicache_file"]["transfers"]
    assert file_dirs["storage_write"]["bytes"] > 0 and file_dirs["storage_write"]["achieved_gbps"] > 0
    assert file_dirs["storage_write"]["ratio"] > 0


def test_bench_hicache_bad_trace(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--trace", str(tmp_path / "missing.jsonl"), "--reps", "1"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "cannot read the trace" in proc.stderr and "Traceback" not in proc.stderr
