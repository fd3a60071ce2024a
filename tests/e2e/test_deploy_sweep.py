"""-m sweeps over deployments (deploy=pd, deploy.* keys) and hydra.run.dir for one, through the real CLI."""
import csv
import json
import os
import subprocess
import sys

import yaml

PD = ("job=replay", "deploy=pd", "model=llama3_1_8b", "hardware=h100_80gb")


def run(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def rows(sweep_dir):
    with open(sweep_dir / "summary.csv") as fh:
        return list(csv.DictReader(fh))


def test_pd_sweep_over_prefill_workers_and_transfer_backend(tmp_path):
    r = run("-m", "job=replay", "deploy=pd", "deploy.prefill_workers=2,3,4",
            "disagg.disaggregation_transfer_backend=mooncake,zmq", "model=llama3_1_8b", "hardware=h100_80gb",
            "job.max_requests=200", "hydra.sweep.dir=sw", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sweep = tmp_path / "sw"
    table = rows(sweep)
    assert [(t["deploy.prefill_workers"], t["disagg.disaggregation_transfer_backend"]) for t in table] == [
        ("2", "mooncake"), ("2", "zmq"), ("3", "mooncake"), ("3", "zmq"), ("4", "mooncake"), ("4", "zmq")]
    assert all(t["status"] == "ok" for t in table)
    for n in range(6):           # each point is a deployment run of its own, as a single run writes it
        point = sweep / str(n)
        assert (point / "metrics.json").is_file() and not (point / "replay.json").exists()
        ovs = yaml.safe_load((point / ".hydra" / "overrides.yaml").read_text())
        assert f"deploy.prefill_workers={table[n]['deploy.prefill_workers']}" in ovs
        doc = json.loads((point / "metrics.json").read_text())
        assert doc["deployment"]["prefill_servers"] == int(table[n]["deploy.prefill_workers"])
        assert doc["deployment"]["transfer_backend"] == table[n]["disagg.disaggregation_transfer_backend"]
    by = {(t["deploy.prefill_workers"], t["disagg.disaggregation_transfer_backend"]): t for t in table}
    for workers in ("2", "3", "4"):     # the backend changes the KV transfer time
        assert float(by[workers, "zmq"]["transfer_p90_ms"]) != float(by[workers, "mooncake"]["transfer_p90_ms"])
    for backend in ("mooncake", "zmq"):     # more prefill servers: shorter queues before the first token
        assert float(by["4", backend]["ttft_p90_ms"]) < float(by["2", backend]["ttft_p90_ms"])
    for name in ("failed.csv", "summary.png", "pareto.png", "best_config.yaml"):
        assert (sweep / name).is_file(), name
    assert "sweep summary: 6 points" in r.stdout and "#5 : " in r.stdout
    # the best point's config replays the same deployment on its own
    best = min(table, key=lambda t: float(t["ttft_p90_ms"]))
    again = run("job=replay", "--config", "sw/best_config.yaml", "job.max_requests=200", "job.format=json",
                "hydra.run.dir=best", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    doc = json.loads((tmp_path / "best" / "metrics.json").read_text())
    assert abs(doc["latency"]["ttft_p90_ms"] - float(best["ttft_p90_ms"])) < 1e-6


def test_sweep_over_router_policy_of_aggregated_workers(tmp_path):
    r = run("-m", "job=replay", "model=llama3_1_8b", "hardware=h100_80gb", "deploy.workers=4",
            "deploy.router_policy=round_robin,cache_aware", "job.max_requests=200", "hydra.sweep.dir=sw",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    table = rows(tmp_path / "sw")
    assert [t["deploy.router_policy"] for t in table] == ["round_robin", "cache_aware"]
    assert table[0]["ttft_p90_ms"] != table[1]["ttft_p90_ms"]
    assert (tmp_path / "sw" / "best_config.yaml").is_file()


def test_a_value_that_never_works_stops_the_sweep_before_any_point(tmp_path):
    r = run("-m", *PD, "deploy.prefill_workers=0,2", "hydra.sweep.dir=sw", cwd=tmp_path)
    assert r.returncode == 2
    problems = [ln for ln in r.stderr.splitlines() if ln.startswith("  - ")]
    assert problems == ["  - deploy.prefill_workers: 0 is not a positive whole number "
                        "[override deploy.prefill_workers=0]"]
    assert "#0 : " not in r.stdout and not (tmp_path / "sw").exists()
    assert "Traceback" not in r.stderr


def test_a_point_that_fails_leaves_error_json_and_the_sweep_goes_on(tmp_path):
    # 7 prefill servers of 2 GPUs do not fit a node of 8; every other point does
    r = run("-m", *PD, "deploy.prefill_workers=2,7", "prefill.parallel.tp_size=1,2", "job.max_requests=100",
            "hydra.sweep.dir=sw", cwd=tmp_path)
    assert r.returncode == 2, r.stderr       # only configuration failures
    table = rows(tmp_path / "sw")
    assert [t["status"] for t in table] == ["ok", "ok", "ok", "failed"]
    err = json.loads((tmp_path / "sw" / "3" / "error.json").read_text())
    assert err["exit_code"] == 2 and "15 GPUs" in err["error"]
    assert "prefill.parallel.tp_size=2" in err["overrides"]
    assert "1 of 4 sweep jobs failed" in r.stderr
    assert list(csv.DictReader(open(tmp_path / "sw" / "failed.csv")))[0]["run"] == "3"


def test_hydra_run_dir_places_a_single_deployment_run(tmp_path):
    r = run(*PD, "job.max_requests=100", "hydra.run.dir=OUT", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "OUT"
    assert (out / "metrics.json").is_file() and not (out / "replay.json").exists()
    assert "deploy=pd" in yaml.safe_load((out / ".hydra" / "overrides.yaml").read_text())
    assert yaml.safe_load((out / ".hydra" / "config.yaml").read_text())["job"]["max_requests"] == 100
    assert not (tmp_path / "outputs").exists()


def test_sweep_subdir_and_a_taken_sweep_dir(tmp_path):
    args = ("-m", "job=resolve", "deploy=pd", "prefill.parallel.tp_size=range(1,3)", "model=llama3_1_8b",
            "hardware=h100_80gb", "hydra.sweep.dir=sw", "hydra.sweep.subdir=tp${hydra.job.num}")
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "sw" / "tp0" / "metrics.json").is_file() and (tmp_path / "sw" / "tp1").is_dir()
    assert [t["prefill.parallel.tp_size"] for t in rows(tmp_path / "sw")] == ["1", "2"]
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2 and "hydra.sweep.dir: " in r.stderr and "already holds a sweep" in r.stderr


def test_what_a_deployment_cannot_do_is_refused_in_one_line_each(tmp_path):
    r = run("-m", "job=launch", "deploy=pd", "deploy.prefill_workers=1,2", "model=llama3_1_8b",
            "hardware=h100_80gb", cwd=tmp_path)
    assert r.returncode == 2 and "job=launch starts one deployment" in r.stderr
    r = run("-m", *PD, "deploy.prefill_workers=1,2", "hydra/launcher=joblib", "hydra.verbose=true", cwd=tmp_path)
    assert r.returncode == 2
    assert "  - hydra/launcher: 'joblib': a deployment's sweep points run one after another" in r.stderr
    assert "  - hydra.verbose: a deployment honours only hydra.run.dir" in r.stderr
    r = run(*PD, "deploy.prefill_workers=1,2", cwd=tmp_path)
    assert r.returncode == 2 and "add -m to run one deployment per value" in r.stderr
    assert not (tmp_path / "multirun").exists() and "Traceback" not in r.stderr


def test_sigterm_mid_sweep_still_summarises_the_points_that_finished(tmp_path):
    import signal
    import time
    proc = subprocess.Popen([sys.executable, "-m", "sglang_hydra", "-m", *PD, "job.trace=conversation",
                             "deploy.prefill_workers=1,2,3,4", "hydra.sweep.dir=sw"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not (tmp_path / "sw" / "0" / "metrics.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "sw" / "0" / "metrics.json").exists()
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    table = rows(tmp_path / "sw")
    assert table[0]["status"] in ("ok", "saturated") and len(table) < 4
    assert all(t["status"] == "interrupted" for t in table[1:])
    assert "interrupted (SIGTERM)" in err and "Traceback" not in err


CONFIG_FILE = """\
deploy:
  name: pd
  decode_workers: 1
model: llama3_1_8b
hardware: h100_80gb
schedule:
  chunked_prefill_size: 4096
  max_prefill_tokens: 8192
prefill:
  parallel: {tp_size: 2}
decode:
  parallel: {tp_size: 2}
"""


def test_a_config_file_s_settings_are_in_each_point_s_record(tmp_path):
    # issue 19: with --config, a deployment sweep recorded only the command line's overrides, so
    # overrides.yaml, metrics.json's settings and best_config.yaml lost what the file set
    (tmp_path / "dep.yaml").write_text(CONFIG_FILE)
    r = run("-m", "--config", "dep.yaml", "job=replay", "job.max_requests=60", "schedule.max_prefill_tokens=16384",
            "deploy.prefill_workers=1,2", "hydra.sweep.dir=sw", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from_file = ["deploy=pd", "deploy.decode_workers=1", "model=llama3_1_8b", "hardware=h100_80gb",
                 "schedule.chunked_prefill_size=4096", "prefill.parallel.tp_size=2", "decode.parallel.tp_size=2"]
    for n, workers in enumerate(("1", "2")):
        point = tmp_path / "sw" / str(n)
        ovs = yaml.safe_load((point / ".hydra" / "overrides.yaml").read_text())
        # the file's first (the command line wins a key both set: max_prefill_tokens is the command line's)
        assert ovs == from_file + ["job=replay", "job.max_requests=60", "schedule.max_prefill_tokens=16384",
                                   f"deploy.prefill_workers={workers}"]
        settings = json.loads((point / "metrics.json").read_text())["settings"]
        assert settings["override prefill.parallel.tp_size"] == "2" and settings["override deploy"] == "pd"
        doc = json.loads((point / "metrics.json").read_text())
        assert doc["deployment"]["prefill_servers"] == int(workers)
    assert [t["deploy.prefill_workers"] for t in rows(tmp_path / "sw")] == ["1", "2"]
    best = yaml.safe_load((tmp_path / "sw" / "best_config.yaml").read_text())
    assert best["deploy"] == "pd" and best["prefill.parallel.tp_size"] == 2 and best["decode.parallel.tp_size"] == 2
    assert best["schedule.chunked_prefill_size"] == 4096 and best["schedule.max_prefill_tokens"] == 16384
    # one run placed with hydra.run.dir records them too
    r = run("--config", "dep.yaml", "job=replay", "job.max_requests=60", "hydra.run.dir=one", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load((tmp_path / "one" / ".hydra" / "overrides.yaml").read_text()) == from_file[:5] + [
        "schedule.max_prefill_tokens=8192"] + from_file[5:] + ["job=replay", "job.max_requests=60"]
