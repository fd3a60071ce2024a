"""The ``sglang-hydra`` command.

The legacy flags are translated before Hydra sees the command line (Hydra's own parser
would swallow or misread them).  A plain single run is composed directly and runs at
once; anything that needs Hydra's runtime (``-m`` sweeps, ``--cfg``, ``--info``,
``--help``, shell completion, ``hydra.*`` settings) goes through ``@hydra.main`` with the
legacy flags rendered as overrides in their original position.  A deployment (``deploy=pd``,
``deploy.*`` keys) is composed outside ``@hydra.main``; its ``-m`` sweeps and ``hydra.run.dir``
are run here with Hydra's override grammar (:mod:`.jobs.deploy_sweep`).

Exit status, on every path (direct, ``@hydra.main``, each sweep launcher):

* 0: the job (every job of a sweep) finished;
* 2: a configuration or input problem, printed one line per problem, no traceback;
* 1: anything else went wrong, printed as one line (``SGLANG_HYDRA_TRACEBACK=1`` adds
  the traceback);
* 130: interrupted.

A failing sweep point does not stop the sweep: it writes ``error.json`` into its job
directory and the command exits non-zero after the other points ran.
"""
from __future__ import annotations

import logging
import os
import re
import sys
from typing import Callable, List, Optional, Sequence, Tuple

from .config.errors import ConfigError, Problem

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130   # 128 + SIGINT, what shells report for Ctrl-C
TRACEBACK_ENV = "SGLANG_HYDRA_TRACEBACK"


def _interrupted() -> int:
    """Ctrl-C ends a run with a one-line message instead of a traceback; jobs clean up on the
    way out (e.g. the file storage removes its unfinished temp files)."""
    print("sglang-hydra: interrupted (SIGINT); stopped before the job finished", file=sys.stderr)
    return EXIT_INTERRUPTED


def _print_problems(err: ConfigError, prefix: str = "") -> None:
    print(f"sglang-hydra: {prefix}{err.render()}", file=sys.stderr)


def _want_traceback() -> bool:
    from .utils.envflags import EnvValueError, env_flag
    try:
        return env_flag(TRACEBACK_ENV)
    except EnvValueError:
        return True   # a value we cannot read still means the user asked for something


def _print_failure(exc: BaseException, prefix: str = "") -> None:
    """An unexpected error as one line; the traceback only when asked for."""
    if _want_traceback():
        import traceback
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    text = " ".join(str(exc).split()) or "(no message)"
    print(f"sglang-hydra: {prefix}error: {type(exc).__name__}: {text} "
          f"(set {TRACEBACK_ENV}=1 to see the traceback)", file=sys.stderr)


def _input_error(exc: BaseException) -> Optional[ConfigError]:
    """Errors about what the user supplied that are raised outside the config layer (an
    environment variable with a value its reader cannot use) count as configuration problems."""
    from .utils.envflags import EnvValueError
    if isinstance(exc, EnvValueError):
        return ConfigError([Problem(exc.name, None, str(exc), "environment")])
    return None


