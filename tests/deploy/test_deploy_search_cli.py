"""job=deploy_search through the real command line: outputs, a launchable best deployment, bad input."""
import json
import os
import subprocess
import sys

import pytest
import yaml

SMALL = ["model=llama3_1_8b", "hardware=h100_80gb", "deploy.total_gpus=4", "job.trace=sample", "job.max_requests=150",
         "job.search.tp=[1,2]", "job.processes=1"]


def run(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


def search(tmp_path, *extra, out="search"):
    return run("job=deploy_search", *SMALL, "job.sla.ttft_ms=3000", "job.sla.tpot_ms=60", f"job.output_dir={out}",
               *extra, cwd=tmp_path)


def test_search_writes_its_outputs_and_a_launchable_best(tmp_path):
    r = search(tmp_path, "job.format=json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["best"]["mode"] in ("agg", "disagg") and data["best"]["tokens_per_s_per_gpu"] > 0
    rows = data["deployments"]
    assert data["schema_version"] == 3
    assert len(rows) > 10 and data["deployments_evaluated"] == sum(r["status"] != "skipped" for r in rows)
    assert all(row["gpus_used"] <= 4 for row in rows)
    assert all(row["gpus_used"] + row["gpus_idle"] == 4 for row in rows)
    # the question: the fewest GPUs holding the SLA at 1.25x the rate; nothing run with fewer GPUs holds it
    assert data["question"] == "both" and data["headroom"] == 1.25
    fewest = data["answers"]["fewest_gpus"]
    assert data["best"]["layout"] == fewest["layout"] and data["best"]["gpus_used"] == fewest["gpus_used"]
    assert not any(row["meets_sla"] for row in rows if row["gpus_used"] < fewest["gpus_used"])
    assert all(row["status"] != "skipped" for row in rows if row["gpus_used"] < fewest["gpus_used"])
    # the answer's headroom: holds at 1.25x, breaks above it, found by the search
    assert fewest["sla_break_rate_rps"] > fewest["evaluated_at_rps"] == 1.25 * data["trace_rate_rps"]
    assert 0 < fewest["busy_share"] <= 1 and fewest["busy_share_at_trace_rate"] <= 1
    # side-explicit layouts: workers x tp for aggregated rows, each side for disaggregated ones
    for row in rows:
        assert "closest" not in row and "policy" not in row and "goodput_share" not in row
        assert row["eviction_policy"] and 0 <= row["sla_met_share"] <= 1 and row["requests_total"] == 150
        if row["mode"] == "agg":
            assert row["workers"] * row["tp"] * row["dp"] == row["gpus_used"] and row["prefill_workers"] is None
        else:
            assert row["workers"] is None and row["tp"] is None
            assert row["prefill_workers"] * row["prefill_tp"] + row["decode_workers"] * row["decode_tp"] \
                == row["gpus_used"]
    table = (tmp_path / "search" / "summary.csv").read_text().splitlines()
    head = table[0].split(",")
    at = head.index("gpus_used")
    assert head[at + 1:at + 7] == ["workers", "tp", "prefill_workers", "prefill_tp", "decode_workers", "decode_tp"]
    assert "closest" not in head and len(table) == len(rows) + 1
    out = tmp_path / "search"
    for name in ("summary.csv", "pareto.png", "best_deploy.yaml", "deploy_search.json"):
        assert (out / name).stat().st_size > 0
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    best = yaml.safe_load((out / "best_deploy.yaml").read_text())
    assert best["deploy"]["total_gpus"] == 4 and best["hardware"] == "h100_80gb"
    text = (out / "best_deploy.yaml").read_text()
    assert f"# uses {fewest['gpus_used']} of the 4 GPUs ({4 - fewest['gpus_used']} idle)" in text
    launched = run("--config", str(out / "best_deploy.yaml"), "job=launch", "job.dry_run=true", cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    servers = [line for line in launched.stdout.splitlines() if "sglang.launch_server" in line]
    best_row = data["best"]
    assert len(servers) == ((best_row["workers"] if best_row.get("dp", 1) == 1 else 1) if best_row["mode"] == "agg"
                            else best_row["prefill_workers"] + best_row["decode_workers"])
    assert all("--model-path meta-llama/Meta-Llama-3.1-8B" in line for line in servers)
    # the file names the model preset, so the jobs that need its KV geometry take it back too
    assert best["model"] == "llama3_1_8b"
    replayed = run("--config", str(out / "best_deploy.yaml"), "job=replay", "job.max_requests=20", "job.format=json",
                   cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    # the same directory again is refused, before anything is computed
    again = search(tmp_path)
    assert again.returncode == 2 and "job.output_dir: 'search' already holds a deploy search" in again.stderr


def test_table_and_rate_search(tmp_path):
    r = search(tmp_path, "job.rate_search=true", "job.search.modes=[agg]", "job.max_requests=60")
    assert r.returncode == 0, r.stderr
    assert "deployments ranked by output tokens/s per GPU at the highest request rate" in r.stdout
    assert "max req/s" in r.stdout and "best: agg" in r.stdout
    assert "launch it: sglang-hydra --config search/best_deploy.yaml job=launch job.dry_run=true" in r.stdout


def test_a_policy_plain_sglang_lacks_is_marked_when_it_is_best(tmp_path):
    r = search(tmp_path, "job.search.policies=[ghost_lru]", "job.search.modes=[agg]", "job.search.tp=[2]")
    assert r.returncode == 0, r.stderr
    assert "ghost_lru*" in r.stdout and "* not in SGLang 0.5.23" in r.stdout
    assert "note: the best deployment uses eviction policy 'ghost_lru', which SGLang 0.5.23 does not have" in r.stderr
    text = (tmp_path / "search" / "best_deploy.yaml").read_text()
    assert text.startswith("# NOT RUNNABLE ON PLAIN SGLang 0.5.23: eviction policy 'ghost_lru'")
    data = json.loads((tmp_path / "search" / "deploy_search.json").read_text())
    assert data["best"]["runnable"] is False and "plugin" in data["best"]["engine_note"]


@pytest.mark.parametrize("args, lines", [
    ((), ["job.sla.ttft_ms: is required", "job.sla.tpot_ms: is required"]),
    (("job.sla.ttft_ms=1000", "job.sla.tpot_ms=50", "job.search.router_policies=[least_load,manual]"),
     ["job.search.router_policies: 'least_load' is not a policy sglang-router 0.3.2 offers",
      "job.search.router_policies: 'manual' routes by a request header a trace does not carry"]),
    (("job.sla.ttft_ms=1000", "job.sla.tpot_ms=50", "deploy.router_policy=manual"),
     ["deploy.router_policy: 'manual' routes by a request header a trace does not carry"]),
    (("job.sla.ttft_ms=1000", "job.sla.tpot_ms=50", "deploy.router_policy=fastest"),
     ["deploy.router_policy: 'fastest' is not a policy sglang-router 0.3.2 offers"]),
    (("job.sla.ttft_ms=1000", "job.sla.tpot_ms=50", "job.search.tp=[8]"),
     ["job.search.tp: every TP size (8) is over deploy.total_gpus 4"]),
    (("job.sla.ttft_ms=1", "job.sla.tpot_ms=0.5"),
     ["job.sla: no deployment meets P90 TTFT <= 1 ms and P90 TPOT <= 0.5 ms on this trace at 1.25x the trace's "
      "rate (job.sla.headroom); the closest"]),
    (("job.sla.ttft_ms=1000", "job.sla.tpot_ms=50", "job.sla.headroom=0.5", "job.search.question=cheapest",
      "job.search.levers=[hicache,tp]", "job.sla.max_busy_share=2", "job.search.executor=slurm"),
     ["job.sla.headroom: 0.5 is not a multiple of the trace's rate of at least 1",
      "job.search.question: 'cheapest' is not one of: both, fewest_gpus, best_service, all",
      "job.search.levers: 'tp' is not one of: router_policy, dp, hicache, chunked_prefill",
      "job.sla.max_busy_share: 2.0 is not a share in (0, 1]",
      "job.search.executor: 'slurm' is not one of: local, ray_local, ray"]),
    (("job.sla.ttft_ms=1000", "job.sla.tpot_ms=50", "deploy.workers=3", "parallel.tp_size=2"),
     ["deploy.workers: deploy.workers 3 x parallel.tp_size 2"]),
    (("job.sla.ttft_ms=1000", "job.sla.tpot_ms=50", "job.sla.percentile=95", "job.search.hicache_ratio=[0.5]"),
     ["job.sla.percentile: 95 is not one of: 50, 90, 99", "job.search.hicache_ratio: 0.5"]),
])
def test_bad_input_is_exit_2_with_one_line_per_problem(tmp_path, args, lines):
    r = run("job=deploy_search", *SMALL, *args, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    for line in lines:
        assert f"  - {line}" in r.stderr, r.stderr
    assert not (tmp_path / "outputs").exists() or not any((tmp_path / "outputs").rglob("best_deploy.yaml"))


def test_a_decode_pool_that_cannot_hold_the_longest_request(tmp_path):
    trace = tmp_path / "huge.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 5_000_000, "output_length": 10,
                                 "hash_ids": list(range(9766))}) + "\n")
    r = run("job=deploy_search", *[a for a in SMALL if not a.startswith("job.trace")], f"job.trace={trace}",
            "job.sla.ttft_ms=1000", "job.sla.tpot_ms=50", cwd=tmp_path)
    assert r.returncode == 2 and "  - job.trace: no decode pool can hold the trace's longest request (5,000,010" \
        in r.stderr, r.stderr


def test_a_disaggregated_best_launches_as_xpyd(tmp_path):
    r = run("job=deploy_search", *SMALL, "job.sla.ttft_ms=10000", "job.sla.tpot_ms=60", "job.output_dir=search",
            "job.search.modes=[disagg]", "job.search.hicache_ratio=[2]", "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    best = json.loads(r.stdout)["best"]
    assert best["mode"] == "disagg"
    data = yaml.safe_load((tmp_path / "search" / "best_deploy.yaml").read_text())
    assert data["deploy"]["name"] == "pd" and data["prefill"]["memory"]["hicache_ratio"] == 2.0
    assert data["model"] == "llama3_1_8b"
    planned = run("--config", "search/best_deploy.yaml", "job=plan", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    launched = run("--config", "search/best_deploy.yaml", "job=launch", "job.dry_run=true", cwd=tmp_path)
    assert launched.returncode == 0, launched.stderr
    router = launched.stdout.splitlines()[-1]
    assert router.count("--prefill ") == best["prefill_workers"] and router.count("--decode ") == best["decode_workers"]
    assert "--enable-hierarchical-cache" in launched.stdout and "--hicache-ratio 2" in launched.stdout


def test_a_simulation_error_exits_1_with_its_message_not_a_rejected_row(tmp_path):
    # belady needs one engine's future; on two replicas the simulation refuses it: that is not a deployment
    # that does not fit, so the search stops with the message instead of ranking a row of zeros
    r = run("job=deploy_search", "model=llama3_1_8b", "hardware=h100_80gb", "deploy.total_gpus=2", "job.trace=sample",
            "job.max_requests=20", "job.search.tp=[1]", "job.processes=1", "job.search.policies=[belady]",
            "job.search.modes=[agg]", "job.sla.ttft_ms=3000", "job.sla.tpot_ms=60", "job.output_dir=out", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert "belady eviction policy needs the future of one engine's requests" in r.stderr
    assert "rejected" not in r.stdout
