"""Predicted against measured: the errors and the checks of job=validate."""
from __future__ import annotations

import pytest

from sglang_hydra.workload.validation import Tolerances, judge, relative_errors, pair_rows, rows_saturated, summarize


def _row(i, cached=0, ttft=100.0, tpot=10.0, worker="agg0", arrival=None, finished=True):
    return {"index": i, "arrival_ms": float(i * 1000 if arrival is None else arrival), "input_tokens": 100,
            "output_tokens": 8, "cached_tokens": cached, "ttft_ms": ttft, "tpot_ms": tpot,
            "e2e_ms": ttft + 7 * tpot, "worker": worker, "finished": finished}


def test_identical_sides_pass_every_check():
    rows = [_row(i, cached=16 * (i % 3)) for i in range(20)]
    s = summarize(rows, rows)
    assert s["paired_requests"] == 20
    assert s["errors"]["ttft_ms"]["median_rel_error"] == 0.0
    assert judge(s, Tolerances(cached_token_mismatches=0)) == []


def test_each_check_names_its_numbers():
    pred = [_row(i, cached=32, ttft=100.0, worker="agg0" if i < 15 else "agg1") for i in range(20)]
    meas = [_row(i, cached=16 if i == 3 else 32, ttft=160.0, worker="agg0" if i < 10 else "agg1") for i in range(20)]
    failed = judge(summarize(pred, meas), Tolerances(cached_token_mismatches=0, hit_rate_points=0.5))
    text = "\n".join(failed)
    assert "cached tokens differ on 1 of 20 requests" in text and "#3 predicted 32 measured 16" in text
    assert "TTFT P50 100.0 ms predicted vs 160.0 ms measured: 38% off" in text
    assert "worker agg0: 75.0% of the requests predicted vs 50.0% measured" in text
    assert any(f.startswith("token hit rate") for f in failed)
    # within looser tolerances the same sides pass
    loose = Tolerances(cached_token_mismatches=1, hit_rate_points=1.0, ttft_p50=0.5, ttft_p90=0.5,
                       worker_share_points=30)
    assert judge(summarize(pred, meas), loose) == []


def test_relative_errors_skip_missing_and_zero_measurements():
    pairs = pair_rows([_row(0, ttft=110.0), _row(1), _row(2, finished=False)],
                      [_row(0, ttft=100.0), _row(1, ttft=0.0), _row(2)])
    assert len(pairs) == 2
    assert relative_errors(pairs, "ttft_ms") == pytest.approx([0.1])


def test_saturation_is_judged_the_same_way_on_both_sides():
    keeping_up = [_row(i, ttft=100.0) for i in range(40)]
    # the wait grows with every arrival: the last quarter waits far longer than the first
    backlog = [_row(i, ttft=100.0 + 2000.0 * i) for i in range(40)]
    assert not rows_saturated(keeping_up)
    assert rows_saturated(backlog)
    assert rows_saturated(keeping_up[:-1] + [_row(39, finished=False)])
    s = summarize(keeping_up, backlog, predicted_saturated=False, measured_saturated=True)
    assert "predicted keeping up, measured saturated" in judge(s, Tolerances(ttft_p50=None, ttft_p90=None))
