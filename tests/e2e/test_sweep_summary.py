"""The sweep summary on hand-made points: metrics.json in the nested schema (3, and 2 of older
sweeps), the estimate's flat keys and the older flat metrics give the same columns; settings never
overwrite results and a quantity has one column; saturated and rejecting points are said and never
beat an ok one; failed.csv is always there; the charts hide no series and star no flat panel."""
import csv
import json

import pytest
import yaml

from sglang_hydra.jobs.summary import (flatten_metrics, identical_rows_warnings, not_modelled_warnings, pick_best,
                                       write_summary)
from sglang_hydra.jobs.summary_plots import pareto_front, plot_pareto, plot_summary
from sglang_hydra.jobs.sweep_points import collect


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
    for col in ("objective", "ttft_p90_ms", "tpot_p90_ms", "tokens_per_s_per_gpu",
                "tokens_per_s_per_user", "goodput_rps_per_gpu", "rejected_requests", "token_hit_rate",
                "host_memory_gb"):
        assert col in head, col
    assert "objective_value" not in head        # the objective's value is its own column (token_hit_rate)
    assert len(head) == len(set(head))
    assert head.index("objective") < head.index("ttft_p90_ms") < head.index("token_hit_rate")
    assert table[0]["status"] == "saturated" and table[2]["rejected_requests"] == "12"
    assert table[1]["objective"] == "token_hit_rate" and table[1]["token_hit_rate"] == "0.4"
    best = yaml.safe_load((sweep / "best_config.yaml").read_text())
    assert best == {"model": "llama3_8b", "parallel.dp_size": 2}
    # the terminal states saturation, the rejected requests and the best point
    assert "1 saturated" in out and "saturated (1)" in out and "run 0 [parallel.dp_size=1]" in out
    assert "rejected requests: run 2 [parallel.dp_size=4]: 12 of 1,000 (prompt_longer_than_pool: 12)" in out
    assert "best point by token_hit_rate (higher is better): 40.0 % at parallel.dp_size=2" in out
    failed = rows_of(sweep / "failed.csv")
    assert [f["run"] for f in failed] == ["3"] and "boom" in failed[0]["error"]
    assert (sweep / "summary.png").is_file() and (sweep / "pareto.png").is_file()
    # what the chart shows: the objective first, the saturated ok-looking point never starred
    rows, swept = collect(sweep)
    chart = plot_summary(sweep, rows, swept)
    assert [p.metric for p in chart.panels] == ["token_hit_rate", "ttft_p90_ms", "tokens_per_s_per_gpu"]
    hit = chart.panels[0]
    assert hit.xlabel == "parallel.dp_size" and hit.ylabel == "token hit rate (%)"
    assert hit.best == (2.0, pytest.approx(40.0)) and not hit.flat
    assert [s_.points for s_ in hit.series] == [[(1.0, pytest.approx(60.0)), (2.0, pytest.approx(40.0)),
                                                 (4.0, pytest.approx(30.0))]]
    assert "1 saturated (hollow)" in chart.title and "best token hit rate: 40.0 % at dp_size=2" in chart.title


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
    assert len(rows) == 4 and (sweep / "pareto.png").is_file() and (sweep / "summary.png").is_file()
    points, swept = collect(sweep)
    chart = plot_pareto(sweep, points, swept)
    panel = chart.panels[0]
    assert (panel.xlabel, panel.ylabel) == ("throughput per GPU (tokens/s/GPU)", "speed per user (tokens/s/user)")
    assert sorted(p for s_ in panel.series for p in s_.points) == [(1400, 80.0), (1500.0, 90.0), (2500.0, 55.0),
                                                                   (3000.0, 30.0)]
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


def v3(status="ok", page_size=1, policy="lru", ttft=900.0, hit=0.3, host=10.0, not_modelled=()):
    """A schema-3 point as job=replay writes it (the fields the summary reads)."""
    doc = v2(status, ttft=ttft, hit=hit, host=host, not_modelled=not_modelled)
    doc["schema_version"] = 3
    doc["objective"] = {"objective": "ttft_p90_ms", "objective_direction": "minimize"}
    doc["deployment"].update(page_size=page_size, eviction_policy=policy, tp_size=1)
    doc["throughput"].update(sla_ttft_ms=2000.0, sla_tpot_ms=50.0)
    return doc


