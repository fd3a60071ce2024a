"""Jobs through the real command line: replay (and its sweep summary), setup, pd_pair."""
import csv
import json
import os
import subprocess
import sys

import pytest


def run(*args, cwd, timeout=240):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


TARGET = ("model=llama3_1_8b", "hardware=h100_80gb")


def test_replay_writes_metrics_json(tmp_path):
    r = run("job=replay", *TARGET, "schedule.page_size=512", "schedule.max_total_tokens=1024000",
            "memory.radix_eviction_policy=slru", "job.max_requests=400", "job.format=json",
            f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert data["requests"]["requests_total"] == 400 and data["deployment"]["eviction_policy"] == "slru"
    assert data["memory"]["device_capacity_tokens"] == 1024000
    assert 0 < data["cache"]["token_hit_rate"] < 1


def test_replay_bad_trace_line_is_reported_with_its_number(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n{bad json\n')
    r = run("job=replay", *TARGET, f"job.trace={trace}", "schedule.page_size=512", cwd=tmp_path)
    assert r.returncode == 2 and "t.jsonl:2:" in r.stderr and "Traceback" not in r.stderr
    r = run("job=replay", *TARGET, f"job.trace={trace}", "schedule.page_size=512", "job.on_bad_line=skip",
            f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["simulation"]["skipped_lines"] == 1


def test_sweep_summary_from_a_three_point_multirun(tmp_path):
    r = run("-m", "job=replay", *TARGET, "memory.radix_eviction_policy=lru,lfu,ghost_lru", "schedule.page_size=512",
            "schedule.max_total_tokens=512000", "job.max_requests=500", "job.objective=token_hit_rate",
            f"hydra.sweep.dir={tmp_path}/sweep",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((tmp_path / "sweep" / "summary.csv").open()))
    assert [row["memory.radix_eviction_policy"] for row in rows] == ["lru", "lfu", "ghost_lru"]
    assert all(float(row["token_hit_rate"]) > 0 for row in rows)
    assert "schedule.page_size" not in rows[0]  # only the overrides that differ
    assert (tmp_path / "sweep" / "summary.png").is_file()


def test_setup_job_plans_allocates_and_verifies(tmp_path):
    r = run("job=setup", "memory=hicache", "schedule.max_total_tokens=2048", "schedule.page_size=16",
            "memory.hicache_mem_layout=page_head", "job.verify=true", "job.format=json", "job.progress=false",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verify"]["ok"] is True
    assert out["plan"]["device_tokens"] == 2048


def test_setup_job_bad_layout_is_a_config_error(tmp_path):
    r = run("job=setup", "model=tiny_mla", "memory=hicache", "memory.hicache_mem_layout=page_head",
            "schedule.max_total_tokens=2048", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "hicache_mem_layout" in r.stderr and "Traceback" not in r.stderr


def test_pd_pair_zmq(tmp_path):
    r = run("job=pd_pair", "model=tiny", "disagg.disaggregation_transfer_backend=zmq", "job.requests=20",
            "schedule.max_total_tokens=8192", "schedule.page_size=16",
            "disagg.disaggregation_enable_kv_checksum=true", "job.timeout=90", cwd=tmp_path, timeout=150)
    assert r.returncode == 0, r.stderr
    assert "ok=20 failed=0" in r.stdout


def test_replay_with_the_hit_density_policy_and_its_config(tmp_path):
    """The learned-retention policy through the command line, under both cache semantics;
    a key it does not take exits 2 with one line naming it."""
    for semantics in ("rules", "sglang"):
        r = run("job=replay", *TARGET, "schedule.page_size=512", "schedule.max_total_tokens=512000",
                "memory.radix_eviction_policy=hit_density", "memory.radix_eviction_policy_config={epoch:50,classes:3}",
                f"job.cache_semantics={semantics}", "job.max_requests=600", "job.format=json",
                f"hydra.run.dir={tmp_path}/{semantics}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        data = json.loads((tmp_path / semantics / "metrics.json").read_text())
        assert data["deployment"]["eviction_policy"] == "hit_density"
        assert 0 < data["cache"]["token_hit_rate"] < 1
    r = run("job=replay", *TARGET, "schedule.page_size=512", "memory.radix_eviction_policy=hit_density",
            "memory.radix_eviction_policy_config={alpha:2}", "job.max_requests=10", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "alpha" in ln]
    assert len(lines) == 1 and "unknown key 'alpha'" in lines[0] and "'hit_density'" in lines[0], r.stderr
