"""job=deploy_search held against aiconfigurator 0.12.0's ``cli default`` (issue 19, scope 5).

The peer answers "agg or disagg, which layout, how many tokens/s per GPU" for a steady synthetic
load without prefix reuse from kernel timings measured with SGLang.  On the issue's shape
(Llama-3.1-8B, 8 x H100, ISL 4096, OSL 512, TTFT <= 1 s, TPOT <= 20 ms) our search, asked the
same question (``job.rate_search=true``, every GPU used as the peer's deployments do, prefill
chunks mixed into decode steps as the peer's aggregated model does): its best tokens/s/GPU, and its
best aggregated and best disaggregated tokens/s/GPU, must be within 25 % of the peer's.

It must also pick the same mode (agg or disagg) as the peer.  The peer derates disaggregated
serving by blanket per-phase latency corrections (prefill passes x1.1, decode x1.08, the same on every
GPU); the hardware presets carried them as ``disagg_*_pass_scale`` until issue 28, on top of the
simulated KV transfer, so the transfer was paid twice.  The presets now carry none: a PD server's cost
is its KV transfer (per-backend link efficiency from public measurements, plus a fixed bootstrap and
polling cost per transfer), paid once.  With that, on the refitted pass-time model, our best
disaggregated layout (3P TP1 + 5D TP1, 2,120 tokens/s/GPU) edges out the best aggregated one
(4 x TP2, 2,000) where the peer prefers agg by 16 %, and the disaggregated figure is 1.251 x the
peer's: this test fails on the mode and by 0.1 % on best disagg (docs/benchmarks.md, issue 28).
The failure is reported, not tuned away.

aiconfigurator runs in its own interpreter (``SGLANG_HYDRA_AIC_PYTHON``; ``.ci/run`` builds it);
without the variable the test is skipped, and the ``reference`` marker keeps it out of the main
suite's ``-m "not reference"``.  About 3-4 minutes on 2 cores (the peer ~20-50 s, the search ~2-3 min).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TOLERANCE = 0.25
# The peer answers for the steady state.  A request decodes for ~10 s (512 tokens at ~20 ms), so the
# trace must span several of those at the rates tried: with 800 requests (~26 s at 31 req/s) a P90
# over the trace admitted rates whose decode batch was still growing when the trace ended
# (4P TP1 + 1D TP4 met the SLA at 36.9 req/s on 800 requests; on 3,200 its P90 TTFT is 7.8 s there).
ISL, OSL, REQUESTS, GAP_MS = 4096, 512, 3200, 100


def steady_trace(path: Path) -> Path:
    """Steady arrivals (one every 100 ms: the rate search scales it), no prefix shared by two requests."""
    blocks = -(-ISL // 512)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(REQUESTS):
            fh.write(json.dumps({"timestamp": i * GAP_MS, "input_length": ISL, "output_length": OSL,
                                 "hash_ids": list(range(i * blocks, (i + 1) * blocks))}) + "\n")
    return path


def parse_aic(text: str) -> dict:
    """The chosen mode and each mode's best tokens/s/GPU from ``aiconfigurator cli default``'s report."""
    chosen = re.search(r"Best Experiment Chosen: (agg|disagg) at ([\d.]+) tokens/s/gpu", text)
    assert chosen, text[-3000:]
    out = {"mode": chosen.group(1), "tokens_per_s_per_gpu": float(chosen.group(2))}
    for mode in ("agg", "disagg"):
        m = re.search(rf"^{mode} Top Configurations:.*?\n\|\s*1\s*\|\s*sglang\s*\|\s*([\d.]+)\s*\|", text, re.S | re.M)
        out[mode] = float(m.group(1)) if m else None
    return out


def run_aiconfigurator(python: str) -> dict:
    exe = Path(python).parent / "aiconfigurator"
    cmd = [str(exe)] if exe.exists() else [python, "-m", "aiconfigurator.main"]
    r = subprocess.run(cmd + ["cli", "default", "--model-path", "meta-llama/Meta-Llama-3.1-8B", "--system", "h100_sxm",
                              "--total-gpus", "8", "--isl", str(ISL), "--osl", str(OSL), "--ttft", "1000", "--tpot", "20",
                              "--backend", "sglang"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return parse_aic(r.stdout + r.stderr)


def run_search(tmp_path: Path, trace: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=deploy_search", "model=llama3_1_8b",
                        "hardware=h100_80gb", "deploy.total_gpus=8", f"job.trace={trace}", "job.arrival=as_is",
                        "job.sla.ttft_ms=1000", "job.sla.tpot_ms=20", "job.rate_search=true", "job.search.all_gpus=true",
                        "job.search.chunked_prefill_size=[512,1024,2048,null]", "schedule.enable_mixed_chunk=true",
                        "job.format=json"], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_parse_aic_report():
    text = ("Best Experiment Chosen: agg at 1959.18 tokens/s/gpu (agg 1.16x better than disagg)\n"
            "agg Top Configurations: (Ranked by tokens/s/gpu)\n+---+\n| Rank | backend |\n+---+\n"
            "|  1   |  sglang |   1959.18    |     50.56     |\n"
            "disagg Top Configurations: (Ranked by tokens/s/gpu)\n+---+\n| Rank |\n+---+\n"
            "|  1   |  sglang |   1695.15    |     51.08     |\n")
    assert parse_aic(text) == {"mode": "agg", "tokens_per_s_per_gpu": 1959.18, "agg": 1959.18, "disagg": 1695.15}


@pytest.mark.aiconfigurator
@pytest.mark.reference
def test_deploy_search_within_25_percent_of_the_peer(tmp_path):
    python = os.environ.get("SGLANG_HYDRA_AIC_PYTHON")
    if not python:
        pytest.skip("SGLANG_HYDRA_AIC_PYTHON is not set: it names an interpreter with aiconfigurator==0.12.0 "
                    "installed (.ci/run builds one)")
    peer = run_aiconfigurator(python)
    ours = run_search(tmp_path, steady_trace(tmp_path / "steady.jsonl"))
    best = ours["best"]
    rows = ours["deployments"]
    by_mode = {m: max((r["tokens_per_s_per_gpu"] for r in rows if r["mode"] == m and r["meets_sla"]), default=0.0)
               for m in ("agg", "disagg")}
    print(f"\naiconfigurator: {peer['mode']} best, agg {peer['agg']} / disagg {peer['disagg']} tokens/s/GPU; "
          f"sglang-hydra: {best['mode']} {best['layout']} best, agg {by_mode['agg']:.0f} / disagg "
          f"{by_mode['disagg']:.0f} tokens/s/GPU")
    ratio = best["tokens_per_s_per_gpu"] / peer["tokens_per_s_per_gpu"]
    ratios = {"best": ratio, "best agg": by_mode["agg"] / peer["agg"], "best disagg": by_mode["disagg"] / peer["disagg"]}
    worst = max(ratios, key=lambda k: abs(ratios[k] - 1))
    print("ours / peer: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items())
          + f"; worst: {worst} {ratios[worst]:.3f} (tolerance {TOLERANCE:.0%})")
    assert abs(ratio - 1) <= TOLERANCE, f"best tokens/s/GPU {best['tokens_per_s_per_gpu']:.0f} is {ratio:.2f} x the peer's"
    agg_ratio = by_mode["agg"] / peer["agg"]
    assert abs(agg_ratio - 1) <= TOLERANCE, f"best agg tokens/s/GPU {by_mode['agg']:.0f} is {agg_ratio:.2f} x the peer's"
    disagg_ratio = by_mode["disagg"] / peer["disagg"]
    assert abs(disagg_ratio - 1) <= TOLERANCE, (
        f"best disagg tokens/s/GPU {by_mode['disagg']:.0f} is {disagg_ratio:.2f} x the peer's")
    assert best["mode"] == peer["mode"], (
        f"we pick {best['mode']} ({best['layout']}), the peer picks {peer['mode']}: our agg {by_mode['agg']:.0f} / "
        f"disagg {by_mode['disagg']:.0f} tokens/s/GPU")
