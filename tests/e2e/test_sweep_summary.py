"""The sweep summary on hand-made points: metrics.json in the nested schema 2, the estimate's
flat keys and the older flat metrics give the same columns; settings never overwrite results;
saturated and rejecting points are said and never beat an ok one; failed.csv is always there."""
import csv
import json

import pytest
import yaml

from sglang_hydra.jobs.summary import (flatten_metrics, not_modelled_warnings, pareto_front, pick_best,
                                       write_summary)


def v2(status="ok", ttft=900.0, hit=0.3, tok_gpu=2000.0, tok_user=40.0, rejected=0, host=0.0, not_modelled=(),
       settings=None):
    return {
        "schema_version": 2, "status": status, "settings": settings or {},
        "deployment": {"mode": "agg", "gpus": 1},
        "requests": {"requests_total": 1000, "requests_completed": 1000 - rejected, "rejected_requests": rejected,
                     "rejected_reasons": {"prompt_longer_than_pool": rejected} if rejected else {}},
        "latency": {"ttft_p50_ms": ttft / 2, "ttft_p90_ms": ttft, "ttft_p99_ms": ttft * 2,
                    "ttft_unloaded_p90_ms": 100.0, "tpot_p50_ms": 10.0, "tpot_p90_ms": 12.0, "tpot_p99_ms": 15.0,
                    "itl_p90_ms": 12.0, "e2e_p90_ms": ttft + 5000},
        "throughput": {"tokens_per_s": tok_gpu, "tokens_per_s_per_gpu": tok_gpu, "tokens_per_s_per_user": tok_user,
                       "goodput_rps_per_gpu": 1.0, "requests_per_s": 2.0},
        "cache": {"token_hit_rate": hit, "device_hit_tokens": 10, "host_hit_tokens": 0, "storage_hit_tokens": 0,
                  "device_capacity_tokens": 500000},
        "memory": {"host_memory_gb": host},
        "not_modelled": list(not_modelled),
    }


def job(sweep, name, overrides, metrics=None, error=None, objective=None):
    d = sweep / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    if objective:
        (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"job": {"name": "replay", "objective": objective,
                                                                            "trace": "conversation"}}))
        (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
            {"hydra": {"runtime": {"choices": {"model": "llama3_8b", "hardware": "h100_80gb"}}}}))
    if metrics is not None:
        (d / "metrics.json").write_text(json.dumps(metrics))
    if error is not None:
        (d / "error.json").write_text(json.dumps(error))


def rows_of(path):
    return list(csv.DictReader(path.open()))


def test_flatten_by_leaf_reads_schema_2_and_flat_metrics_alike():
    flat = flatten_metrics(v2(rejected=3, settings={"memory.hicache_ratio": 2, "model": "llama3_8b"}))
    assert flat["ttft_p90_ms"] == 900.0 and flat["tokens_per_s_per_gpu"] == 2000.0
    assert flat["rejected_requests"] == 3 and flat["rejected_reasons"] == {"prompt_longer_than_pool": 3}
    assert flat["gpus"] == 1 and flat["host_memory_gb"] == 0.0
    assert "model" not in flat and "memory.hicache_ratio" not in flat and "settings" not in flat
    old = flatten_metrics({"ttft_p90_ms": 5.0, "token_hit_rate": 0.2, "memory.hicache_ratio": "2", "status": "ok"})
    assert old == {"ttft_p90_ms": 5.0, "token_hit_rate": 0.2, "status": "ok"}