def _setup_logging() -> None:
    logging.basicConfig(level=logging.WARNING, format="[%(levelname)s] %(name)s: %(message)s", stream=sys.stderr)


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("sglang-hydra")
    except Exception:  # not installed as a distribution (e.g. run from a source tree)
        return "unknown (not installed as a distribution)"


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        from .config.showcase import SHOWCASE, showcase_note
        print(showcase_note(), file=sys.stderr)
        argv = list(SHOWCASE)
    if "--version" in argv:
        import hydra
        import omegaconf
        print(f"sglang-hydra {_version()} (Hydra {hydra.__version__}, OmegaConf {omegaconf.__version__})")
        return EXIT_OK
    if "--help" in argv or "-h" in argv:      # our page, whatever else is on the line
        from .config.help import help_page
        print(help_page(), end="")
        return EXIT_OK
    from .config.compose import build_command, check_choices
    from .config.deploy import deployment_request

    deployment = deployment_request(argv)      # deploy=..., prefill.*/decode.* or such --config sections
    if deployment is not None:
        if not deployment.is_plain_single():
            return _deployment(argv)
        argv = deployment.shared_argv          # a bare deploy=single is the ordinary single run

    try:
        cmd, hydra_flags = build_command(argv=argv, allow_sweep=True)
    except ConfigError as err:  # pragma: no cover - build_command collects instead of raising
        _print_problems(err)
        return EXIT_CONFIG
    if hydra_flags or cmd.sweep or cmd.hydra_only:
        cmd.problems += check_choices(cmd)
        if not cmd.problems and ("-m" in hydra_flags or "--multirun" in hydra_flags):
            from .jobs.sweeps import objective_problems
            cmd.problems += objective_problems(cmd)     # before any point runs
        if cmd.problems:
            _print_problems(ConfigError(cmd.problems))
            return EXIT_CONFIG
        return _hydra_main(cmd, hydra_flags, argv)
    return _direct(cmd, argv)


def _direct(cmd, argv: Sequence[str]) -> int:
    from .config.compose import hydra_override_list, resolve_command
    from .jobs.context import JobContext, composed_config
    from .jobs.runner import run_job

    def run() -> int:
        record, composed = resolve_command(cmd)
        ctx = JobContext(overrides=tuple(hydra_override_list(cmd)),
                         config=composed_config(composed.values, composed.job), hardware=composed.hardware)
        from .memory.target import hardware_scope
        with hardware_scope(composed.hardware):
            return _job_status(run_job(composed.job_name, record, composed.job, ctx))

    return _run_reported(run)


def _job_status(result) -> int:
    """A job may return its exit status (job=launch returns its failed server's); others return data."""
    return result if type(result) is int else EXIT_OK


def _deployment(argv: Sequence[str]) -> int:
    """A deploy=pd command (or deploy.* keys, or a --config file with deployment sections): both
    sides, then the job; ``-m`` runs a sweep of deployments and ``hydra.run.dir`` places the run."""
    from .config.deploy import deployment_request
    from .jobs.context import JobContext
    from .jobs.deploy_sweep import (command_overrides, file_overrides, point_config, resolve_dirs, split_runtime,
                                    with_file_overrides, write_inputs)
    from .jobs.runner import run_job

    runtime = split_runtime(argv)
    if runtime.problems:
        _print_problems(ConfigError(runtime.problems))
        return EXIT_CONFIG
    if runtime.multirun:
        return _deployment_sweep(runtime)
    request = deployment_request(runtime.argv)

    def run() -> int:
        target, job_name, job, settings, hardware = _compose_deployment_run(request)
        out_dir, _dirs, problems = resolve_dirs(runtime.settings, [], multirun=False)
        if problems:
            raise ConfigError(problems)
        overrides = with_file_overrides(file_overrides(request), command_overrides(runtime.argv))
        if out_dir is not None:        # hydra.run.dir: the job's directory, with its inputs as Hydra saves them
            write_inputs(out_dir, overrides, point_config(settings, job))
        ctx = JobContext(output_dir=out_dir, overrides=tuple(overrides), hardware=hardware, deploy=settings)
        return _job_status(run_job(job_name, target, job, ctx))

    return _run_reported(run)


def _compose_deployment_run(request):
    """(target, job name, job settings, deploy settings, target hardware) of one deployment command."""
    from .config.deploy import _deploy_settings, compose_deployment

    target, job_name, job = compose_deployment(request)
    # the deploy.* keys and the target hardware, for jobs that simulate the deployment (replay)
    settings, _explicit = _deploy_settings(request, [])
    return target, job_name, job, settings, _deployment_hardware(request)


