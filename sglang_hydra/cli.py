"""The ``sglang-hydra`` command.

The legacy flags are translated before Hydra sees the command line (Hydra's own parser
would swallow or misread them).  A plain single run is composed directly and runs at
once; anything that needs Hydra's runtime (``-m`` sweeps, ``--cfg``, ``--info``,
``--help``, shell completion, ``hydra.*`` settings) goes through ``@hydra.main`` with the
legacy flags rendered as overrides in their original position.
"""
from __future__ import annotations

import logging
import sys
from typing import List, Optional, Sequence

from .config.errors import ConfigError

EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130   # 128 + SIGINT, what shells report for Ctrl-C


def _interrupted() -> int:
    """Ctrl-C ends a run with a one-line message instead of a traceback; jobs clean up on the
    way out (e.g. the file storage removes its unfinished temp files)."""
    print("sglang-hydra: interrupted (SIGINT); stopped before the job finished", file=sys.stderr)
    return EXIT_INTERRUPTED


def _print_problems(err: ConfigError) -> None:
    print(f"sglang-hydra: {err.render()}", file=sys.stderr)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="[%(levelname)s] %(name)s: %(message)s", stream=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from .config.compose import build_command

    try:
        cmd, hydra_flags = build_command(argv=argv, allow_sweep=True)
    except ConfigError as err:  # pragma: no cover - build_command collects instead of raising
        _print_problems(err)
        return EXIT_CONFIG
    if hydra_flags or cmd.sweep or cmd.hydra_only:
        if cmd.problems:
            _print_problems(ConfigError(cmd.problems))
            return EXIT_CONFIG
        return _hydra_main(cmd, hydra_flags)
    return _direct(cmd)


def _direct(cmd) -> int:
    from .config.compose import compose_values, compose_with_hydra, needs_hydra
    from .config.resolve import resolve
    from .jobs.context import JobContext
    from .jobs.runner import run_job

    _setup_logging()
    try:
        composed = compose_with_hydra(cmd) if needs_hydra(cmd) and not cmd.problems else \
            compose_values(cmd, raise_problems=False)
        record = resolve(composed.values, explicit=composed.explicit, prior=composed.problems)
        from .memory.target import hardware_scope
        with hardware_scope(composed.hardware):
            run_job(composed.job_name, record, composed.job, JobContext(hardware=composed.hardware))
    except ConfigError as err:
        _print_problems(err)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        return _interrupted()
    return 0


def _hydra_main(cmd, hydra_flags: List[str]) -> int:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from .config.compose import Command, conf_dir, hydra_override_list, parse_overrides, values_from_cfg
    from .config.resolve import resolve
    from .config.schema import register_configs
    from .jobs.context import JobContext
    from .jobs.runner import run_job

    register_configs()

    def task(cfg):
        hc = HydraConfig.get()
        task_overrides = list(hc.overrides.task)
        per_job = Command()
        parse_overrides(task_overrides, per_job, allow_sweep=False)
        try:
            composed = values_from_cfg(cfg, cmd)
            explicit = composed.explicit | {s.name for s in per_job.settings}
            record = resolve(composed.values, explicit=frozenset(explicit))
        except ConfigError as err:
            _print_problems(err)
            raise SystemExit(EXIT_CONFIG)
        multirun = str(hc.mode) == "RunMode.MULTIRUN"
        from pathlib import Path
        ctx = JobContext(output_dir=Path(hc.runtime.output_dir), multirun=multirun, overrides=tuple(task_overrides),
                         hardware=composed.hardware)
        from .memory.target import hardware_scope
        with hardware_scope(composed.hardware):
            return run_job(composed.job_name, record, composed.job, ctx)

    app = hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(task)
    saved = sys.argv
    sys.argv = [saved[0] if saved else "sglang-hydra"] + hydra_flags + hydra_override_list(cmd)
    try:
        app()
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    finally:
        sys.argv = saved
    return 0


def entry() -> None:
    try:
        code = main()
    except KeyboardInterrupt:      # outside a job: while importing, composing, or under Hydra
        code = _interrupted()
    sys.exit(code)