def test_a_result_that_echoes_a_swept_setting_has_no_column_of_its_own(tmp_path):
    """Issue 27: page_size beside schedule.page_size, eviction_policy beside
    memory.radix_eviction_policy were one quantity under two names; an unswept one stays."""
    sweep = tmp_path / "s"
    for i, (ps, pol) in enumerate([(1, "lru"), (64, "lru"), (1, "lfu"), (64, "lfu")]):
        job(sweep, str(i), [f"schedule.page_size={ps}", f"memory.radix_eviction_policy={pol}",
                            "job.sla.ttft_ms=2000"], v3(page_size=ps, policy=pol, ttft=900 + i))
    write_summary(sweep, plots=False)
    table = rows_of(sweep / "summary.csv")
    head = list(table[0])
    assert head[:4] == ["run", "status", "schedule.page_size", "memory.radix_eviction_policy"]
    assert "page_size" not in head and "eviction_policy" not in head and "objective_value" not in head
    assert "tp_size" in head and "sla_tpot_ms" in head       # not swept: the result is the only column
    assert "sla_ttft_ms" in head          # job.sla.ttft_ms is not swept (one value): the result stays
    assert [t["schedule.page_size"] for t in table] == ["1", "64", "1", "64"]


def test_side_results_echo_the_side_and_the_shared_setting():
    from sglang_hydra.jobs.summary import echoed_setting
    swept = ["prefill.schedule.page_size", "deploy.decode_workers", "parallel.tp_size"]
    assert echoed_setting("prefill_page_size", swept) == "prefill.schedule.page_size"
    assert echoed_setting("decode_page_size", swept) is None
    assert echoed_setting("decode_servers", swept) == "deploy.decode_workers"
    assert echoed_setting("prefill_tp_size", swept) == "parallel.tp_size"     # shared by both sides
    assert echoed_setting("tp_size", swept) == "parallel.tp_size"
    assert echoed_setting("page_size", ["schedule.page_size"]) == "schedule.page_size"
    assert echoed_setting("ttft_p90_ms", swept) is None and echoed_setting("gpus", swept) is None


def test_override_values_are_stored_without_quotes(tmp_path):
    """Overrides rendered from a file quote strings (job.trace='conversation'): the table and
    failed.csv store the value."""
    sweep = tmp_path / "s"
    job(sweep, "0", ["job.trace='conversation'", "memory.radix_eviction_policy='lru'"], v3(policy="lru"))
    job(sweep, "1", ["job.trace='conversation'", "memory.radix_eviction_policy='lfu'"],
        error={"overrides": [], "error": "boom", "exit_code": 1})
    write_summary(sweep, plots=False)
    table = rows_of(sweep / "summary.csv")
    assert [t["memory.radix_eviction_policy"] for t in table] == ["lru", "lfu"]
    assert "'" not in (sweep / "summary.csv").read_text().splitlines()[1]
    failed = rows_of(sweep / "failed.csv")
    assert failed[0]["overrides"] == "job.trace=conversation memory.radix_eviction_policy=lfu"


def test_an_interrupted_point_without_its_hydra_files_is_listed(tmp_path):
    """The launcher made the point's directory, the interrupt came before Hydra wrote .hydra."""
    sweep = tmp_path / "s"
    job(sweep, "0", ["memory.hicache_ratio=1"], v2(), objective="ttft_p90_ms")
    (sweep / "1").mkdir()
    rows = write_summary(sweep, interrupted=True)
    assert [r["status"] for r in rows] == ["ok", "interrupted"]
    assert [f["run"] for f in rows_of(sweep / "failed.csv")] == ["1"]
    assert [r["run"] for r in write_summary(sweep)] == ["0"]     # not interrupted: an empty dir is no point


PAGE_WHY = ("below the trace's 512-token block: the trace only says which 512-token blocks repeat, so every hit is "
            "whole blocks whatever the page size; it changes only the rounding of the pools")


