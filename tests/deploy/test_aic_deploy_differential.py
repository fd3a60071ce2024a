"""job=deploy_search held against aiconfigurator 0.12.0 on the same question (issue 19, scope 5).

The peer answers "agg or disagg, which layout, how many tokens/s per GPU" for a steady synthetic
load without prefix reuse from kernel timings measured with SGLang.  On the issue's shape
(Llama-3.1-8B, 8 x H100, ISL 4096, OSL 512, TTFT <= 1 s, TPOT <= 20 ms) our search is asked the same
question (``job.rate_search=true``, every GPU used as the peer's deployments do, prefill chunks mixed
into decode steps as the peer's aggregated model does).

The peer runs twice.  ``cli default`` is its answer as shipped: it derates disaggregated serving by
blanket corrections that nothing in its kernel tables measures (prefill passes x1.1, decode passes
x1.08, rate-matched prefill / decode throughput x0.9 / x0.92; ``sdk/task_v2.py``), the same on every
GPU and link.  Our presets carry no such scale (issue 28): a PD server's cost is its simulated KV
transfer (cited per-backend link efficiencies plus a bootstrap and polling cost), paid once.  So the
second run, ``cli exp`` with the same task and those four factors at 1.0, is the comparable one:

* best agg tokens/s/GPU vs the peer's agg (the corrections touch disagg only; the two runs' agg must
  agree, which checks that the ``cli exp`` task is ``cli default``'s);
* best disagg vs the peer's uncorrected disagg;
* the chosen mode, and our best tokens/s/GPU, vs the peer's choice without the corrections.

Each ratio must be within 25 %, and the mode must match.  The corrected run is printed with its
ratios (2026-12-05: the peer picks agg 1,959 over disagg 1,695 with them, disagg 3P TP1 + 5D TP1 at
2,041 over agg 1,959 without; we pick 3P TP1 + 5D TP1 at 2,120 over agg 4 x TP2 at 2,000, which is
1.25 x the corrected disagg and 1.04 x the uncorrected one; docs/benchmarks.md).

aiconfigurator runs in its own interpreter (``SGLANG_HYDRA_AIC_PYTHON``; ``.ci/run`` builds it);
without the variable the test is skipped, and the ``reference`` marker keeps it out of the main
suite's ``-m "not reference"``.  About 2.5-5 minutes on 2 shared cores (the peer ~40 s for both
runs, the search ~2-4 min; 155 s on 2026-12-05).
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
MODEL, SYSTEM, GPUS, TTFT_MS, TPOT_MS = "meta-llama/Meta-Llama-3.1-8B", "h100_sxm", 8, 1000, 20
# aiconfigurator 0.12.0's blanket disaggregated-serving corrections, set neutral for the comparable run.
NEUTRAL_DISAGG_CORRECTIONS = {"prefill_latency_correction": 1.0, "decode_latency_correction": 1.0,
                              "rate_match_prefill_degradation": 1.0, "rate_match_decode_degradation": 1.0}


def steady_trace(path: Path) -> Path:
    """Steady arrivals (one every 100 ms: the rate search scales it), no prefix shared by two requests."""
    blocks = -(-ISL // 512)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(REQUESTS):
            fh.write(json.dumps({"timestamp": i * GAP_MS, "input_length": ISL, "output_length": OSL,
                                 "hash_ids": list(range(i * blocks, (i + 1) * blocks))}) + "\n")
    return path


def parse_aic(text: str) -> dict:
    """The chosen mode and each mode's best tokens/s/GPU from an aiconfigurator ``cli`` report."""
    chosen = re.search(r"Best Experiment Chosen: (agg|disagg) at ([\d.]+) tokens/s/gpu", text)
    assert chosen, text[-3000:]
    out = {"mode": chosen.group(1), "tokens_per_s_per_gpu": float(chosen.group(2))}
    for mode in ("agg", "disagg"):
        m = re.search(rf"^{mode} Top Configurations:.*?\n\|\s*1\s*\|\s*sglang\s*\|\s*([\d.]+)\s*\|", text, re.S | re.M)
        out[mode] = float(m.group(1)) if m else None
    return out


def experiments_yaml(path: Path) -> Path:
    """``cli default``'s agg and disagg tasks for the question, the disagg one without the blanket corrections.

    JSON is YAML, so no YAML writer is needed on our side.
    """
    shared = {"total_gpus": GPUS, "isl": ISL, "osl": OSL, "ttft": float(TTFT_MS), "tpot": float(TPOT_MS)}
    experiments = {
        "agg": {"serving_mode": "agg", "model_path": MODEL, "system_name": SYSTEM, "backend_name": "sglang", **shared},
        "disagg": {"serving_mode": "disagg", "prefill_model_path": MODEL, "decode_model_path": MODEL,
                   "prefill_system_name": SYSTEM, "decode_system_name": SYSTEM, "prefill_backend_name": "sglang",
                   "decode_backend_name": "sglang", **shared, **NEUTRAL_DISAGG_CORRECTIONS},
    }
    path.write_text(json.dumps(experiments, indent=2), encoding="utf-8")
    return path