def test_v2_sweep_table_status_best_and_plots(tmp_path, capsys):
    sweep = tmp_path / "s"
    obj = "token_hit_rate"
    # the saturated point has the best hit rate, but an ok point exists: it must not win
    job(sweep, "0", ["parallel.dp_size=1", "model=llama3_8b"], v2("saturated", ttft=3e6, hit=0.6, tok_user=5),
        objective=obj)
    job(sweep, "1", ["parallel.dp_size=2", "model=llama3_8b"], v2("ok", ttft=2000, hit=0.4, tok_gpu=1500),
        objective=obj)
    job(sweep, "2", ["parallel.dp_size=4", "model=llama3_8b"], v2("ok", ttft=800, hit=0.3, tok_gpu=1000,
                                                                    tok_user=60, rejected=12), objective=obj)
    job(sweep, "3", ["parallel.dp_size=8", "model=llama3_8b"], objective=obj,
        error={"overrides": ["parallel.dp_size=8"], "error": "RuntimeError: boom", "exit_code": 1})
    rows = write_summary(sweep, report=True)
    out = capsys.readouterr().out
    assert {r["run"]: r["status"] for r in rows} == {"0": "saturated", "1": "ok", "2": "ok", "3": "failed"}
    table = rows_of(sweep / "summary.csv")
    head = list(table[0])
    assert head[:3] == ["run", "status", "parallel.dp_size"]
    for col in ("objective", "objective_value", "ttft_p90_ms", "tpot_p90_ms", "tokens_per_s_per_gpu",
                "tokens_per_s_per_user", "goodput_rps_per_gpu", "rejected_requests", "token_hit_rate",
                "host_memory_gb"):
        assert col in head, col
    assert head.index("objective") < head.index("ttft_p90_ms") < head.index("token_hit_rate")
    assert table[0]["status"] == "saturated" and table[2]["rejected_requests"] == "12"
    assert table[1]["objective_value"] == "0.4"
    best = yaml.safe_load((sweep / "best_config.yaml").read_text())
    assert best == {"model": "llama3_8b", "parallel.dp_size": 2}
    # the terminal states saturation, the rejected requests and the best point
    assert "1 saturated" in out and "saturated (1)" in out and "run 0 [parallel.dp_size=1]" in out
    assert "rejected requests: run 2 [parallel.dp_size=4]: 12 of 1,000 (prompt_longer_than_pool: 12)" in out
    assert "best point by token_hit_rate (higher is better): 40.0 % at parallel.dp_size=2" in out
    failed = rows_of(sweep / "failed.csv")
    assert [f["run"] for f in failed] == ["3"] and "boom" in failed[0]["error"]
    for png in ("summary.png", "pareto.png"):
        assert (sweep / png).stat().st_size > 10_000


def test_all_saturated_the_best_is_named_as_such(tmp_path, capsys):
    sweep = tmp_path / "s"
    job(sweep, "0", ["memory.hicache_ratio=1"], v2("saturated", ttft=5e6), objective="ttft_p90_ms")
    job(sweep, "1", ["memory.hicache_ratio=2"], v2("saturated", ttft=4e6), objective="ttft_p90_ms")
    write_summary(sweep, report=True)
    out = capsys.readouterr().out
    text = (sweep / "best_config.yaml").read_text()
    assert "(run 1, saturated)" in text and "no point is ok" in text
    assert "note: no point is ok" in out


def test_settings_never_overwrite_results(tmp_path):
    """Older flat metrics carried the model the job resolved; the override of the same name is
    a setting column, the result keeps its value under result.model."""
    sweep = tmp_path / "s"
    base = dict(status="ok", objective="ttft_p90_ms", objective_direction="minimize", token_hit_rate=0.1)
    job(sweep, "0", ["model=llama3_8b"], dict(base, model="meta-llama/Meta-Llama-3-8B", ttft_p90_ms=5.0))
    job(sweep, "1", ["model=qwen2_7b"], dict(base, model="Qwen/Qwen2-7B", ttft_p90_ms=6.0))
    write_summary(sweep, plots=False)
    table = rows_of(sweep / "summary.csv")
    assert [(t["model"], t["result.model"]) for t in table] == [
        ("llama3_8b", "meta-llama/Meta-Llama-3-8B"), ("qwen2_7b", "Qwen/Qwen2-7B")]


def test_estimate_points_get_a_throughput_pareto(tmp_path):
    sweep = tmp_path / "s"
    for i, (tp, gpu, user) in enumerate([(1, 3000.0, 30.0), (2, 2500.0, 55.0), (4, 1500.0, 90.0), (8, 1400, 80.0)]):
        job(sweep, str(i), [f"parallel.tp_size={tp}", "job=estimate"],
            {"status": "ok", "ttft_ms": 100.0 / tp, "tpot_ms": 20.0 / tp, "tokens_per_s": gpu * tp,
             "tokens_per_s_per_gpu": gpu, "tokens_per_s_per_user": user})
    rows = write_summary(sweep)
    head = list(rows_of(sweep / "summary.csv")[0])
    assert head[:3] == ["run", "status", "parallel.tp_size"]
    assert {"ttft_ms", "tpot_ms", "tokens_per_s_per_gpu", "tokens_per_s_per_user"} <= set(head)
    assert len(rows) == 4 and (sweep / "pareto.png").stat().st_size > 10_000 and (sweep / "summary.png").is_file()
    assert not (sweep / "best_config.yaml").exists()      # the estimate names no objective


def test_failed_csv_is_written_with_its_header_when_nothing_failed(tmp_path):
    sweep = tmp_path / "s"
    job(sweep, "0", ["memory.hicache_ratio=1"], v2(), objective="ttft_p90_ms")
    job(sweep, "1", ["memory.hicache_ratio=2"], v2(ttft=500), objective="ttft_p90_ms")
    write_summary(sweep)
    assert (sweep / "failed.csv").read_text().splitlines() == ["run,status,exit_code,error,overrides"]


