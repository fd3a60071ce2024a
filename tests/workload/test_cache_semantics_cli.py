"""job.cache_semantics through the CLI: the metadata replay runs SGLang's node-granular cache."""
import json
import os
import subprocess
import sys

from sglang_hydra.config.testing import make_record
from sglang_hydra.workload import load_trace, replay
from sglang_hydra.workload.trace import trace_path


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


def test_replay_job_runs_either_semantics(tmp_path):
    """With arrivals 1000x apart every request is served alone, in order: the deployment
    simulation's device hits then equal the one-at-a-time replay of each semantics."""
    reqs = list(load_trace(trace_path("conversation")))[:3000]
    rec = make_record(page_size=512, max_total_tokens=1000 * 512)
    expect = {s: replay(rec, reqs, cache_semantics=s).hit_pages for s in ("rules", "sglang")}
    assert expect["rules"] != expect["sglang"]          # whole-node eviction shows at this size
    for semantics in ("rules", "sglang"):
        out = tmp_path / semantics
        r = run("job=replay", "job.trace=conversation", "job.max_requests=3000", f"job.cache_semantics={semantics}",
                "job.progress=false", "job.format=json", "schedule.page_size=512", "model=llama3_1_8b",
                "hardware=h100_80gb", "job.time_scale=1000", "job.arrival=as_is",
                f"schedule.max_total_tokens={1000 * 512}", f"hydra.run.dir={out}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        data = json.loads((out / "metrics.json").read_text())
        assert data["simulation"]["cache_semantics"] == semantics
        assert data["cache"]["tier_counts"]["device_hit_pages"] == expect[semantics]


def test_bad_semantics_exit_2_with_one_line(tmp_path):
    r = run("job=replay", "job.cache_semantics=engine", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "job.cache_semantics: 'engine' is not one of: rules, sglang" in r.stderr
    r = run("job=replay", "memory=hicache", "job.cache_semantics=sglang", "job.max_requests=10", "model=llama3_1_8b",
            "hardware=h100_80gb", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("  - ")]
    assert "job.cache_semantics: sglang models the engine's one-tier radix cache" in line
    assert not any(tmp_path.glob("**/metrics.json"))