def run_aiconfigurator(python: str, args: list[str]) -> dict:
    exe = Path(python).parent / "aiconfigurator"
    cmd = [str(exe)] if exe.exists() else [python, "-m", "aiconfigurator.main"]
    r = subprocess.run(cmd + ["cli", *args], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return parse_aic(r.stdout + r.stderr)


def run_peer_as_shipped(python: str) -> dict:
    return run_aiconfigurator(python, ["default", "--model-path", MODEL, "--system", SYSTEM, "--total-gpus", str(GPUS),
                                       "--isl", str(ISL), "--osl", str(OSL), "--ttft", str(TTFT_MS),
                                       "--tpot", str(TPOT_MS), "--backend", "sglang"])


def run_peer_uncorrected(python: str, tmp_path: Path) -> dict:
    return run_aiconfigurator(python, ["exp", "--yaml-path", str(experiments_yaml(tmp_path / "aic_neutral.yaml"))])


def run_search(tmp_path: Path, trace: Path) -> dict:
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=deploy_search", "model=llama3_1_8b",
                        "hardware=h100_80gb", f"deploy.total_gpus={GPUS}", f"job.trace={trace}", "job.arrival=as_is",
                        f"job.sla.ttft_ms={TTFT_MS}", f"job.sla.tpot_ms={TPOT_MS}", "job.rate_search=true",
                        "job.search.all_gpus=true", "job.search.chunked_prefill_size=[512,1024,2048,null]",
                        "schedule.enable_mixed_chunk=true", "job.format=json"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_parse_aic_report():
    text = ("Best Experiment Chosen: agg at 1959.18 tokens/s/gpu (agg 1.16x better than disagg)\n"
            "agg Top Configurations: (Ranked by tokens/s/gpu)\n+---+\n| Rank | backend |\n+---+\n"
            "|  1   |  sglang |   1959.18    |     50.56     |\n"
            "disagg Top Configurations: (Ranked by tokens/s/gpu)\n+---+\n| Rank |\n+---+\n"
            "|  1   |  sglang |   1695.15    |     51.08     |\n")
    assert parse_aic(text) == {"mode": "agg", "tokens_per_s_per_gpu": 1959.18, "agg": 1959.18, "disagg": 1695.15}
    # ``cli exp`` names the chosen experiment without the comparison in brackets.
    exp_text = text.replace("agg at 1959.18 tokens/s/gpu (agg 1.16x better than disagg)",
                            "disagg at 2040.77 tokens/s/gpu")
    assert parse_aic(exp_text)["mode"] == "disagg"


def test_experiments_yaml_neutralises_only_the_disagg_corrections(tmp_path):
    experiments = json.loads(experiments_yaml(tmp_path / "x.yaml").read_text(encoding="utf-8"))
    assert set(experiments) == {"agg", "disagg"}
    assert all(experiments["disagg"][k] == 1.0 for k in NEUTRAL_DISAGG_CORRECTIONS)
    assert not set(NEUTRAL_DISAGG_CORRECTIONS) & set(experiments["agg"])
    assert {e["isl"] for e in experiments.values()} == {ISL}
    assert {e["tpot"] for e in experiments.values()} == {TPOT_MS}


@pytest.mark.aiconfigurator
@pytest.mark.reference
def test_deploy_search_within_25_percent_of_the_peer(tmp_path):
    python = os.environ.get("SGLANG_HYDRA_AIC_PYTHON")
    if not python:
        pytest.skip("SGLANG_HYDRA_AIC_PYTHON is not set: it names an interpreter with aiconfigurator==0.12.0 "
                    "installed (.ci/run builds one)")
    shipped = run_peer_as_shipped(python)
    peer = run_peer_uncorrected(python, tmp_path)
    ours = run_search(tmp_path, steady_trace(tmp_path / "steady.jsonl"))
    best = ours["best"]
    rows = ours["deployments"]
    by_mode = {m: max((r["tokens_per_s_per_gpu"] for r in rows if r["mode"] == m and r["meets_sla"]), default=0.0)
               for m in ("agg", "disagg")}
    print(f"\naiconfigurator cli default (blanket disagg corrections): {shipped['mode']} best, agg {shipped['agg']} / "
          f"disagg {shipped['disagg']} tokens/s/GPU")
    print(f"aiconfigurator cli exp (corrections 1.0): {peer['mode']} best, agg {peer['agg']} / disagg {peer['disagg']} "
          "tokens/s/GPU")
    print(f"sglang-hydra: {best['mode']} {best['layout']} best, agg {by_mode['agg']:.0f} / disagg "
          f"{by_mode['disagg']:.0f} tokens/s/GPU")
    ratios = {"best": best["tokens_per_s_per_gpu"] / peer["tokens_per_s_per_gpu"],
              "best agg": by_mode["agg"] / peer["agg"], "best disagg": by_mode["disagg"] / peer["disagg"]}
    shipped_ratios = {"best": best["tokens_per_s_per_gpu"] / shipped["tokens_per_s_per_gpu"],
                      "best disagg": by_mode["disagg"] / shipped["disagg"]}
    worst = max(ratios, key=lambda k: abs(ratios[k] - 1))
    print("ours / peer without corrections: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items())
          + f"; worst: {worst} {ratios[worst]:.3f} (tolerance {TOLERANCE:.0%})")
    print("ours / peer as shipped (not asserted): " + ", ".join(f"{k} {v:.3f}" for k, v in shipped_ratios.items())
          + f"; mode {'same' if best['mode'] == shipped['mode'] else 'differs'}")
    assert peer["agg"] == pytest.approx(shipped["agg"], rel=1e-6), (
        f"the cli exp task is not cli default's: agg {peer['agg']} vs {shipped['agg']}")
    for name, ratio in ratios.items():
        assert abs(ratio - 1) <= TOLERANCE, f"{name} tokens/s/GPU is {ratio:.3f} x the uncorrected peer's"
    assert best["mode"] == peer["mode"], (
        f"we pick {best['mode']} ({best['layout']}), the peer without corrections picks {peer['mode']}: our agg "
        f"{by_mode['agg']:.0f} / disagg {by_mode['disagg']:.0f}, its agg {peer['agg']} / disagg {peer['disagg']}")
