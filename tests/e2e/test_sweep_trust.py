"""Sweep outputs a person can trust, through the real command line: failed.csv always there,
one sweep per directory, an interrupted sweep still summarised, objectives a point cannot
produce refused before the sweep, the terminal's account of the sweep."""
import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

# tiny's own context is shorter than most of the sample's prompts: a replay that rejects such
# requests (schema 2) would mark every point "rejected"
SMALL = ("job.max_requests=60", "job.mode=device_only", "schedule.page_size=512", "model.context_length=131072",
         "hardware=h100_80gb")
ON_LOCAL = tuple(a for a in SMALL if not a.startswith("hardware="))
SAMPLE = str(Path(__file__).resolve().parents[2] / "sglang_hydra" / "workload" / "data" / "conversation_sample.jsonl")


def cli(*args):
    return [sys.executable, "-m", "sglang_hydra", *args]


def env():
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    e.pop("SGLANG_HYDRA_TRACEBACK", None)
    return e


def run(*args, cwd, timeout=240):
    return subprocess.run(cli(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env())


def rows_of(path: Path):
    return list(csv.DictReader(path.open()))


def test_failed_csv_always_and_a_second_sweep_into_the_same_directory_is_refused(tmp_path):
    sweep = tmp_path / "sweep"
    r = run("-m", "memory.radix_eviction_policy=lru,lfu", "job.objective=token_hit_rate", *SMALL,
            f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (sweep / "failed.csv").read_text().splitlines() == ["run,status,exit_code,error,overrides"]
    assert "sweep summary: 2 points" in r.stdout and "2 ok" in r.stdout
    assert "best point by token_hit_rate (higher is better)" in r.stdout
    before = sorted(p.name for p in sweep.iterdir())
    again = run("-m", "memory.radix_eviction_policy=slru,priority", *SMALL, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert again.returncode == 2, again.stderr
    assert "Traceback" not in again.stderr
    line = next(ln for ln in again.stderr.splitlines() if "hydra.sweep.dir" in ln)
    assert str(sweep) in line and "already holds a sweep" in line and "hydra.sweep.dir=<new directory>" in line
    assert sorted(p.name for p in sweep.iterdir()) == before       # nothing merged, nothing added
    assert [row["memory.radix_eviction_policy"] for row in rows_of(sweep / "summary.csv")] == ["lru", "lfu"]


def test_an_empty_existing_directory_is_fine(tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    r = run("-m", "memory.radix_eviction_policy=lru,lfu", *SMALL, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]


def _wait_for(predicate, proc, what, limit_s=180):
    """Poll the file system for an event of the sweep (not a timing window): fails if the
    process ends first or the event never comes within a generous bound."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert proc.poll() is None, f"the sweep ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} after {limit_s} s"
        time.sleep(0.05)


@pytest.mark.parametrize("sig,code,name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "SIGINT")])
def test_an_interrupted_sweep_still_writes_its_summary(tmp_path, sig, code, name):
    """Point 0 replays the sample; point 1 reads its trace from a FIFO nobody writes, so it
    blocks until the signal; point 2 never starts.  The signal is sent once point 0 has
    written its metrics and point 1 has started (its directory exists)."""
    fifo = tmp_path / "never_written.jsonl"
    os.mkfifo(fifo)
    sweep = tmp_path / "sweep"
    proc = subprocess.Popen(cli("-m", f"job.trace={SAMPLE},{fifo},{SAMPLE}", "job.objective=token_hit_rate",
                                *SMALL, f"hydra.sweep.dir={sweep}"),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        _wait_for(lambda: (sweep / "0" / "metrics.json").is_file() and (sweep / "1" / ".hydra").is_dir(), proc,
                  "point 0 finished and point 1 started")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == code, err
    assert "Traceback" not in err and f"interrupted ({name})" in err
    rows = rows_of(sweep / "summary.csv")
    assert [(row["run"], row["status"]) for row in rows] == [("0", "ok"), ("1", "interrupted")]
    assert not (sweep / "2").exists()
    failed = rows_of(sweep / "failed.csv")
    assert [f["run"] for f in failed] == ["1"] and "interrupted" in failed[0]["error"]
    best = (sweep / "best_config.yaml").read_text()
    assert "(run 0, ok)" in best and yaml.safe_load(best) == {"hardware": "h100_80gb", "model.context_length": 131072,
                                                               "schedule.page_size": 512}
    assert (sweep / "summary.png").is_file()
    assert "sweep summary: 2 points" in out and "1 ok, 1 interrupted" in out


@pytest.mark.parametrize("args,text", [
    (("job.objective=prefill_throughput",), "prefill_throughput was retired: it counted uncached tokens"),
    (("job.objective=block_hit_rate",), "block_hit_rate was retired"),
    (("job.objective=token_hit_rate,ttft_p90_ms",), "ttft_p90_ms needs requests timed on the target, which "
                                                    "hardware=local cannot do"),
    (("hydra/sweeper=optuna", "hydra.sweeper.n_trials=2"), "ttft_p90_ms needs requests timed"),
    (("hardware=local,h100_80gb", "job.objective=tokens_per_s_per_gpu"), "hardware=local cannot do"),
], ids=["retired-prefill-throughput", "retired-block-hit-rate", "timed-on-local", "optuna-default-on-local",
        "one-hardware-of-two"])
def test_an_objective_a_point_cannot_produce_is_refused_before_the_sweep(tmp_path, args, text):
    sweep = tmp_path / "sweep"
    r = run("-m", "memory.radix_eviction_policy=lru,lfu", *args, *ON_LOCAL, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and text in r.stderr and "job.objective" in r.stderr
    assert not sweep.exists()                 # refused before any point ran


def test_the_default_objective_on_hardware_without_timing_is_refused_before_the_sweep(tmp_path):
    sweep = tmp_path / "sweep"
    r = run("-m", "memory.radix_eviction_policy=lru,lfu", *ON_LOCAL, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "job.objective: ttft_p90_ms needs requests timed on the target, which hardware=local cannot do" in r.stderr
    assert "[job: the job selection]" in r.stderr            # the job's default, not something the user typed
    assert not sweep.exists()


def test_the_bare_command_shows_the_showcase_with_timed_requests(tmp_path):
    """README's first command: a real model preset on a target GPU over the bundled trace,
    said on stderr, with TTFT timed (not "off")."""
    from sglang_hydra.config.showcase import SHOWCASE
    from sglang_hydra.jobs.summary import flatten_metrics
    r = run(cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "no arguments, so the what-if on its showcase settings: " + " ".join(SHOWCASE) in r.stderr
    assert "off:" not in r.stdout and "Traceback" not in r.stderr
    (run_dir,) = list((tmp_path / "outputs").glob("*/*"))
    assert yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) == list(SHOWCASE)
    metrics = flatten_metrics(__import__("json").loads((run_dir / "metrics.json").read_text()))
    assert metrics["ttft_p90_ms"] > 0 and metrics["host_memory_gb"] > 0


def test_an_optuna_study_whose_every_trial_fails_still_leaves_its_summary(tmp_path):
    """Every trial over the host-memory budget: the Optuna plugin itself fails at the end (no
    completed trial); the command exits 1 in one line and the tables of the trials are there."""
    sweep = tmp_path / "opt"
    r = run("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "memory=hicache",
            "memory.hicache_ratio=interval(2,4)", "schedule.max_total_tokens=102400", "job.max_host_memory_gb=0.001",
            "job.objective=token_hit_rate", *(a for a in SMALL if a != "job.mode=device_only"),
            f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "sweep summary: 2 points" in r.stdout and "2 infeasible" in r.stdout
    assert "no best point: every point with token_hit_rate failed or broke a constraint" in r.stdout
    assert [row["status"] for row in rows_of(sweep / "failed.csv")] == ["infeasible", "infeasible"]


def test_a_saturated_point_is_said_and_never_the_best(tmp_path):
    """One H100 cannot keep up with the sample at its real rate; at 1/200 of it, it can.  The
    saturated point is a status of its own in the table and the terminal, and the best point
    by P90 TTFT is the unsaturated one (the replay's schema-2 metrics state it)."""
    sweep = tmp_path / "sweep"
    r = run("-m", "model=llama3_8b", "model.context_length=131072", "hardware=h100_80gb", "job.time_scale=1,200",
            "job.max_requests=300", "job.objective=ttft_p90_ms", f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    assert json.loads((sweep / "0" / "metrics.json").read_text())["schema_version"] == 2
    rows = {row["job.time_scale"]: row for row in rows_of(sweep / "summary.csv")}
    assert rows["1"]["status"] == "saturated" and rows["200"]["status"] == "ok"
    assert "1 saturated" in r.stdout and "run 0 [job.time_scale=1]" in r.stdout
    assert "best point by ttft_p90_ms (lower is better)" in r.stdout and "(run 1)" in r.stdout
    assert "(run 1, ok)" in (sweep / "best_config.yaml").read_text()


def test_a_sweep_over_a_setting_the_simulation_ignores_warns_once(tmp_path):
    """The metrics list the settings the simulation does not read (``not_modelled``); a sweep
    over one says so once, naming the key, instead of leaving identical rows unexplained."""
    sweep = tmp_path / "sweep"
    r = run("-m", "observability.enable_metrics=true,false", "job.objective=token_hit_rate", *SMALL,
            f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    from sglang_hydra.workload.metrics import flatten_metrics
    listed = flatten_metrics(json.loads((sweep / "0" / "metrics.json").read_text()))["not_modelled"]
    assert any("observability.enable_metrics" in x for x in listed), listed
    warnings = [ln for ln in r.stderr.splitlines() if ln.startswith("sglang-hydra: warning: the simulation does not model")]
    assert warnings == ["sglang-hydra: warning: the simulation does not model observability.enable_metrics (swept over "
                        "False, True): its values give the same answer, and any difference between rows comes from "
                        "the other swept settings"]
