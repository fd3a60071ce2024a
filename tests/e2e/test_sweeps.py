"""Sweeps through the real command line: summary tables and plots, failed points, Optuna,
and the launchers (joblib, submitit_local, a local Ray instance)."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# tiny (256 KV bytes per token) timed on an H100; a 131,072-token context and pool hold every prompt of the 150
SMALL = ("schedule.page_size=512", "job.max_requests=150", "job.mode=metadata", "hardware=h100_80gb",
         "model.context_length=131072")


def run(*args, cwd, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))


def rows_of(path: Path):
    return list(csv.DictReader(path.open()))


def test_grid_sweep_summary_best_config_and_plots(tmp_path):
    sweep = tmp_path / "sweep"
    r = run("-m", "schedule.max_total_tokens=131072,262144", "memory.radix_eviction_policy=lru,ghost_lru",
            "job.objective=token_hit_rate", *SMALL, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(sweep / "summary.csv")
    assert len(rows) == 4 and all(row["status"] == "ok" for row in rows)
    head = list(rows[0])
    assert head[:4] == ["run", "status", "schedule.max_total_tokens", "memory.radix_eviction_policy"]
    for col in ("token_hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate", "host_memory_gb"):
        assert col in head
    assert rows_of(sweep / "failed.csv") == []          # written, with just its header
    # best point by token_hit_rate (maximize), written for --config
    best = max(rows, key=lambda row: float(row["token_hit_rate"]))
    cfg = yaml.safe_load((sweep / "best_config.yaml").read_text())
    assert cfg["schedule.max_total_tokens"] == int(best["schedule.max_total_tokens"])
    assert cfg["memory.radix_eviction_policy"] == best["memory.radix_eviction_policy"]
    assert not any(k.startswith("job") for k in cfg)
    r2 = run("--config", str(sweep / "best_config.yaml"), "job=resolve", "job.format=json", cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    assert json.loads(r2.stdout)["radix_eviction_policy"] == best["memory.radix_eviction_policy"]
    assert (sweep / "summary.png").is_file()
    # the chart: hit rate (the objective) per pool size, one series per policy, the best point starred
    from sglang_hydra.jobs.summary_plots import plot_summary
    from sglang_hydra.jobs.sweep_points import collect
    points, swept = collect(sweep)
    panel = plot_summary(sweep, points, swept).panels[0]
    assert panel.metric == "token_hit_rate" and panel.xlabel == "schedule.max_total_tokens"
    assert sorted(s.label for s in panel.series) == ["radix_eviction_policy=ghost_lru", "radix_eviction_policy=lru"]
    assert all([x for x, _ in s.points] == [131072.0, 262144.0] for s in panel.series)
    assert panel.flat or panel.best[1] == pytest.approx(100 * float(best["token_hit_rate"]))


def test_points_over_the_host_budget_are_listed_not_fatal(tmp_path):
    # tiny model: 256 KV bytes per token; 131,072 device tokens x ratio -> 34 MB x ratio on the host
    sweep = tmp_path / "sweep"
    r = run("-m", "memory=hicache", "memory.hicache_ratio=1.5,4", "schedule.max_total_tokens=131072",
            "job.max_host_memory_gb=0.06", "job.objective=token_hit_rate", *SMALL, f"hydra.sweep.dir={sweep}",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["memory.hicache_ratio"]: row for row in rows_of(sweep / "summary.csv")}
    assert rows["1.5"]["status"] == "ok" and rows["4"]["status"] == "infeasible"
    failed = rows_of(sweep / "failed.csv")
    assert len(failed) == 1 and "max_host_memory_gb" in failed[0]["error"]
    assert "memory.hicache_ratio=4" in failed[0]["overrides"]


def test_single_run_over_the_host_budget_exits_2(tmp_path):
    r = run("memory=hicache", "memory.hicache_ratio=4", "schedule.max_total_tokens=131072",
            "job.max_host_memory_gb=0.06", *SMALL, cwd=tmp_path)
    assert r.returncode == 2 and "job.max_host_memory_gb" in r.stderr and "Traceback" not in r.stderr


def test_optuna_follows_the_objective_and_survives_failed_trials(tmp_path):
    sweep = tmp_path / "opt"
    r = run("-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=6", "hydra.sweeper.sampler.seed=1",
            "memory=hicache", "memory.hicache_ratio=interval(1,8)", "memory.radix_eviction_policy=choice(lru,ghost_lru)",
            "schedule.max_total_tokens=131072", "job.max_host_memory_gb=0.09", "job.objective=token_hit_rate",
            *SMALL, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Directions: ['maximize']" in r.stdout + r.stderr
    rows = rows_of(sweep / "summary.csv")
    assert len(rows) == 6
    # interval(1,8) on a float field samples floats; points above 0.09 GB (ratio > ~2.7) fail
    ratios = [float(row["memory.hicache_ratio"]) for row in rows]
    assert any(x != int(x) for x in ratios)
    bad = [row for row in rows if float(row["memory.hicache_ratio"]) * 131072 * 256 > 0.09e9]
    assert all(row["status"] == "infeasible" for row in bad)
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    ok = [row for row in rows if row["status"] == "ok"]
    assert result["best_value"] == pytest.approx(max(float(row["token_hit_rate"]) for row in ok))
    best = yaml.safe_load((sweep / "best_config.yaml").read_text())
    assert best["memory.hicache_ratio"] == pytest.approx(result["best_params"]["memory.hicache_ratio"])
    assert best["memory"] == "hicache"


def test_optuna_interval_on_a_string_key_is_a_config_error(tmp_path):
    r = run("-m", "hydra/sweeper=optuna", "memory.radix_eviction_policy=interval(1,8)", *SMALL,
            f"hydra.sweep.dir={tmp_path}/opt", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "memory.radix_eviction_policy" in r.stderr and "choice(" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "opt").exists()


def _two_point_sweep(tmp_path, *launcher, timeout=300, env=None):
    sweep = tmp_path / "sweep"
    r = run("-m", *launcher, "memory.radix_eviction_policy=lru,lfu", *SMALL, "job.objective=token_hit_rate",
            f"hydra.sweep.dir={sweep}", cwd=tmp_path, timeout=timeout, env=env)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    rows = rows_of(sweep / "summary.csv")
    assert sorted(row["memory.radix_eviction_policy"] for row in rows) == ["lfu", "lru"]
    assert all(row["status"] == "ok" and float(row["token_hit_rate"]) > 0 for row in rows)
    return sweep


def test_joblib_launcher(tmp_path):
    _two_point_sweep(tmp_path, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")


def test_submitit_local_launcher(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = _two_point_sweep(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5")
    assert list(sweep.glob(".submitit/*/*_log.out"))


def _processes_mentioning(text: str):
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if text in (p / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(p.name))
            except OSError:
                pass
    return pids


@pytest.mark.slow
def test_ray_launcher_on_a_private_local_instance(tmp_path):
    """ray.init starts a Ray instance on 127.0.0.1 inside the sweep's own process (its own
    temp dir, no dashboard, 2 CPUs); it is gone when the command ends."""
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    import shutil
    import tempfile
    ray_tmp = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))   # Ray's socket paths must stay < 108 bytes
    try:
        _two_point_sweep(tmp_path, "hydra/launcher=ray_local", "+hydra.launcher.ray.init.num_cpus=2",
                         f"+hydra.launcher.ray.init._temp_dir={ray_tmp}", timeout=240,
                         env={"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
    finally:
        leftovers = _processes_mentioning(str(ray_tmp))
        for pid in leftovers:     # only processes of the instance this test started
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not leftovers


def test_operator_question_sim_sweep_on_target_hardware(tmp_path):
    """The operator's sweep, on 400 requests at an eighth of their rate: TTFT per point from the
    simulation with the tiered sim cache, host memory from the plan for h100_80gb, plots and a
    best config that --config takes."""
    sweep = tmp_path / "sweep"
    r = run("-m", "model=llama3_1_8b", "hardware=h100_80gb", "memory=hicache", "memory.hicache_ratio=1,4",
            "memory.radix_eviction_policy=lru,ghost_lru", "job.max_requests=400", "schedule.max_total_tokens=131072",
            "job.time_scale=8", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = rows_of(sweep / "summary.csv")
    assert len(rows) == 4 and all(row["status"] == "ok" for row in rows)
    for row in rows:
        assert json.loads((sweep / row["run"] / "metrics.json").read_text())["deployment"]["cache_mode"] == "sim"
        assert 0 < float(row["ttft_p50_ms"]) <= float(row["ttft_p90_ms"]) <= float(row["ttft_p99_ms"])
        total = float(row["device_hit_rate"]) + float(row["host_hit_rate"]) + float(row["storage_hit_rate"])
        assert total == pytest.approx(float(row["token_hit_rate"]))
    by_ratio = {row["memory.hicache_ratio"]: float(row["host_memory_gb"]) for row in rows}
    # 131,072 device tokens x 128 KiB per token x ratio (the plan for the target, in GB)
    assert by_ratio["4"] == pytest.approx(4 * by_ratio["1"], rel=1e-3)
    assert by_ratio["1"] == pytest.approx(131072 * 131072 / 1e9, rel=1e-3)
    best = min(rows, key=lambda row: float(row["ttft_p90_ms"]))
    cfg = yaml.safe_load((sweep / "best_config.yaml").read_text())
    assert cfg["hardware"] == "h100_80gb" and cfg["model"] == "llama3_1_8b"
    assert str(cfg["memory.hicache_ratio"]) == best["memory.hicache_ratio"]
    for png in ("summary.png", "pareto.png"):
        assert (sweep / png).is_file()
    assert json.loads((sweep / "0" / "metrics.json").read_text())["assumptions"]


# ----------------------------------------------------------------------------- summary, in process
def _job(sweep, name, overrides, metrics=None, error=None):
    d = sweep / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    if metrics is not None:
        (d / "metrics.json").write_text(json.dumps(metrics))
    if error is not None:
        (d / "error.json").write_text(json.dumps(error))


def test_pareto_front_by_hand():
    from sglang_hydra.jobs.summary_plots import pareto_front
    pts = [(10, 5.0), (20, 3.0), (20, 4.0), (40, 3.0), (80, 1.0), (5, 9.0)]
    assert sorted(pareto_front(pts)) == [0, 1, 4, 5]


def test_summary_lists_failed_and_infeasible_points_and_picks_the_best(tmp_path):
    from sglang_hydra.jobs.summary import write_summary
    sweep = tmp_path / "sweep"
    base = dict(objective="ttft_p90_ms", objective_direction="minimize", token_hit_rate=0.1, device_hit_rate=0.08,
                host_hit_rate=0.02, storage_hit_rate=0.0, trace="t.jsonl", model="llama3_8b", hardware="h100_80gb",
                offered_load=0.5)
    _job(sweep, "0", ["memory.hicache_ratio=1", "memory.radix_eviction_policy=lru"],
         dict(base, status="ok", ttft_p90_ms=900.0, host_memory_gb=50.0))
    _job(sweep, "1", ["memory.hicache_ratio=2", "memory.radix_eviction_policy=lru"],
         dict(base, status="ok", ttft_p90_ms=700.0, host_memory_gb=100.0))
    _job(sweep, "2", ["memory.hicache_ratio=4", "memory.radix_eviction_policy=lru"],
         dict(base, status="infeasible", status_reason="host memory 200 GB exceeds job.max_host_memory_gb=150",
              ttft_p90_ms=500.0, host_memory_gb=200.0))
    _job(sweep, "3", ["memory.hicache_ratio=1", "memory.radix_eviction_policy=ghost_lru"],
         error={"overrides": ["memory.hicache_ratio=1", "memory.radix_eviction_policy=ghost_lru"],
                "error": "RuntimeError: boom", "exit_code": 1})
    (sweep / "4").mkdir()       # a job that died before writing anything but its directory
    (sweep / "4" / ".hydra").mkdir()
    rows = write_summary(sweep)
    status = {r["run"]: r["status"] for r in rows}
    assert status == {"0": "ok", "1": "ok", "2": "infeasible", "3": "failed", "4": "failed"}
    failed = {r["run"]: r for r in rows_of(sweep / "failed.csv")}
    assert set(failed) == {"2", "3", "4"}
    assert "boom" in failed["3"]["error"] and failed["3"]["exit_code"] == "1"
    assert "max_host_memory_gb" in failed["2"]["error"]
    # the best feasible point, not the infeasible one with lower TTFT
    best = yaml.safe_load((sweep / "best_config.yaml").read_text())
    assert best == {"memory.hicache_ratio": 2, "memory.radix_eviction_policy": "lru"}
    cols = list(rows_of(sweep / "summary.csv")[0])
    assert cols[:4] == ["run", "status", "memory.hicache_ratio", "memory.radix_eviction_policy"]
    assert (sweep / "summary.png").is_file() and (sweep / "pareto.png").is_file()


def test_a_nan_trial_under_optuna_becomes_a_failed_job_return(tmp_path, monkeypatch):
    from hydra.core.utils import JobReturn, JobStatus
    from sglang_hydra.jobs import summary, sweeps
    monkeypatch.setattr(sweeps, "under_optuna", lambda: True)
    (tmp_path / "metrics.json").write_text(json.dumps({"status": "infeasible", "status_reason": "over budget"}))
    ret = JobReturn(status=JobStatus.COMPLETED, _return_value=float("nan"))
    assert summary.mark_failed_trial(ret, tmp_path)
    assert ret.status == JobStatus.FAILED
    with pytest.raises(RuntimeError, match="over budget"):
        ret.return_value
    good = JobReturn(status=JobStatus.COMPLETED, _return_value=1.5)
    assert not summary.mark_failed_trial(good, tmp_path) and good.return_value == 1.5
    monkeypatch.setattr(sweeps, "under_optuna", lambda: False)
    grid = JobReturn(status=JobStatus.COMPLETED, _return_value=float("nan"))
    assert not summary.mark_failed_trial(grid, tmp_path) and grid.status == JobStatus.COMPLETED


def test_a_sweep_of_jobs_without_figures_is_all_ok_and_draws_no_empty_chart(tmp_path):
    """job=resolve writes no figures: its points used to be listed as killed, under an empty plot.
    (Also: a sweep over job= finds every job although slim runs register only the chosen one.)"""
    sweep = tmp_path / "s"
    r = run("-m", "job=resolve,plan", "memory=hicache,default", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [(row["job"], row["status"]) for row in rows] == [
        ("resolve", "ok"), ("resolve", "ok"), ("plan", "ok"), ("plan", "ok")]
    assert rows[2]["device_tokens"] and not rows[0]["device_tokens"]
    assert (sweep / "failed.csv").read_text().strip() == "run,status,exit_code,error,overrides"
    assert not (sweep / "summary.png").exists()


def test_a_sweep_over_a_hardware_field(tmp_path):
    """hardware.<field>=a,b sweeps like a record key: each point gets its value (here the PD decode
    servers' pass scale moves TPOT), and a value or field the hardware does not take is exit 2."""
    r = run("-m", "job=replay", "deploy=pd", "model=llama3_1_8b", "hardware=h100_80gb", "job.max_requests=100",
            "hardware.disagg_decode_pass_scale=1.0,1.5", "hydra.sweep.dir=sw", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rows = {row["hardware.disagg_decode_pass_scale"]: float(row["tpot_p50_ms"])
            for row in csv.DictReader(open(tmp_path / "sw" / "summary.csv"))}
    assert rows["1.5"] > rows["1.0"]
    bad = run("-m", "job=replay", "model=llama3_1_8b", "hardware=h100_80gb", "hardware.disagg_decode_pass_scale=1.0,9",
              "hardware.bogus=1,2", "hydra.sweep.dir=sw2", cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "hardware.disagg_decode_pass_scale: 9.0 is above the maximum 3" in bad.stderr
    assert bad.stderr.count("hardware.bogus: unknown hardware field") == 1
    assert not (tmp_path / "sw2").exists()


def test_a_page_size_below_the_trace_block_is_named_and_identical_rows_are_said(tmp_path):
    """Issue 27: schedule.page_size=1,64 gave identical rows without a word.  Each point names the
    page size in not_modelled with why (hits come in the trace's 512-token blocks); a single run
    does not warn (the page rounding may still move a figure), the sweep does when the rows match."""
    sweep = tmp_path / "sweep"
    r = run("-m", "job=replay", "model=llama3_1_8b", "hardware=h100_80gb", "parallel.dp_size=2", "job.max_requests=120",
            "schedule.page_size=1,64", "memory.radix_eviction_policy=lru,lfu", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    for n, ps in ((0, 1), (2, 64)):          # points: page_size x policy, page_size first
        doc = json.loads((sweep / str(n) / "metrics.json").read_text())
        assert doc["not_modelled"][0].startswith(f"schedule.page_size={ps}: below the trace's 512-token block")
    head = list(rows_of(sweep / "summary.csv")[0])
    assert "schedule.page_size" in head and "page_size" not in head and "eviction_policy" not in head
    assert "warning: schedule.page_size=1,64 gave the same results" in r.stderr
    assert "schedule.page_size is below the trace's 512-token block" in r.stderr
    assert "memory.radix_eviction_policy=" not in r.stderr.split("gave the same results")[0].splitlines()[-1]
    single = run("job=replay", "model=llama3_1_8b", "hardware=h100_80gb", "job.max_requests=60", "schedule.page_size=64",
                 cwd=tmp_path)
    assert single.returncode == 0 and "page_size" not in single.stderr
