"""Sweeper defaults that make ``-m hydra/sweeper=optuna`` answer the job's question.

Optuna's plugin minimises by default and stops the whole study at the first failed trial
(``max_failure_rate: 0``).  Here ``hydra/sweeper=optuna`` keeps the plugin's sweeper class
and every field, with two defaults changed:

* ``direction`` follows ``job.objective`` (``ttft_p90_ms`` is minimised,
  ``token_hit_rate`` maximised ...), through the ``sglang_objective_direction`` resolver;
  an explicit ``hydra.sweeper.direction=...`` still wins;
* ``max_failure_rate: 1.0``: a failed trial (a point over ``job.max_host_memory_gb``, an
  invalid combination) is recorded as FAIL and the study goes on.

A trial that returns NaN would make Optuna 2.10 raise while telling the study (killing
it); the sweep callback turns such a job return into a FAILED one before the sweeper sees
it (:func:`sglang_hydra.jobs.summary.mark_failed_trial`), whatever produced the NaN.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, List, Optional

from ..config.errors import Problem

from ..config.objectives import objective_direction as _direction

RESOLVER = "sglang_objective_direction"
DEFAULT_OBJECTIVE = "ttft_p90_ms"


def objective_direction(objective: Optional[str]) -> str:
    """minimize / maximize for ``job.objective`` (unset or a job without objectives: minimize)."""
    if objective is None or objective == "":
        objective = DEFAULT_OBJECTIVE
    return _direction(str(objective))


def register_sweeper_defaults(cs=None) -> bool:
    """Register the resolver and our defaults for ``hydra/sweeper=optuna`` (idempotent).

    Returns False when the Optuna plugin is not installed (nothing to change)."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver(RESOLVER, objective_direction, replace=True)
    try:
        from hydra_plugins.hydra_optuna_sweeper.config import OptunaSweeperConf
    except ImportError:
        return False
    from hydra.core.config_store import ConfigStore
    from hydra.core.plugins import Plugins

    # Hydra's plugin scan (once per process) re-executes every plugin module, and the
    # plugin's config module stores its own node when it runs: scan first, then store ours.
    Plugins.instance()

    @dataclass
    class SglangOptunaSweeperConf(OptunaSweeperConf):
        direction: Any = "${" + RESOLVER + ":${oc.select:job.objective,null}}"
        max_failure_rate: float = 1.0

    (cs or ConfigStore.instance()).store(group="hydra/sweeper", name="optuna", node=SglangOptunaSweeperConf,
                                         provider="sglang_hydra")
    return True


def under_optuna() -> bool:
    """True inside a trial launched by the Optuna sweeper."""
    try:
        from hydra.core.hydra_config import HydraConfig
        if not HydraConfig.initialized():
            return False
        target = str(HydraConfig.get().sweeper.get("_target_", ""))
    except Exception:  # noqa: BLE001 - outside Hydra's runtime there is no sweeper
        return False
    return "optuna" in target.lower()


# ----------------------------------------------------------------------------- before a sweep
def _override_values(cmd, key: str) -> Optional[List[str]]:
    """The values the command gives ``key`` (a sweep's choices, or its one value); None when
    it does not set it or sweeps it over a range that cannot be listed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for text in reversed(cmd.hydra_overrides):
        if text.split("=", 1)[0].lstrip("+~") != key:
            continue
        try:
            (ov,) = OverridesParser.create().parse_overrides([text])
        except Exception:  # noqa: BLE001 - a malformed override is reported by its own check
            return None
        if ov.is_sweep_override():
            return [str(v) for v in ov.sweep_string_iterator()] if ov.is_discrete_sweep() else None
        return [ov.get_value_element_as_str()]
    return None


def objective_problems(cmd) -> List[Problem]:
    """An objective some point of the sweep cannot produce, found before the sweep runs.

    A timed objective (TTFT, TPOT, throughput, goodput; the default ``ttft_p90_ms`` is one)
    needs hardware with compute and memory-bandwidth figures, and ``hardware=local`` has
    none: rather than a sweep of points that end without their objective, the command
    stops here, naming the hardware and what would work."""
    from ..config.hardware import compose_hardware
    from ..config.objectives import (OBJECTIVES, RETIRED_OBJECTIVES, TIMED_OBJECTIVES, TIMING_FIGURES,
                                     UNTIMED_OBJECTIVES)
    from ..config.presets import default_choices
    from ..config.registry import job_schemas

    jobs = _override_values(cmd, "job") or [cmd.choices.get("job") or dict(default_choices())["job"]]
    schemas = job_schemas()
    with_objective = [j for j in jobs if j in schemas and
                      "objective" in {f.name for f in dataclasses.fields(schemas[j].config_cls)}]
    if not with_objective:
        return []
    named = [str(v) for k, v, _src in cmd.job_settings if k == "objective"]
    objectives = _override_values(cmd, "job.objective") or named[-1:] or [DEFAULT_OBJECTIVE]
    problems: List[Problem] = []
    for objective in objectives:
        if objective not in OBJECTIVES:
            why = RETIRED_OBJECTIVES.get(objective)
            problems.append(Problem("job.objective", None, (f"{objective} was retired: {why}" if why else
                                    f"{objective!r} is not an objective") + f"; allowed: {', '.join(OBJECTIVES)}",
                                    "override"))
    timed = [o for o in objectives if o in TIMED_OBJECTIVES]
    if not timed or problems:
        return problems
    hardware = _override_values(cmd, "hardware") or [cmd.choices.get("hardware") or dict(default_choices())["hardware"]]
    for option in hardware:
        hw, errors = compose_hardware(option, cmd.hardware_settings)
        if errors:
            continue            # an unknown preset is reported by its own check
        missing = [f for f in TIMING_FIGURES if not getattr(hw, f, None)]
        if not missing:
            continue
        for objective in timed:
            problems.append(Problem(
                "job.objective", None,
                f"{objective} needs requests timed on the target, which hardware={option} cannot do (it has no "
                f"{' or '.join(missing)}): choose a hardware preset (hardware=h100_80gb ...), measure this GPU "
                f"with job=calibrate, or optimise what every point produces ({', '.join(UNTIMED_OBJECTIVES)})",
                "override" if named or _override_values(cmd, "job.objective") else "job"))
    return problems
