"""job=replay through the real command line: the schema, bad input, rejections, sweeps, and deploy=pd."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sglang_hydra.workload.metrics import flatten_metrics

BASE = ("model=llama3_1_8b", "hardware=h100_80gb")


def run(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_metrics_json_is_schema_3_with_unique_unit_suffixed_leaves(tmp_path):
    r = run("job=replay", *BASE, "parallel.dp_size=2", "job.max_requests=200", "job.format=json",
            "job.trace='sample'", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert doc == json.loads(r.stdout)
    assert sorted(p.name for p in (tmp_path / "run").glob("*.json")) == ["metrics.json"]     # one metrics file
    assert doc["schema_version"] == 3 and doc["status"] in ("ok", "saturated", "rejected")
    for group in ("settings", "deployment", "requests", "latency", "throughput", "cache", "memory"):
        assert isinstance(doc[group], dict), group
    flat = flatten_metrics(doc)                 # raises if a leaf name repeats
    for key in ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_unloaded_p90_ms", "tpot_p50_ms", "tpot_p90_ms",
                "tpot_p99_ms", "itl_p90_ms", "e2e_p90_ms", "tokens_per_s", "tokens_per_s_per_gpu",
                "tokens_per_s_per_user", "goodput_rps_per_gpu", "requests_per_s", "token_hit_rate",
                "device_hit_tokens", "device_capacity_tokens", "host_memory_gb", "requests_total",
                "requests_completed", "rejected_requests", "objective", "objective_direction"):
        assert key in flat, key
    # each quantity once: no copy of the objective's value, no second unit of host memory
    assert "objective_value" not in flat and "host_memory_bytes" not in flat
    assert doc["objective"] == {"objective": "ttft_p90_ms", "objective_direction": "minimize"}
    assert doc["settings"]["override job.trace"] == "sample"          # the value, not "'sample'"
    assert doc["deployment"]["dp_size"] == 2 and doc["deployment"]["gpus"] == 2
    assert doc["settings"]["override parallel.dp_size"] == "2"      # overrides never overwrite results
    assert flat["ttft_p90_ms"] >= flat["ttft_unloaded_p90_ms"] > 0
    assert flat["device_capacity_tokens"] > 0 and isinstance(doc["not_modelled"], list)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_time_scale_must_be_positive(tmp_path, value):
    r = run("job=replay", *BASE, f"job.time_scale={value}", cwd=tmp_path)
    assert r.returncode == 2 and "job.time_scale" in r.stderr and "Traceback" not in r.stderr


def test_objective_a_mode_cannot_produce_is_exit_2(tmp_path):
    r = run("job=replay", *BASE, "job.objective=transfer_p90_ms", cwd=tmp_path)
    assert r.returncode == 2 and "job.objective" in r.stderr and "deploy=pd" in r.stderr
    r = run("job=replay", *BASE, "job.objective=block_hit_rate", cwd=tmp_path)
    assert r.returncode == 2 and "job.objective" in r.stderr


def test_requests_longer_than_the_context_are_rejected_and_said(tmp_path):
    # llama3_8b has an 8,192-token context; the sample's long prompts are refused as SGLang refuses them
    r = run("job=replay", "model=llama3_8b", "hardware=h100_80gb", "job.max_requests=100",
            f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "run" / "metrics.json").read_text())
    req = doc["requests"]
    assert req["rejected_requests"] > 0 and req["requests_completed"] + req["rejected_requests"] == 100
    assert set(req["rejected_reasons"]) <= {"input_longer_than_context", "input_plus_output_over_context"}
    assert doc["status"] == "rejected" and "rejected" in r.stderr
    r = run("job=replay", "model=llama3_8b", "hardware=h100_80gb", "job.max_requests=100",
            "serving.allow_auto_truncate=true", f"hydra.run.dir={tmp_path}/trunc", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    req = json.loads((tmp_path / "trunc" / "metrics.json").read_text())["requests"]
    assert req["rejected_requests"] == 0 and req["truncated_requests"] > 0


def test_sweep_over_dp_size_and_a_setting_it_does_not_model(tmp_path):
    r = run("-m", "job=replay", *BASE, "parallel.dp_size=1,4", "observability.log_level=info,warning",
            "job.max_requests=300", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    docs = [json.loads((tmp_path / "sweep" / str(i) / "metrics.json").read_text()) for i in range(4)]
    by_dp = {}
    for d in docs:
        by_dp.setdefault(d["deployment"]["dp_size"], []).append(d["latency"]["ttft_p90_ms"])
    assert max(by_dp[4]) < min(by_dp[1])                       # dp_size is modelled
    assert len(set(by_dp[1])) == 1                              # log_level is not ...
    assert all(any("observability.log_level" in x for x in d["not_modelled"]) for d in docs)
    assert "observability.log_level=info: not modelled" in r.stderr   # ... and the sweep says so


def test_deploy_pd_replay_in_process(tmp_path):
    """The job on a PD deployment (both records) with its deploy settings: TTFT includes the transfer."""
    from sglang_hydra.config.compose import compose
    from sglang_hydra.jobs.context import JobContext
    from sglang_hydra.jobs.replay import run as replay

    pre, composed = compose(list(BASE) + ["disagg.disaggregation_transfer_backend=nixl"])
    dec, _ = compose(list(BASE) + ["parallel.tp_size=2"])
    target = SimpleNamespace(servers=(SimpleNamespace(role="prefill", record=pre),
                                      SimpleNamespace(role="decode", record=dec)))
    job = dict(composed.job, max_requests=200, progress=False, format="json")
    ctx = JobContext(output_dir=tmp_path, hardware=composed.hardware,
                     deploy={"prefill_workers": 3, "decode_workers": 1, "router_policy": "round_robin"})
    replay(target, job, ctx)
    doc = json.loads((tmp_path / "metrics.json").read_text())
    dep = doc["deployment"]
    assert dep["deploy_mode"] == "disagg" and dep["gpus"] == 3 * 1 + 1 * 2
    assert dep["transfer_backend"] == "nixl" and dep["prefill_servers"] == 3 and dep["decode_tp_size"] == 2
    assert doc["latency"]["transfer_p90_ms"] > 0
    assert doc["requests"]["requests_completed"] > 0


def test_a_hardware_field_an_aggregated_deployment_does_not_read_is_reported(tmp_path):
    """The PD pass scales and the NIC move only a disaggregated deployment: on an aggregated one a
    sweep over them gives identical rows and says so (a PD sweep reads them: test_sweeps.py)."""
    r = run("-m", "job=replay", *BASE, "hardware.disagg_decode_pass_scale=1.0,1.5", "job.max_requests=100",
            f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    docs = [json.loads((tmp_path / "sweep" / str(i) / "metrics.json").read_text()) for i in range(2)]
    assert docs[0]["latency"] == docs[1]["latency"]
    assert all(any("hardware.disagg_decode_pass_scale" in x for x in d["not_modelled"]) for d in docs)
    assert "hardware.disagg_decode_pass_scale=1.0: not modelled" in r.stderr
