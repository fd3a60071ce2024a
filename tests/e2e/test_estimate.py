"""``job=estimate`` through the real command line: table, exact JSON keys, sweeps, bad input."""
import csv
import json
import os
import subprocess
import sys

import pytest

KEYS = ["ttft_ms", "tpot_ms", "tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "memory"]
MEMORY_KEYS = ["weights_gb", "kv_gb", "kv_pool_gb", "kv_pool_tokens", "max_batch_size", "fits"]


def run(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_table_for_the_issue_example(tmp_path):
    r = run("job=estimate", "model=llama3_1_8b", "hardware=h100_80gb", "parallel.tp_size=2", "job.isl=4096",
            "job.osl=512", "job.batch_size=64", "job.prefix=1024", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "64 x (isl 4096, prefix 1024, osl 512)" in out and "tp 2" in out
    for key in KEYS[:-1]:
        assert key in out
    assert "weights 8.03 GB" in out and "fits" in out
    assert not list(tmp_path.iterdir())        # a single estimate writes nothing


def test_json_has_exactly_the_keys(tmp_path):
    r = run("job=estimate", "model=llama3_1_70b", "hardware=h200_141gb", "--tp", "8", "job.isl=8192", "job.osl=256",
            "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert list(d) == KEYS and list(d["memory"]) == MEMORY_KEYS
    assert d["memory"]["fits"] is True and d["memory"]["max_batch_size"] >= 1
    assert d["tokens_per_s_per_gpu"] == pytest.approx(d["tokens_per_s"] / 8)
    assert d["tokens_per_s_per_user"] == pytest.approx(1000.0 / d["tpot_ms"])
    # batch 1: output tokens over the request's whole time
    assert d["tokens_per_s"] == pytest.approx(256 / ((d["ttft_ms"] + 255 * d["tpot_ms"]) / 1000), rel=1e-9)
    assert 0 < d["tpot_ms"] < d["ttft_ms"]


def test_more_gpus_are_faster_and_bigger_batches_more_productive(tmp_path):
    def est(*extra):
        r = run("job=estimate", "model=qwen3_32b", "hardware=h100_80gb", "job.format=json", *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    tp1, tp4 = est("parallel.tp_size=1"), est("parallel.tp_size=4")
    assert tp4["ttft_ms"] < tp1["ttft_ms"] and tp4["tpot_ms"] < tp1["tpot_ms"]
    b1, b64 = est("--tp", "2", "job.batch_size=1"), est("--tp", "2", "job.batch_size=64")
    assert b64["tokens_per_s"] > 10 * b1["tokens_per_s"] and b64["tpot_ms"] > b1["tpot_ms"]


def test_sweep_keeps_a_batch_that_does_not_fit_as_infeasible(tmp_path):
    r = run("-m", "job=estimate", "model=qwen3_32b", "hardware=h100_80gb", "parallel.tp_size=1",
            "job.batch_size=1,64", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    points = [json.loads(p.read_text()) for p in sorted((tmp_path / "sweep").glob("*/metrics.json"))]
    assert sorted(p["status"] for p in points) == ["infeasible", "ok"]
    bad = next(p for p in points if p["status"] == "infeasible")
    assert "such requests fit" in bad["status_reason"] and bad["memory_fits"] is False
    assert "infeasible" in r.stderr and "Traceback" not in r.stderr


def test_sweep_writes_metrics_per_point(tmp_path):
    r = run("-m", "job=estimate", "model=qwen3_32b", "hardware=h100_80gb", "parallel.tp_size=2,4",
            "job.batch_size=1,16", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    metrics = sorted((tmp_path / "sweep").glob("*/metrics.json"))
    assert len(metrics) == 4
    for path in metrics:
        m = json.loads(path.read_text())
        assert m["status"] == "ok" and m["ttft_ms"] > 0 and m["memory_fits"] is True
        assert {"parallel.tp_size", "job.batch_size"} <= set(m)
    summary = tmp_path / "sweep" / "summary.csv"
    if summary.exists():          # the sweep callback tabulates the points it finds
        rows = list(csv.DictReader(summary.open()))
        assert len(rows) == 4 and all(float(row["tpot_ms"]) > 0 for row in rows)


@pytest.mark.parametrize("args, key, words", [
    (["job.isl=0"], "job.isl", "must be an integer >= 1"),
    (["job.isl=4096", "job.prefix=4096"], "job.prefix", "must be below job.isl"),
    (["job.batch_size=100000", "job.isl=4000", "job.osl=100"], "job.batch_size", "such requests fit"),
    (["--tp", "3"], "parallel.tp_size (--tp)", "does not divide model.num_attention_heads=32"),
    (["model.intermediate_size=null"], "model.intermediate_size", "is not set"),
    (["--dp", "2"], "parallel.dp_size (--dp)", "data parallelism"),
    (["job.isl=131072", "job.osl=10"], "job.isl", "exceeds the model's context"),
])
def test_bad_input_exits_2_naming_the_key(tmp_path, args, key, words):
    r = run("job=estimate", "model=llama3_1_8b", "hardware=h100_80gb", *args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    line = next(ln for ln in r.stderr.splitlines() if ln.strip().startswith(f"- {key}"))
    assert words in line


def test_all_problems_at_once(tmp_path):
    r = run("job=estimate", "model=llama3_1_8b", "hardware=h100_80gb", "job.isl=0", "--tp", "3", "--dp", "2",
            cwd=tmp_path)
    assert r.returncode == 2 and "3 configuration problems" in r.stderr and "Traceback" not in r.stderr


def test_moe_without_expert_shapes_says_so(tmp_path):
    r = run("job=estimate", "model=deepseek_v3", "hardware=h200_141gb", "--tp", "8", "model.num_experts_per_tok=0",
            cwd=tmp_path)
    assert r.returncode == 2 and "model.num_experts_per_tok" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("job", ["plan", "setup"])
def test_single_engine_jobs_refuse_data_parallel(tmp_path, job):
    r = run(f"job={job}", "model=llama3_8b", "hardware=h100_80gb", "--dp", "2", cwd=tmp_path)
    assert r.returncode == 2 and "parallel.dp_size (--dp)" in r.stderr and "Traceback" not in r.stderr
