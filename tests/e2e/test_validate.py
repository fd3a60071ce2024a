"""job=validate end to end through the CLI, against a running test double of /generate (job.url).

The real engine is the ``reference`` test (tests/launch/test_real_engine_validate.py); here the
job's own path is checked: requests chosen and sent, the prediction made on the same requests,
the files written, the checks judged and the exit status."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_hydra.utils.ports import free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
from fake_engine import started  # noqa: E402
BASE = ["job=validate", "model=tiny", "hardware=h100_80gb", "schedule.page_size=16", "schedule.max_total_tokens=60000",
        "model.context_length=131072", "job.max_requests=30", "job.max_input_tokens=4096", "job.max_output_tokens=4"]


@pytest.fixture(scope="module")
def engine():
    with started("--prefill-ms", "1", "--decode-ms", "1", "--weight-version", "agg0") as url:
        yield url


def _run(args, tmp_path):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args, f"hydra.run.dir={tmp_path}"],
                          capture_output=True, text=True, timeout=300)


def test_validate_writes_every_file_and_compares_each_request(engine, tmp_path):
    p = _run(BASE + [f"job.url={engine}", "job.tolerance.cached_token_mismatches=0", "job.tolerance.ttft_p50=null",
                     "job.tolerance.ttft_p90=null", "job.tolerance.tpot_p50=null"], tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    summary = json.loads((tmp_path / "validation.json").read_text())
    assert summary["paired_requests"] == 30 and summary["ok"]
    assert summary["errors"]["cached_tokens"]["mismatches"] == 0
    assert summary["measured"]["token_hit_rate"] > 0       # the sample trace shares prefixes
    rows = list(csv.DictReader((tmp_path / "validation.csv").open()))
    assert len(rows) == 30
    assert {"cached_tokens_predicted", "cached_tokens_measured", "ttft_ms_predicted", "ttft_ms_measured",
            "worker_predicted", "worker_measured"} <= set(rows[0])
    assert all(r["worker_measured"] == "agg0" for r in rows)
    sent = (tmp_path / "sent_trace.jsonl").read_text().splitlines()
    assert len(sent) == 30 and all(json.loads(s)["output_length"] <= 4 for s in sent)
    assert (tmp_path / "validation.png").stat().st_size > 0
    assert len((tmp_path / "predicted.jsonl").read_text().splitlines()) == 30
    assert len((tmp_path / "measured.jsonl").read_text().splitlines()) == 30


def test_a_prediction_outside_the_tolerance_exits_1_after_writing(engine, tmp_path):
    # the double answers in ~1 ms per token; an H100 prediction of the tiny model is far from that
    p = _run(BASE + [f"job.url={engine}", "job.tolerance.tpot_p50=0.01", "job.max_requests=10"], tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAILED: TPOT P50" in p.stdout and "Traceback" not in p.stderr
    assert json.loads((tmp_path / "validation.json").read_text())["ok"] is False


def test_bad_settings_exit_2_all_at_once(tmp_path):
    p = _run(BASE + ["job.pacing=rate", "job.max_requests=0"], tmp_path)
    assert p.returncode == 2
    assert "job.rate" in p.stderr and "job.max_requests" in p.stderr and "Traceback" not in p.stderr


def test_a_dead_engine_fails_the_run(tmp_path):
    p = _run(BASE + [f"job.url=http://127.0.0.1:{free_port()}", "job.max_requests=3"], tmp_path)
    assert p.returncode != 0 and "Traceback" not in p.stderr
