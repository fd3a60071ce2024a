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

from dataclasses import dataclass
from typing import Any, Optional

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