def test_identical_rows_of_a_swept_key_are_said_with_the_reason():
    """Issue 27: schedule.page_size=1,64 gave identical rows without a word."""
    def row(i, ps, ratio, ttft, host):
        return {"run": str(i), "status": "ok", "ttft_p90_ms": ttft, "token_hit_rate": 0.1 * ratio,
                "host_memory_gb": host, "not_modelled": [f"schedule.page_size={ps}: {PAGE_WHY}"],
                "_overrides": {"schedule.page_size": str(ps), "memory.hicache_ratio": str(ratio)}}
    # host memory moves in the fifth figure with the page rounding: still the same results
    rows = [row(0, 1, 1, 900.0, 106.439), row(1, 64, 1, 900.0, 106.451), row(2, 1, 2, 800.0, 212.88),
            row(3, 64, 2, 800.0, 212.886)]
    warnings = identical_rows_warnings(rows, ["schedule.page_size", "memory.hicache_ratio"])
    assert warnings == [f"sglang-hydra: warning: schedule.page_size=1,64 gave the same results (latency, throughput, "
                        f"hit rates and host memory within 0.1 %, every other swept setting equal); "
                        f"schedule.page_size is {PAGE_WHY}"]
    rows[3]["ttft_p90_ms"] = 700.0        # one pair differs: nothing to say
    assert identical_rows_warnings(rows, ["schedule.page_size", "memory.hicache_ratio"]) == []
    # rows without figures (job=resolve points) say nothing
    bare = [{"run": str(i), "status": "ok", "_overrides": {"memory.hicache_ratio": str(i)}} for i in range(2)]
    assert identical_rows_warnings(bare, ["memory.hicache_ratio"]) == []
    # a partial reason is not a 'does not model' warning
    assert not_modelled_warnings(rows, ["schedule.page_size", "memory.hicache_ratio"]) == []


def test_identical_series_are_all_shown_and_a_flat_panel_gets_no_best_mark(tmp_path):
    """Issue 27: two series with the same points hid one legend entry, and a star sat on a panel
    where every point had the same throughput."""
    sweep = tmp_path / "s"
    for i, (ratio, ps) in enumerate([(1, 1), (1, 64), (2, 1), (2, 64)]):
        job(sweep, str(i), [f"memory.hicache_ratio={ratio}", f"schedule.page_size={ps}"],
            v2(ttft=1000.0 - 100 * ratio, hit=0.1 * ratio, tok_gpu=378.0, host=100.0 * ratio),
            objective="ttft_p90_ms")
    rows, swept = collect(sweep)
    chart = plot_summary(sweep, rows, swept)
    ttft, tput, hit = chart.panels
    assert (ttft.metric, tput.metric, hit.metric) == ("ttft_p90_ms", "tokens_per_s_per_gpu", "token_hit_rate")
    for panel in chart.panels:
        assert [s_.label for s_ in panel.series] == ["page_size=1", "page_size=64"]
        first, second = panel.series
        assert second.same_as == "page_size=1" and first.same_as is None
        assert first.marker != second.marker and first.points == second.points
        assert "page_size=64 overlaps page_size=1" in panel.notes
        assert panel.xlabel == "memory.hicache_ratio (host memory below each value)"
    assert ttft.ylabel == "P90 TTFT (ms)" and ttft.best == (2.0, pytest.approx(800.0)) and not ttft.flat
    assert tput.flat and tput.best is None
    assert "every point: 378 tokens/s/GPU; the swept settings do not change it" in tput.notes
    pareto = plot_pareto(sweep, rows, swept).panels[0]
    assert [(s_.label, s_.same_as) for s_ in pareto.series] == [("page_size=1", None), ("page_size=64", "page_size=1")]


def test_a_flat_first_panel_says_so_in_the_headline(tmp_path):
    sweep = tmp_path / "s"
    for i, pol in enumerate(["lru", "lfu"]):
        job(sweep, str(i), [f"memory.radix_eviction_policy={pol}"], v2(ttft=900.0), objective="ttft_p90_ms")
    rows, swept = collect(sweep)
    chart = plot_summary(sweep, rows, swept)
    assert chart.panels[0].flat and chart.panels[0].best is None
    assert "every point gives the same P90 TTFT (900 ms)" in chart.title


