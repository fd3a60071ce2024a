"""job.mode=device_only (one tier, HiCache off) and its former name, metadata."""
import json
import os
import subprocess
import sys

BASE = ("job=replay", "model=llama3_1_8b", "hardware=h100_80gb", "job.max_requests=40", "job.format=json")


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *BASE, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))


def test_device_only_is_the_default_without_hicache_and_metadata_still_means_it(tmp_path):
    default, new, old = run(cwd=tmp_path), run("job.mode=device_only", cwd=tmp_path), \
        run("job.mode=metadata", cwd=tmp_path)
    assert default.returncode == new.returncode == old.returncode == 0, old.stderr[-2000:]
    docs = [json.loads(r.stdout) for r in (default, new, old)]
    assert [d["deployment"]["cache_mode"] for d in docs] == ["device_only"] * 3
    assert docs[0]["cache"] == docs[1]["cache"] == docs[2]["cache"]
    note = "job.mode=metadata is now job.mode=device_only (the device tier only, HiCache off)"
    assert note in old.stderr and note not in new.stderr and note not in default.stderr


def test_an_unknown_mode_lists_the_names(tmp_path):
    r = run("job.mode=metadatas", cwd=tmp_path)
    assert r.returncode == 2 and "job.mode" in r.stderr and "device_only" in r.stderr