def test_an_interrupted_point_is_listed_as_interrupted(tmp_path):
    sweep = tmp_path / "s"
    job(sweep, "0", ["memory.hicache_ratio=1"], v2(), objective="ttft_p90_ms")
    job(sweep, "1", ["memory.hicache_ratio=2"], objective="ttft_p90_ms")     # started, never finished
    rows = write_summary(sweep, interrupted=True)
    assert [r["status"] for r in rows] == ["ok", "interrupted"]
    assert [f["run"] for f in rows_of(sweep / "failed.csv")] == ["1"]
    assert yaml.safe_load((sweep / "best_config.yaml").read_text()) == {"memory.hicache_ratio": 1}


def test_a_setting_the_simulation_does_not_model_is_warned_once():
    rows = [{"run": str(i), "status": "ok",
             "not_modelled": [f"memory.hicache_io_backend={b}: not modelled, the answer does not depend on it",
                              "enable_metrics", "the overlap scheduler, CUDA graphs: no CPU time between passes"],
             "_overrides": {"memory.hicache_io_backend": b, "serving.enable_metrics": "true",
                            "memory.hicache_ratio": str(i)}}
            for i, b in enumerate(["kernel", "direct"])]
    warnings = not_modelled_warnings(rows, ["memory.hicache_io_backend", "memory.hicache_ratio"])
    assert len(warnings) == 1
    assert "does not model memory.hicache_io_backend (swept over direct, kernel)" in warnings[0]


def test_pick_best_never_picks_failed_and_prefers_ok():
    rows = [{"run": "0", "status": "infeasible", "x": 1.0}, {"run": "1", "status": "saturated", "x": 2.0},
            {"run": "2", "status": "ok", "x": 9.0}, {"run": "3", "status": "failed"}]
    best, note = pick_best(rows, "x", "minimize")
    assert best["run"] == "2" and note == ""
    best, note = pick_best(rows[:2], "x", "minimize")
    assert best["run"] == "1" and "no point is ok" in note
    best, note = pick_best(rows[3:], "x", "minimize")
    assert best is None and "no point produced x" in note


@pytest.mark.parametrize("dirs,expected", [(("minimize", "minimize"), [0, 1, 4, 5]),
                                           (("maximize", "maximize"), [0, 2, 3, 4, 5])])
def test_pareto_front_directions(dirs, expected):
    pts = [(10, 5.0), (20, 3.0), (20, 4.0), (40, 3.0), (80, 1.0), (5, 9.0)]
    assert sorted(pareto_front(pts, dirs)) == expected


def test_a_saturated_trial_is_a_failed_trial_under_optuna(tmp_path, monkeypatch):
    """Optuna would compare a saturated point's value (its latency is backlog) with ok ones."""
    from hydra.core.utils import JobReturn, JobStatus
    from sglang_hydra.jobs import summary, sweeps
    monkeypatch.setattr(sweeps, "under_optuna", lambda: True)
    (tmp_path / "metrics.json").write_text(json.dumps(v2("saturated", hit=0.9)))
    ret = JobReturn(status=JobStatus.COMPLETED, _return_value=0.9)
    assert summary.mark_failed_trial(ret, tmp_path) and ret.status == JobStatus.FAILED
    with pytest.raises(RuntimeError, match="saturated"):
        ret.return_value
    (tmp_path / "metrics.json").write_text(json.dumps(v2("ok", hit=0.5)))
    ok = JobReturn(status=JobStatus.COMPLETED, _return_value=0.5)
    assert not summary.mark_failed_trial(ok, tmp_path) and ok.return_value == 0.5


@pytest.mark.parametrize("policy, line", [
    ("ghost_lru", "# Needs the plugin: memory.radix_eviction_policy=ghost_lru runs in SGLang 0.5.23 only with "
                  "sglang-hydra's engine plugin (hydra_eviction_policies)"),
    ("auto_ghost_lfu", "# Replay-only: memory.radix_eviction_policy=auto_ghost_lfu is not a policy SGLang can run"),
    ("lru", None),
])
def test_best_config_says_what_its_eviction_policy_needs(tmp_path, policy, line):
    """Issue 20: a best point whose policy needs sglang-hydra's engine plugin says so."""
    sweep = tmp_path / "s"
    job(sweep, "0", ["memory.radix_eviction_policy=lru"], v2(hit=0.2), objective="token_hit_rate")
    job(sweep, "1", [f"memory.radix_eviction_policy={policy}"], v2(hit=0.4), objective="token_hit_rate")
    write_summary(sweep, report=False)
    text = (sweep / "best_config.yaml").read_text()
    assert yaml.safe_load(text) == {"memory.radix_eviction_policy": policy}
    if line is None:
        assert "plugin" not in text and "Replay-only" not in text
    else:
        assert line in text