# ----------------------------------------------------------------------------- docs/outputs.md
def _documented_keys():
    """The key names of docs/outputs.md's one table: single names, ``a ... b`` ranges (their
    common prefix) and ``<...>`` patterns."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "outputs.md").read_text()
    table = text.split("## Every column", 1)[1]
    names, prefixes = set(), set()
    for line in table.splitlines():
        if not line.startswith("| `") and not line.startswith("| *"):
            continue
        first = line.split(" | ", 1)[0]
        found = re.findall(r"`([^`]+)`", first)
        names.update(found)
        if " ... " in first and len(found) == 2:
            a, b = found
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            prefixes.add(a[:n])
        prefixes.update(f.split("<", 1)[0] for f in found if "<" in f and not f.startswith(("prefill_", "decode_")))
    return names, prefixes


def _is_documented(key, names, prefixes):
    if key in names or any(key.startswith(p) for p in prefixes if p):
        return True
    return any(key.startswith(side) and key[len(side):] in names for side in ("prefill_", "decode_"))


def _leaves(doc):
    out = []
    for k, v in doc.items():
        if isinstance(v, dict) and k not in ("rejected_reasons",):
            out.append(k)
            out += _leaves(v)
        else:
            out.append(k)
    return out


def test_every_key_of_the_outputs_is_in_docs_outputs_table(tmp_path):
    """One table documents every column: the leaves of real aggregated (HiCache) and
    disaggregated replays, a sweep's extra columns and a deploy search's rows and JSON."""
    import os
    import subprocess
    import sys

    def run(*args):
        r = subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300, env=dict(os.environ))
        assert r.returncode == 0, r.stderr[-2000:]
    base = ["model=llama3_1_8b", "hardware=h100_80gb", "job.max_requests=60"]
    run("job=replay", *base, "memory=hicache", "deploy.workers=2", "hydra.run.dir=agg")
    run("job=replay", *base, "deploy=pd", "hydra.run.dir=pd")
    run("job=deploy_search", *base, "deploy.total_gpus=2", "job.trace=sample", "job.search.tp=[1]",
        "job.processes=1", "job.sla.ttft_ms=5000", "job.sla.tpot_ms=100", "job.output_dir=search")
    names, prefixes = _documented_keys()
    keys = set()
    for run_dir in ("agg", "pd"):
        doc = json.loads((tmp_path / run_dir / "metrics.json").read_text())
        keys |= set(_leaves({k: v for k, v in doc.items() if k not in ("settings", "objective")}))
        keys |= set(doc["objective"])
    keys -= {"requests", "latency", "throughput", "load", "cache", "memory", "simulation", "deployment",
             "tier_counts"}      # the groups themselves
    search = json.loads((tmp_path / "search" / "deploy_search.json").read_text())
    keys |= set(search) | {k for row in search["deployments"] for k in row} | set(search["best"])
    keys |= set(rows_of(tmp_path / "search" / "summary.csv")[0])
    keys |= {"run", "status", "error", "exit_code", "overrides"}
    missing = sorted(k for k in keys if not _is_documented(k, names, prefixes))
    assert missing == [], f"not in docs/outputs.md's table: {missing}"


def test_best_config_keeps_each_value_s_type(tmp_path):
    """Without Hydra's quotes in the table, best_config.yaml still writes a quoted '1' as a string."""
    sweep = tmp_path / "s"
    job(sweep, "0", ["model.model_path='1'", "memory.hicache_ratio=2", "job.trace='conversation'"], v2(ttft=800),
        objective="ttft_p90_ms")
    job(sweep, "1", ["model.model_path='1'", "memory.hicache_ratio=4", "job.trace='conversation'"], v2(ttft=900),
        objective="ttft_p90_ms")
    write_summary(sweep, plots=True)
    text = (sweep / "best_config.yaml").read_text()
    assert yaml.safe_load(text) == {"memory.hicache_ratio": 2, "model.model_path": "1"}
    assert "#   job.trace=conversation" in text
