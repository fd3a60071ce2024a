"""``job=plan`` through the real command line: target hardware, no allocation, clear errors."""
import csv
import json
import os
import subprocess
import sys

import pytest

GB = 10 ** 9


def run(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_llama3_8b_on_h100(tmp_path):
    r = run("job=plan", "model=llama3_8b", "hardware=h100_80gb", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "target h100_80gb: 80 GB GPU, 2000 GB host RAM, 8 GPU(s)/node" in out
    assert "weights 16.06 GB per GPU" in out and "bytes per token 131,072" in out
    assert "mem_fraction_static 0.866 of 80 GB GPU memory of h100_80gb minus 16.06 GB weights" in out
    assert not list(tmp_path.iterdir())      # nothing written for a single plan


def test_hicache_ratio_on_h100_as_json(tmp_path):
    r = run("job=plan", "model=llama3_8b", "hardware=h100_80gb", "memory=hicache", "memory.hicache_ratio=2",
            "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["target"] == "h100_80gb" and p["hardware"]["gpu_memory_gb"] == 80.0
    assert p["host_tokens"] == 2 * p["device_tokens"] + 1 and p["pin_memory"] is True
    assert p["host_bytes"] == p["host_tokens"] * 131072
    assert p["device_tokens"] * 131072 + p["weights_bytes"] <= 80 * GB * p["mem_fraction_static"]
    assert p["host_budget_reason"].startswith("hicache_ratio 2")


def test_decode_server_plan_shows_retraction_backup(tmp_path):
    r = run("job=plan", "model=qwen2_7b", "hardware=h200_141gb", "disagg=decode", "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["retraction_backup"] == "host_pool" and p["hicache"] is False
    assert 0 < p["host_tokens"] < p["device_tokens"]


def test_plan_errors_exit_2_without_traceback(tmp_path):
    r = run("job=plan", "hardware=h100", cwd=tmp_path)
    assert r.returncode == 2 and "available: a100_80gb, h100_80gb, h200_141gb, l40s_48gb, local" in r.stderr
    r = run("job=plan", "model.model_path=org/some-model", "hardware=h100_80gb", cwd=tmp_path)
    assert r.returncode == 2 and "model.model_path (--model-path)" in r.stderr and "config.json" in r.stderr
    r = run("job=plan", "model=llama3_8b", "hardware=h100_80gb", "memory=hicache", "memory.hicache_ratio=0.5",
            cwd=tmp_path)
    assert r.returncode == 2 and "memory.hicache_ratio (--hicache-ratio): 0.5" in r.stderr
    r = run("job=setup", "hardware=a100_80gb", cwd=tmp_path)
    assert r.returncode == 2 and "use job=plan" in r.stderr
    for err in (r.stderr,):
        assert "Traceback" not in err
    # job=resolve keeps accepting any model path
    r = run("job=resolve", "model.model_path=org/some-model", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("model_path: org/some-model")


def test_sweep_over_machines(tmp_path):
    r = run("-m", "job=plan", "model=llama3_8b", "hardware=h100_80gb,h200_141gb", "memory=hicache",
            "memory.hicache_ratio=2", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((tmp_path / "sweep" / "summary.csv").open()))
    assert [row["hardware"] for row in rows] == ["h100_80gb", "h200_141gb"]
    h100, h200 = (int(row["device_tokens"]) for row in rows)
    assert h200 > h100 * 2          # 141 GB vs 80 GB, same 16 GB of weights


def test_local_plan_with_stated_host_memory(tmp_path):
    r = run("job=plan", "memory=hicache", "hardware.host_memory_gb=32", "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["target"] == "local" and p["hardware"]["host_memory_gb"] == 32
    assert "host_memory_gb" not in p["hardware"]["measured"]
    assert p["host_memory"]["note"].startswith("32 GB, hardware.host_memory_gb")
    assert p["device_bytes"] <= (256 << 20) + p["bytes_per_page"]     # a CPU stand-in pool: a few hundred MiB