def _deployment_sweep(runtime) -> int:
    """``-m`` over a deployment: every point composed first (a swept value that fails wherever it
    appears stops the command before anything runs), then each run in its own directory, one
    after another; a failed point leaves error.json and the others go on; the summary at the end."""
    import logging

    from .config.deploy import _Once, deployment_request
    from .jobs import failures
    from .jobs.deploy_sweep import expand_sweep, never_working, resolve_dirs

    points, problems = expand_sweep(runtime.argv)
    if not problems:
        sweep_dir, dirs, problems = resolve_dirs(runtime.settings, points, multirun=True)
    if not problems:
        found = failures.earlier_sweep_in(sweep_dir)
        if found:
            problems.append(Problem("hydra.sweep.dir", None, f"{sweep_dir} already holds a sweep ({found}); sweeps are "
                                    f"not merged into one directory: pick another with hydra.sweep.dir=<new "
                                    f"directory>, or remove {sweep_dir} first", "override"))
    if problems:
        _print_problems(ConfigError(problems))
        return EXIT_CONFIG
    _setup_logging()
    composed, failed = {}, {}
    once = _Once()          # every point composes the same shared settings: their notes once
    logging.getLogger("sglang_hydra.config").addFilter(once)
    try:
        for p in points:
            try:
                composed[p.num] = _compose_deployment_run(deployment_request(p.argv))
            except ConfigError as err:
                failed[p.num] = list(err.problems)
    except KeyboardInterrupt:
        return _interrupted()
    finally:
        logging.getLogger("sglang_hydra.config").removeFilter(once)
    jobs = {c[1] for c in composed.values()} | {o.split("=", 1)[1] for p in points for o in p.overrides
                                                 if o.split("=", 1)[0].lstrip("+~") == "job"}
    if "launch" in jobs:
        _print_problems(ConfigError([Problem("job", None, "job=launch starts one deployment and serves it until "
                                             "stopped, so it does not sweep (-m would start several at once): "
                                             "sweep with job=replay (simulated) or job=resolve, then launch the "
                                             "point you choose without -m", "job")]))
        return EXIT_CONFIG
    fatal = never_working(points, failed)
    if fatal:
        _print_problems(ConfigError(fatal), "a swept value fails in every point that has it, so nothing ran: ")
        return EXIT_CONFIG
    failures.SWEEP_RUNS.clear()
    failures.SWEEPS_STARTED.clear()
    failures.SWEEPS_STARTED.append(sweep_dir)
    from .jobs.deploy_sweep import file_overrides
    from_file = file_overrides(deployment_request(points[0].argv)) if points else []
    import signal
    previous_term = _terminate_as_interrupt()
    try:
        for p, job_dir in zip(points, dirs):
            _deployment_point(p, job_dir, composed.get(p.num), failed.get(p.num), from_file)
    except KeyboardInterrupt as exc:
        return _interrupted_sweeps(exc)
    finally:
        signal.signal(signal.SIGTERM, previous_term)
    failures.SWEEP_RUNS.append(sweep_dir)
    _summarise(sweep_dir, report=True)
    return _report_sweeps()


def _summarise(sweep_dir, report: bool) -> None:
    from .jobs.summary import write_summary
    try:
        write_summary(sweep_dir, plots=report, report=report)
    except Exception as err:  # noqa: BLE001 - a broken plot must not hide the sweep's results
        if report:
            print(f"sglang-hydra: could not write the sweep summary in {sweep_dir}: {err}", file=sys.stderr)


def _deployment_point(point, job_dir, composed, problems, from_file=()) -> None:
    """One point of a deployment sweep in ``job_dir``: its inputs in .hydra/, then what the job
    writes (or error.json), then the tables so far (a sweep that dies still leaves them).
    ``from_file``: the --config file's settings as overrides, recorded before the point's own
    (as Hydra records a file's settings), so each point's record says what it ran with."""
    from .jobs import failures
    from .jobs.context import JobContext
    from .jobs.deploy_sweep import point_config, with_file_overrides, write_inputs
    from .jobs.runner import run_job

    print(f"#{point.num} : {' '.join(point.overrides)}", flush=True)
    failures.clear_error(job_dir)
    label = f"job {point.num} ({' '.join(point.overrides)}): "
    overrides = with_file_overrides(from_file, point.overrides)
    if composed is None:
        write_inputs(job_dir, overrides, {"job": {}})
        code, message = _report_error(ConfigError(problems), label)
    else:
        target, job_name, job, settings, hardware = composed
        write_inputs(job_dir, overrides, point_config(settings, job))
        ctx = JobContext(output_dir=job_dir, multirun=True, overrides=tuple(overrides), hardware=hardware,
                         deploy=settings)
        code, message = _sweep_job(lambda: run_job(job_name, target, job, ctx), label)
    if code != EXIT_OK:
        failures.write_error(job_dir, overrides, message, code)
    _summarise(job_dir.parent, report=False)


