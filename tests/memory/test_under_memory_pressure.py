"""Jobs that allocate KV memory here must not pass or fail with what else holds memory.

A child process holds 12 GiB of real, touched memory (half of a 24 GiB machine) while setup, a
PD pair and a full replay run through the CLI with their default sizing.  The local plan must
come out identical with and without it.  A machine with less than 15 GiB available fails these
tests (``memhog.NotEnoughMemory``): they never run under less pressure than they claim.
"""
import json
import os
import subprocess
import sys

import pytest

from memhog import GiB, hold_memory

HOLD = 12 * GiB


def run(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.fixture(scope="module")
def hog():
    with hold_memory(HOLD) as h:
        assert h.held == HOLD and h.rss_bytes() >= HOLD - (1 << 20), "the memory hog does not hold 12 GiB"
        yield h


def test_local_plan_is_the_same_with_12_gib_held(tmp_path):
    args = ("job=plan", "memory=hicache", "job.format=json")
    idle = run(*args, cwd=tmp_path)
    assert idle.returncode == 0, idle.stderr
    with hold_memory(HOLD) as h:
        assert h.held == HOLD and h.rss_bytes() >= HOLD - (1 << 20)
        busy = run(*args, cwd=tmp_path)
    assert busy.returncode == 0, busy.stderr
    a, b = json.loads(idle.stdout), json.loads(busy.stdout)
    for k in ("device_tokens", "host_tokens", "host_ratio", "host_budget_bytes", "device_budget_reason"):
        assert a[k] == b[k], k
    # the tiny model's CPU stand-in pools are what a run needs, not most of the RAM
    assert a["device_bytes"] <= (256 << 20) + a["bytes_per_page"] and a["host_bytes"] <= 2 * a["device_bytes"]


def test_setup_with_default_sizing_under_pressure(hog, tmp_path):
    r = run("job=setup", "memory=hicache", "job.verify=true", "job.rounds=2", "job.format=json",
            "job.progress=false", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verify"]["ok"] is True and out["plan"]["host_tokens"] > out["plan"]["device_tokens"]


def test_pd_pair_under_pressure(hog, tmp_path):
    r = run("job=pd_pair", "model=tiny", "disagg.disaggregation_transfer_backend=zmq", "job.requests=20",
            "schedule.max_total_tokens=8192", "schedule.page_size=16", "job.timeout=90", cwd=tmp_path, timeout=200)
    assert r.returncode == 0, r.stderr
    assert "ok=20 failed=0" in r.stdout


def test_full_replay_under_pressure(hog, tmp_path):
    r = run("job=replay", "memory=hicache", "job.mode=full", "model=tiny", "hardware=h100_80gb",
            "schedule.max_total_tokens=16384", "schedule.page_size=16", "job.max_requests=20", "job.format=json",
            "job.progress=false", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["requests"]["requests_total"] == 20
    assert out["memory"]["host_capacity_tokens"] == (2 * 16384 // 16 + 1) * 16
    assert out["full_mode"]["verify_mismatch_pages"] == 0


def test_the_hog_holds_what_it_says_or_fails():
    from memhog import NotEnoughMemory
    from sglang_hydra.memory.hostmem import meminfo_available_bytes
    with hold_memory(256 << 20, margin=0) as h:
        assert h.held == 256 << 20 and h.rss_bytes() >= (256 << 20) - (1 << 20)
    with pytest.raises(NotEnoughMemory, match="this test needs a machine with at least"):
        with hold_memory(meminfo_available_bytes() + GiB):
            pass
