"""The staged search answers its questions exactly as running every deployment would, stops
within a moment on SIGTERM/Ctrl-C leaving its finished rows, and runs the same on Ray."""
import csv
import json
import os
import signal
import subprocess
import sys

import pytest

SPACE = ["model=llama3_1_8b", "hardware=h100_80gb", "deploy.total_gpus=4", "job.trace=conversation",
         "job.max_requests=400", "job.search.tp=[1,2]", "job.sla.ttft_ms=3000", "job.sla.tpot_ms=60"]


def search(tmp_path, out, *extra, timeout=600):
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=deploy_search", *SPACE, f"job.output_dir={out}",
                        "job.format=json", *extra], cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def key(row):
    return (row["mode"], row["layout"], row["hicache_ratio"], row["eviction_policy"], row["router_policy"],
            row["chunked_prefill_size"])


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stages")
    staged, err = search(tmp, "staged")
    every, _ = search(tmp, "every", "job.search.question=all")
    return staged, every, err


def test_the_stages_give_the_answers_of_running_every_deployment(both):
    staged, every, _ = both
    # the grid's rows (the levers' variants are compared by margin, below)
    held = [r for r in every["deployments"] if r["meets_sla"] and not r.get("lever")]
    fewest = min(r["gpus_used"] for r in held)
    assert staged["answers"]["fewest_gpus"]["gpus_used"] == fewest or staged["answers"]["fewest_gpus"]["changed_by_lever"]
    # the best service from all 4 GPUs: the lowest latency against the bounds of those that hold
    # (the levers may only improve on it, by more than the margin)
    full = [r for r in held if r["gpus_used"] == 4]
    best_full = min(full, key=lambda r: r["sla_latency_ratio"])
    service = staged["answers"]["best_service"]
    if service["changed_by_lever"]:
        assert service["sla_latency_ratio"] < best_full["sla_latency_ratio"] * 0.95
    else:
        assert service["sla_latency_ratio"] == best_full["sla_latency_ratio"]
        assert service["layout"] == best_full["layout"]


def test_the_stages_change_which_deployments_run_not_their_figures(both):
    staged, every, _ = both
    by_key = {key(r): r for r in every["deployments"]}
    finished = [r for r in staged["deployments"] if r["status"] == "ok" and key(r) in by_key]
    assert len(finished) >= 3
    for r in finished:
        other = by_key[key(r)]
        for k in ("ttft_p90_ms", "tpot_p90_ms", "tokens_per_s_per_gpu", "goodput_rps_per_gpu", "busy_share"):
            assert r[k] == other[k], (key(r), k)
    # what the stages leave out is said, row by row
    skipped = [r for r in staged["deployments"] if r["status"] == "skipped"]
    assert all(r["note"] for r in skipped)
    assert staged["deployments_evaluated"] + len(skipped) == len(staged["deployments"])


def test_every_row_shows_gpus_idle_busy_and_where_it_breaks(both):
    staged, _, err = both
    for r in staged["deployments"]:
        assert r["gpus_used"] + r["gpus_idle"] == 4
        if r["status"] in ("ok", "saturated"):
            assert 0 <= r["busy_share"] <= 1
            # holds at the design rate: breaks above it; misses there: breaks below it
            assert (r.get("sla_holds_at_rps") or 0) > 0 if r["meets_sla"] else (r.get("sla_breaks_by_rps") or 0) > 0
    for a in staged["answers"].values():
        assert a["sla_holds_at_rps"] < a["sla_break_rate_rps"]
    # one line per stage on a pipe (no terminal, so no bar)
    assert "deploy_search: fewest GPUs and best service:" in err and "deploy_search: break rates:" in err


def test_the_levers_are_reported_against_the_answer(both):
    staged, _, _ = both
    lines = [line for a in staged["answers"].values() for line in a["levers"]]
    assert any(line.startswith("deploy.router_policy=round_robin") for line in lines)
    assert any(line.startswith("memory.hicache_ratio=2") for line in lines)
    assert any("in-server DP" in line for line in lines)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_an_interrupted_search_leaves_its_finished_rows_and_failed_csv(tmp_path, sig, code):
    p = subprocess.Popen([sys.executable, "-m", "sglang_hydra", "job=deploy_search", "model=llama3_1_8b",
                          "hardware=h100_80gb", "deploy.total_gpus=8", "job.trace=conversation",
                          "job.sla.ttft_ms=2000", "job.sla.tpot_ms=50", "job.output_dir=cut"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # well inside the first pass (it takes tens of seconds on the full trace): runs have finished
    # and others are running
    try:
        p.wait(timeout=12)
    except subprocess.TimeoutExpired:
        pass
    assert p.returncode is None, "the search ended before it could be interrupted"
    p.send_signal(sig)
    _out, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert "Traceback" not in err and "deploy_search interrupted in stage" in err
    rows = list(csv.DictReader((tmp_path / "cut" / "summary.csv").open()))
    failed = list(csv.DictReader((tmp_path / "cut" / "failed.csv").open()))
    assert rows and failed
    assert {f["status"] for f in failed} <= {"interrupted", "not started", "rejected"}
    assert any(f["status"] == "interrupted" for f in failed) and any(f["status"] == "not started" for f in failed)
    assert json.loads((tmp_path / "cut" / "deploy_search.json").read_text())["interrupted"] is True
    assert not (tmp_path / "cut" / "best_deploy.yaml").exists()


@pytest.mark.slow
def test_ray_gives_the_local_pools_results(tmp_path):
    pytest.importorskip("ray")
    extra = ("job.search.question=all", "job.search.levers=[]", "job.max_requests=200")
    local, _ = search(tmp_path, "local", *extra)
    on_ray, _ = search(tmp_path, "ray", *extra, "job.search.executor=ray_local", timeout=900)
    assert [key(r) for r in on_ray["deployments"]] == [key(r) for r in local["deployments"]]
    assert (tmp_path / "ray" / "summary.csv").read_bytes() == (tmp_path / "local" / "summary.csv").read_bytes()
    assert on_ray["best"] == local["best"]


def test_replay_of_one_server_names_no_router(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=replay", "model=llama3_1_8b", "hardware=h100_80gb",
                        "job.max_requests=50", "hydra.run.dir=one"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, COLUMNS="200"))
    assert r.returncode == 0, r.stderr
    assert "no router (one server)" in r.stdout and "router cache_aware" not in r.stdout
    doc = json.loads((tmp_path / "one" / "metrics.json").read_text())
    assert doc["deployment"]["router_policy"] is None and "router_cache_routed" not in doc["load"]