def _sweep_job(call: Callable[[], object], label: str) -> Tuple[int, str]:
    """Run one job (a sweep point, or the run under Hydra): (its exit status, a one-line message when it
    failed), the failure reported on stderr in the command's own format."""
    try:
        code = _job_status(call())
        if code == EXIT_OK:
            return EXIT_OK, ""
    except KeyboardInterrupt:
        raise
    except SystemExit as exc:
        code = _exit_code(exc)
        if code == EXIT_OK:
            return EXIT_OK, ""
    except Exception as exc:
        return _report_error(exc, label)
    message = f"the job exited with status {code}"
    print(f"sglang-hydra: {label}{message}", file=sys.stderr)
    return code, message


def _deployment_hardware(request):
    """``hardware=<preset>`` and ``hardware.<field>=<value>`` of a deployment command's shared part
    (None when it names none: the job then sees no target, as on this machine)."""
    from .config.errors import ConfigError
    from .config.hardware import compose_hardware

    option, settings = None, []
    from_file = request.file_shared.get("hardware")       # a --config file's choice; the command line wins
    if isinstance(from_file, str):
        option = from_file
    for tok in request.shared_argv:
        key, eq, value = str(tok).partition("=")
        if not eq:
            continue
        if key == "hardware":
            option = value
        elif key.startswith("hardware."):
            settings.append((key.split(".", 1)[1], value, "command line"))
    if option is None and not settings:
        return None
    hardware, problems = compose_hardware(option, settings)
    if problems:
        raise ConfigError(problems)
    return hardware


def _run_reported(run: Callable[[], int]) -> int:
    """Run one composed job and turn every way it can end into an exit status, reported in
    one line (or one line per configuration problem), never a traceback unless asked for."""
    _setup_logging()
    try:
        return run()
    except KeyboardInterrupt:
        return _interrupted()
    except SystemExit as exc:   # a job that reports its own failure (e.g. verify found bad pages)
        return _exit_code(exc)
    except Exception as exc:
        code, _message = _report_error(exc)
        return code


def _report_error(exc: Exception, label: str = "") -> Tuple[int, str]:
    """Print an error that ended a job and return its exit status and a one-line message.

    A :class:`ConfigError`, or an input error raised outside the config layer, is a
    configuration problem (exit 2); anything else is a failure (exit 1)."""
    err = exc if isinstance(exc, ConfigError) else _input_error(exc)
    if err is not None:
        _print_problems(err, label)
        return EXIT_CONFIG, err.render()
    _print_failure(exc, label)
    return EXIT_FAILED, f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return EXIT_OK
    return exc.code if isinstance(exc.code, int) else EXIT_FAILED


