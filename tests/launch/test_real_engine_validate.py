"""The what-if held against a real SGLang 0.5.23 server on this CPU (CI's small version of
scripts/validate_real_engine.py; the full one and its figures: docs/validate.md, docs/benchmarks.md).

Each test is one ``sglang-hydra job=validate`` command as a user types it: the server is launched
through job=launch's code, the trace is served through the real client, the replay predicts the
same requests on this machine's profile (``job.calibrate=true``, fitted on the launched engine),
and every request is compared.  The worst figures are printed.

    SGLANG_HYDRA_REFERENCE_PYTHON=/path/to/engine-venv/bin/python python -m pytest -s tests/launch/test_real_engine_validate.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REFERENCE_PYTHON = os.environ.get("SGLANG_HYDRA_REFERENCE_PYTHON")
pytestmark = [pytest.mark.reference, pytest.mark.skipif(
    not REFERENCE_PYTHON, reason="set SGLANG_HYDRA_REFERENCE_PYTHON to a venv with sglang 0.5.23 (docs/validate.md)")]

BASE = ["job=validate", "model=tiny_llama", "hardware=local", "schedule.page_size=16", "job.trace=conversation",
        "job.max_input_tokens=2048", "job.calibrate=true"]


def _validate(tmp_path, *args):
    p = subprocess.run([sys.executable, "-m", "sglang_hydra", *BASE, f"job.python={REFERENCE_PYTHON}", *args,
                        f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=600)
    print(p.stdout)
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    summary = json.loads((tmp_path / "validation.json").read_text())
    worst = {m: summary["errors"][m]["max_rel_error"] for m in ("ttft_ms", "tpot_ms", "e2e_ms")}
    print(f"worst per-request relative error: {worst}; checks failed: {summary['checks_failed']}")
    return p, summary


def test_one_request_at_a_time_every_cached_token_count_is_the_engines(tmp_path):
    # a 12,000-token pool: the 100 prompts (up to 2,048 tokens) evict from it
    p, s = _validate(tmp_path, "job.pacing=sequential", "job.max_requests=100", "job.max_output_tokens=4",
                     "schedule.max_total_tokens=12000", "job.tolerance.cached_token_mismatches=0",
                     *TIMING_TOLERANCES)
    assert s["paired_requests"] == 100
    assert s["errors"]["cached_tokens"]["mismatches"] == 0, s["errors"]["cached_tokens"]["first_mismatches"]
    assert s["predicted"]["token_hit_rate"] == s["measured"]["token_hit_rate"] > 0
    assert p.returncode == 0, s["checks_failed"]


def test_concurrent_requests_hit_rate_and_latency_within_tolerance(tmp_path):
    p, s = _validate(tmp_path, "job.pacing=rate", f"job.rate={CONCURRENT_RATE}", "job.max_requests=200",
                     "job.max_output_tokens=16", *TIMING_TOLERANCES)
    assert s["paired_requests"] == 200
    assert abs(s["predicted"]["token_hit_rate"] - s["measured"]["token_hit_rate"]) <= 0.01
    assert p.returncode == 0, s["checks_failed"]


#: requests/s of the concurrent test: about 20 % of what this 2-core machine's server serves
#: (20.1 requests/s with every request sent at once, scripts/validate_real_engine.py)
CONCURRENT_RATE = 4.0
#: measured on an idle 2-core box (docs/benchmarks.md): sequential TTFT P50 -25 %, P90 -14 %, TPOT
#: P50 +20 %; at 20 % load TTFT P50 -35 %, P90 -25 %, TPOT P50 -10 %.  The issue's 25 % is not yet
#: reached for TTFT; CI holds what is reached with a margin, so a regression fails it
TIMING_TOLERANCES = ("job.tolerance.ttft_p50=0.6", "job.tolerance.ttft_p90=0.6", "job.tolerance.tpot_p50=0.5")
