"""How a sweep survives a bad point.

A failing job writes ``error.json`` into its own job directory (this works with every
launcher, since each job knows its directory), and a callback that runs in the launching
process remembers which sweep directories to read those files back from once the sweep is
over.  Kept apart from :mod:`runner` so a direct run does not import Hydra's callback API.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from hydra.experimental.callback import Callback

from ..config.errors import ConfigError, Problem
from .context import atomic_write

ERROR_FILE = "error.json"

# Sweep directories of the multiruns this process launched (read by the CLI afterwards).
SWEEP_RUNS: List[Path] = []
# ... and of those it started (an interrupted sweep is summarised from here).
SWEEPS_STARTED: List[Path] = []


class SweepDirTaken(BaseException):
    """The sweep directory already holds another sweep.  A BaseException because Hydra turns
    an Exception raised by a callback into a warning and runs the sweep anyway."""

    def __init__(self, error: ConfigError):
        super().__init__(error.render())
        self.error = error


def earlier_sweep_in(sweep_dir: Path) -> Optional[str]:
    """What an earlier sweep left in ``sweep_dir`` (None: absent or empty of sweep outputs)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        return None
    found = [name for name in ("multirun.yaml", "summary.csv", "optimization_results.yaml") if (root / name).exists()]
    jobs = [d for d in _job_dirs(root) if (d / ".hydra").is_dir() or (d / "metrics.json").is_file()
            or (d / ERROR_FILE).is_file()]
    if jobs:
        found.append(f"{len(jobs)} job director{'y' if len(jobs) == 1 else 'ies'}")
    return ", ".join(found) or None


def write_error(job_dir: Path, overrides: Sequence[str], message: str, exit_code: int) -> Path:
    """Record why this job failed, beside its other outputs."""
    data = {"overrides": list(overrides), "error": message, "exit_code": int(exit_code)}
    return atomic_write(Path(job_dir) / ERROR_FILE, json.dumps(data, indent=2) + "\n")


def clear_error(job_dir: Path) -> None:
    """A job that runs again in the same directory starts without the old verdict."""
    try:
        (Path(job_dir) / ERROR_FILE).unlink()
    except FileNotFoundError:
        pass


def failed_return_value(cfg) -> Any:
    """What a failed job hands back to the sweeper.

    A job that declares an ``objective`` (an Optuna study) returns NaN, which the sweeper
    records as a failed trial instead of stopping the study; other jobs return None.
    """
    job = cfg.get("job") if hasattr(cfg, "get") else None
    if (job is not None and hasattr(job, "keys") and "objective" in job) or \
            (hasattr(cfg, "keys") and "objective" in cfg):
        return float("nan")
    return None


def _job_dirs(sweep_dir: Path) -> List[Path]:
    """The job directories of a sweep: its subdirectories (``hydra.sweep.subdir``, by default
    the job number), sorted by job number."""
    root = Path(sweep_dir)
    dirs = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")] if root.is_dir() else []
    return sorted(dirs, key=lambda p: (len(p.name), p.name))


def count_jobs(sweep_dir: Path) -> int:
    return len(_job_dirs(sweep_dir))


def collect_errors(sweep_dir: Path) -> List[Dict[str, Any]]:
    """Every ``error.json`` of one sweep, in job order, with ``job`` (its dir name) and ``path``."""
    out = []
    for d in _job_dirs(sweep_dir):
        p = d / ERROR_FILE
        if not p.is_file():
            continue
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {"overrides": [], "error": f"unreadable {ERROR_FILE}", "exit_code": 1}
        data.update(job=d.name, path=str(p))
        out.append(data)
    return out


class SweepFailures(Callback):
    """Refuses a sweep directory another sweep already wrote to (two sweeps' points would be
    mixed in one summary), and remembers the directory for the CLI's report."""

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        found = earlier_sweep_in(sweep_dir)
        if found:
            raise SweepDirTaken(ConfigError([Problem(
                "hydra.sweep.dir", None,
                f"{sweep_dir} already holds a sweep ({found}); sweeps are not merged into one directory: pick "
                f"another with hydra.sweep.dir=<new directory> (without it every command gets a new "
                f"multirun/<date>/<time>), or remove {sweep_dir} first", "override")]))
        SWEEPS_STARTED.append(sweep_dir)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        SWEEP_RUNS.append(Path(str(config.hydra.sweep.dir)))
