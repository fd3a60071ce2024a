"""What ``job.objective`` may name: the one list the replay, the sweep and Optuna all read.

Each objective is a leaf of the metrics schema (``metrics.json``, schema_version 2), with
its unit in its name, the way that is better, and what a point needs to produce it.  It
lives in the config layer (pure Python, no imports) so that the job settings' choices, the
replay (workload layer) and the sweep summary (jobs layer) import the same table.

Retired names stay listed with the reason, so a command that still uses one is told what
replaced it rather than just "not allowed":

* ``prefill_throughput`` measured *uncached* prompt tokens per second: a better cache
  leaves fewer tokens to compute and scored lower.  ``tokens_per_s_per_gpu`` (tokens served
  per second per GPU) and ``token_hit_rate`` rise with a better cache.
* ``block_hit_rate`` is not in the metrics schema (no mode of the what-if produces it any
  more); ``token_hit_rate`` is.
"""
from __future__ import annotations

from typing import Dict, Tuple

MINIMIZE = "minimize"
MAXIMIZE = "maximize"

#: objective -> direction (lower or higher is better)
OBJECTIVES: Dict[str, str] = {
    "ttft_p50_ms": MINIMIZE, "ttft_p90_ms": MINIMIZE, "ttft_p99_ms": MINIMIZE, "ttft_mean_ms": MINIMIZE,
    "tpot_p50_ms": MINIMIZE, "tpot_p90_ms": MINIMIZE, "tpot_p99_ms": MINIMIZE,
    "itl_p90_ms": MINIMIZE, "e2e_p50_ms": MINIMIZE, "e2e_p90_ms": MINIMIZE, "e2e_p99_ms": MINIMIZE,
    "transfer_p90_ms": MINIMIZE,
    "tokens_per_s_per_gpu": MAXIMIZE, "tokens_per_s_per_user": MAXIMIZE, "goodput_rps_per_gpu": MAXIMIZE,
    "requests_per_s": MAXIMIZE, "token_hit_rate": MAXIMIZE, "host_memory_gb": MINIMIZE,
}

#: objectives that need requests timed on the target: a hardware preset with compute and
#: memory-bandwidth figures (``hardware=local`` has none until ``job=calibrate`` writes them)
TIMED_OBJECTIVES: Tuple[str, ...] = tuple(k for k in OBJECTIVES if k not in ("token_hit_rate", "host_memory_gb"))

#: objectives every point produces, whatever the hardware
UNTIMED_OBJECTIVES: Tuple[str, ...] = tuple(k for k in OBJECTIVES if k not in TIMED_OBJECTIVES)

#: names that used to be objectives -> why they went and what to use instead
RETIRED_OBJECTIVES: Dict[str, str] = {
    "prefill_throughput": "it counted uncached tokens per second, so a better cache scored lower; "
                          "use tokens_per_s_per_gpu or token_hit_rate",
    "block_hit_rate": "no mode of the what-if produces it; use token_hit_rate",
}

#: the hardware figures request timing needs (see TIMED_OBJECTIVES)
TIMING_FIGURES: Tuple[str, ...] = ("bf16_tflops", "hbm_bandwidth_gbps")


def objective_direction(objective: str) -> str:
    """``minimize`` or ``maximize``; a retired or unknown name is a ValueError saying why."""
    try:
        return OBJECTIVES[objective]
    except KeyError:
        why = RETIRED_OBJECTIVES.get(objective)
        if why:
            raise ValueError(f"job.objective={objective} was retired: {why}") from None
        raise ValueError(f"unknown job.objective {objective!r}; allowed: {', '.join(OBJECTIVES)}") from None