def _hydra_main(cmd, hydra_flags: List[str], argv: Sequence[str]) -> int:
    import hydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from .config.compose import Command, hydra_override_list, hydra_problem, parse_overrides, values_from_cfg
    from .config.presets import conf_dir
    from .config.resolve import resolve
    from .config.schema import register_configs
    from .jobs import failures, runner, startup
    from .jobs.context import JobContext

    if _shows_config(hydra_flags):
        register_configs()
    else:
        register_configs(_fields_named(cmd), jobs=_jobs_named(cmd))
    if any("sweeper=optuna" in o for o in cmd.hydra_only):
        from .jobs.sweeps import register_sweeper_defaults   # the study's direction follows job.objective
        register_sweeper_defaults()
    single_run: dict = {}

    def task(cfg):
        from pathlib import Path
        hc = HydraConfig.get()
        task_overrides = list(hc.overrides.task)
        multirun = str(hc.mode) == "RunMode.MULTIRUN"
        out_dir = Path(hc.runtime.output_dir)
        failures.clear_error(out_dir)
        label = f"job {hc.job.num} ({' '.join(task_overrides)}): " if multirun else ""
        outcome: dict = {}

        def call():
            per_job = Command()
            parse_overrides(task_overrides, per_job, allow_sweep=False)
            composed = values_from_cfg(cfg, cmd)
            explicit = composed.explicit | {s.name for s in per_job.settings}
            record = resolve(composed.values, explicit=frozenset(explicit))
            ctx = JobContext(output_dir=out_dir, multirun=multirun, overrides=tuple(task_overrides),
                             hardware=composed.hardware)
            from .memory.target import hardware_scope
            with hardware_scope(composed.hardware):
                outcome["result"] = runner.run_job(composed.job_name, record, composed.job, ctx)
            return outcome["result"]

        code, message = _sweep_job(call, label)
        if code == EXIT_OK:
            return outcome.get("result")
        failures.write_error(out_dir, task_overrides, message, code)
        if not multirun:
            single_run["code"] = code
        return failures.failed_return_value(cfg)

    app = hydra.main(config_path=str(conf_dir()), config_name="config", version_base="1.3")(task)
    saved_argv = sys.argv
    saved_full_error = os.environ.get("HYDRA_FULL_ERROR")
    # Hydra's own reporter prints a stack excerpt and exits 1; with HYDRA_FULL_ERROR set it
    # re-raises instead, and the errors are reported here in the command's own format.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    sys.argv = [saved_argv[0] if saved_argv else "sglang-hydra"] + hydra_flags + hydra_override_list(cmd)
    failures.SWEEP_RUNS.clear()
    failures.SWEEPS_STARTED.clear()
    previous_term = _terminate_as_interrupt() if "-m" in hydra_flags or "--multirun" in hydra_flags else None
    try:
        startup.discover_plugins(startup.plugin_packages_needed(cmd.hydra_only, hydra_flags))
        with startup.mode_probe_skipped(startup.mode_is_unset(cmd.hydra_only)):
            app()
    except failures.SweepDirTaken as exc:
        _print_problems(exc.error)
        return EXIT_CONFIG
    except SystemExit as exc:
        return _exit_code(exc)
    except KeyboardInterrupt as exc:
        return _interrupted_sweeps(exc)
    except (HydraException, OmegaConfBaseException) as exc:
        _print_problems(ConfigError([hydra_problem(exc)]))
        return EXIT_CONFIG
    except Exception as exc:
        _summarise_unfinished_sweeps()    # e.g. the Optuna sweeper failing when no trial completed
        _print_failure(exc)
        return EXIT_FAILED
    finally:
        if previous_term is not None:
            import signal
            signal.signal(signal.SIGTERM, previous_term)
        sys.argv = saved_argv
        if saved_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_full_error
    if "code" in single_run:
        return single_run["code"]
    return _report_sweeps()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the sweep is, so it ends the way Ctrl-C does."""


EXIT_TERMINATED = 143    # 128 + SIGTERM


def _terminate_as_interrupt():
    """Make SIGTERM end a sweep like Ctrl-C (its finished points are then summarised);
    returns the handler it replaced."""
    import signal

    def handler(signum, frame):
        raise Terminated()
    return signal.signal(signal.SIGTERM, handler)


def _interrupted_sweeps(exc: KeyboardInterrupt) -> int:
    """An interrupted sweep still leaves its summary, best config and plots of the points
    that finished (further signals are ignored while they are written)."""
    import signal
    from .jobs import failures

    name, code = ("SIGTERM", EXIT_TERMINATED) if isinstance(exc, Terminated) else ("SIGINT", EXIT_INTERRUPTED)
    unfinished = [d for d in failures.SWEEPS_STARTED if d not in failures.SWEEP_RUNS]
    if not unfinished:
        print(f"sglang-hydra: interrupted ({name}); stopped before the job finished", file=sys.stderr)
        return code
    saved = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"sglang-hydra: interrupted ({name}); summarising the points that finished in "
              f"{', '.join(map(str, unfinished))}", file=sys.stderr)
        _summarise_unfinished_sweeps(interrupted=True)
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    return code


def _summarise_unfinished_sweeps(interrupted: bool = False) -> None:
    """The summary of every sweep this command started that did not reach its end."""
    from .jobs import failures
    from .jobs.summary import write_summary

    for sweep_dir in [d for d in failures.SWEEPS_STARTED if d not in failures.SWEEP_RUNS]:
        try:
            write_summary(sweep_dir, report=True, interrupted=interrupted)
        except Exception as err:  # noqa: BLE001 - still report what ended the sweep
            print(f"sglang-hydra: could not write the sweep summary in {sweep_dir}: {err}", file=sys.stderr)


def _report_sweeps() -> int:
    """After a sweep: name every failed point (read back from its error.json) and pick the exit code."""
    from .jobs import failures

    codes = set()
    for sweep_dir in failures.SWEEP_RUNS:
        failed = failures.collect_errors(sweep_dir)
        if not failed:
            continue
        total = failures.count_jobs(sweep_dir)
        print(f"sglang-hydra: {len(failed)} of {total} sweep jobs failed (sweep dir {sweep_dir}):", file=sys.stderr)
        for f in failed:
            lines = [ln.strip() for ln in (f.get("error") or "").strip().splitlines()]
            problems = [ln[2:] for ln in lines if ln.startswith("- ")]   # a ConfigError's problem lines
            detail = "; ".join(problems or lines)
            print(f"  - job {f['job']} [{' '.join(f.get('overrides') or []) or 'no overrides'}]: "
                  f"exit {f.get('exit_code')}: {detail} ({f['path']})", file=sys.stderr)
        codes |= {f.get("exit_code") for f in failed}
    if not codes:
        return EXIT_OK
    return EXIT_CONFIG if codes == {EXIT_CONFIG} else EXIT_FAILED


# Hydra flags that print the config or complete its keys need the schema with every field.
_SHOWING_FLAGS = {"--cfg", "-c", "--help", "-h", "--hydra-help", "-sc", "--shell-completion", "--info", "-i",
                  "--resolve", "-p", "--package"}


def _shows_config(hydra_flags) -> bool:
    return any(f.split("=")[0] in _SHOWING_FLAGS for f in hydra_flags)


def _fields_named(cmd) -> set:
    """Record fields the command sets (typed settings and the keys of Hydra-only overrides)."""
    from .config.record import FIELDS
    keys = {fi.key: n for n, fi in FIELDS.items()}
    names = {s.name for s in cmd.settings}
    for text in cmd.hydra_overrides:
        key = text.split("=", 1)[0].lstrip("+~").split("@", 1)[0]
        if key in keys:
            names.add(keys[key])
        for ref in re.findall(r"\$\{([\w.]+)\}", text):  # keys an interpolation reads
            if ref in keys:
                names.add(keys[ref])
    return names


def _jobs_named(cmd):
    """The jobs this command can run (None: a sweep over ``job``, so all of them)."""
    from .config.presets import default_choices
    if any(o.split("=", 1)[0].lstrip("+~") == "job" for o in cmd.hydra_overrides):
        return None
    return {cmd.choices.get("job") or dict(default_choices())["job"]}


def entry() -> None:
    try:
        code = main()
    except KeyboardInterrupt:      # outside a job: while importing, composing, or under Hydra
        code = _interrupted()
    except ConfigError as err:
        _print_problems(err)
        code = EXIT_CONFIG
    except Exception as exc:       # a bug outside any job: still one line unless asked
        _print_failure(exc)
        code = EXIT_FAILED
    sys.exit(code)
