"""Sweeps and run directories for deployment commands (``deploy=pd``, ``deploy.*`` keys).

A deployment is composed outside ``@hydra.main`` (two records, laid-out ports and GPUs), so
Hydra's runtime never sees it.  What a user expects from that runtime is provided here with
Hydra's own pieces: ``-m`` expands the command like Hydra's basic sweeper (the override
grammar's comma lists, ``range()``, ``choice()`` and ``glob()``, parsed and expanded by
:mod:`hydra.core.override_parser`), each point runs as its own deployment run in
``<hydra.sweep.dir>/<hydra.sweep.subdir>`` with a ``.hydra/overrides.yaml`` like Hydra's,
and ``hydra.run.dir`` places a single run.  The points' outputs are the ones a single run
writes, so the ordinary sweep summary (:mod:`.summary`) and failure report (:mod:`.failures`)
read them unchanged.  Only the basic, sequential launcher is offered: the points run one after
another in this process (a deployment's ports and GPUs are laid out for one at a time).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..config.errors import Problem

MULTIRUN_FLAGS = ("-m", "--multirun")
#: the Hydra settings a deployment run honours
RUNTIME_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir")
#: group choices of Hydra's that are already what a deployment does
_BASIC_CHOICES = {"hydra/launcher": "basic", "hydra/sweeper": "basic"}


@dataclass
class DeployRuntime:
    """A deployment command split into what Hydra's runtime would have read and the rest."""

    multirun: bool = False
    settings: Dict[str, str] = field(default_factory=dict)      # hydra.run.dir ... as written
    argv: List[str] = field(default_factory=list)               # the command without them
    problems: List[Problem] = field(default_factory=list)

    @property
    def wanted(self) -> bool:
        """Whether the command asks for anything of Hydra's runtime."""
        return self.multirun or bool(self.settings)


def _override_positions(argv: Sequence[str]) -> set:
    """Positions of the ``key=value`` overrides (not a legacy flag's value)."""
    from ..config.legacy import split_argv
    return {pos for pos, _text in split_argv(list(argv)).overrides}


def split_runtime(argv: Sequence[str]) -> DeployRuntime:
    """Take ``-m`` and the ``hydra.*`` settings out of a deployment command; anything of Hydra's
    runtime that a deployment cannot honour is a problem (one per token)."""
    out = DeployRuntime()
    free = _override_positions(argv)
    for pos, tok in enumerate(argv):
        if tok in MULTIRUN_FLAGS:
            out.multirun = True
            continue
        key, eq, value = str(tok).partition("=")
        key = key.lstrip("+~")
        if pos not in free or not eq or not key.startswith(("hydra.", "hydra/")):
            out.argv.append(tok)
            continue
        if key in RUNTIME_KEYS:
            out.settings[key] = value
        elif key in _BASIC_CHOICES and value == _BASIC_CHOICES[key]:
            pass
        elif key in _BASIC_CHOICES:
            out.problems.append(Problem(key, None, f"{value!r}: a deployment's sweep points run one after another "
                                        f"in this process (the basic launcher and sweeper, each point with its own "
                                        f"ports and GPUs); drop {key}={value}", f"override {tok}"))
        else:
            out.problems.append(Problem(key, None, f"a deployment honours only {', '.join(RUNTIME_KEYS)} of Hydra's "
                                        f"settings (and -m for a sweep); drop {tok}", f"override {tok}"))
    return out


# --------------------------------------------------------------------------- the points
class _GroupOptions:
    """What ``glob()`` needs of Hydra's config loader: the options of a config group."""

    def get_group_options(self, group: str, results_filter=None, config_name=None, overrides=None) -> List[str]:
        from ..config.presets import group_options
        return group_options(group)


@dataclass
class SweepPoint:
    """One point: its command line and the overrides that define it (for ``overrides.yaml``)."""

    num: int
    argv: List[str]
    overrides: List[str]


def expand_sweep(argv: Sequence[str]) -> Tuple[List[SweepPoint], List[Problem]]:
    """Every point of a ``-m`` command, in the order Hydra's basic sweeper runs them (the
    cartesian product of the swept values, the first swept key varying slowest)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    free = _override_positions(argv)
    choices: List[List[str]] = []
    problems: List[Problem] = []
    for pos, tok in enumerate(argv):
        if pos not in free or "=" not in tok:
            choices.append([tok])
            continue
        try:
            (ov,) = parser.parse_overrides([tok])
        except HydraException as exc:
            problems.append(Problem(tok.split("=")[0], None, f"cannot parse override {tok!r}: "
                                    f"{str(exc).strip().splitlines()[0]}", "override"))
            choices.append([tok])
            continue
        if not ov.is_sweep_override():
            choices.append([tok])
            continue
        if not ov.is_discrete_sweep():
            problems.append(Problem(ov.get_key_element(), None, f"{tok!r}: an interval() sweep needs a sampling "
                                    f"sweeper (Optuna), which deployments do not run; list the values (a,b,c), "
                                    f"range() or choice()", f"override {tok}"))
            choices.append([tok])
            continue
        ov.config_loader = _GroupOptions()
        key = ov.get_key_element()
        try:
            values = list(ov.sweep_string_iterator())
        except HydraException as exc:
            problems.append(Problem(key, None, f"cannot expand {tok!r}: {str(exc).strip().splitlines()[0]}",
                                    f"override {tok}"))
            values = []
        if not values:
            problems.append(Problem(key, None, f"{tok!r} expands to no value", f"override {tok}"))
            values = [tok.split("=", 1)[1]]
        choices.append([f"{key}={v}" for v in values])
    points = []
    for num, combo in enumerate(itertools.product(*choices)):
        point = list(combo)
        overrides = [t for p, t in enumerate(point) if p in free and "=" in t]
        points.append(SweepPoint(num, point, overrides))
    return points, problems


# --------------------------------------------------------------------------- the directories
def _hydra_defaults() -> Dict[str, Any]:
    from ..config.presets import conf_dir, yaml_load
    data = yaml_load(Path(conf_dir()) / "config.yaml") or {}
    return data.get("hydra") or {}


def resolve_dirs(settings: Dict[str, str], points: Sequence[SweepPoint], *, multirun: bool
                 ) -> Tuple[Optional[Path], List[Path], List[Problem]]:
    """(the sweep dir, one directory per point, problems): ``hydra.sweep.dir`` and
    ``hydra.sweep.subdir`` (or ``hydra.run.dir`` for a single run) with their interpolations
    (``${now:...}``, ``${hydra.job.num}``, ``${hydra.job.override_dirname}``) resolved as
    Hydra does; ``${now:...}`` is read once, so every point shares the sweep directory.  A
    single run without ``hydra.run.dir`` gets no directory here (the job makes its own)."""
    from hydra.core.utils import setup_globals
    from omegaconf import OmegaConf

    setup_globals()        # Hydra's ${now:...} resolver
    defaults = _hydra_defaults()
    if not multirun and "hydra.run.dir" not in settings:
        return None, [], []
    sweep = defaults.get("sweep") or {}
    base = {"hydra": {"run": {"dir": settings.get("hydra.run.dir", "")},
                      "sweep": {"dir": settings.get("hydra.sweep.dir", sweep.get("dir", "multirun")),
                                "subdir": settings.get("hydra.sweep.subdir", sweep.get("subdir", "${hydra.job.num}"))},
                      "job": {"name": (defaults.get("job") or {}).get("name", "sglang_hydra"), "num": 0, "id": 0,
                              "override_dirname": ""}}}
    cfg = OmegaConf.create(base)
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    try:
        root = str(OmegaConf.select(cfg, key, throw_on_missing=True))
    except Exception as exc:  # noqa: BLE001 - an interpolation that does not resolve
        return None, [], [_unresolved(key, settings, exc)]
    dirs = []
    for p in points if multirun else []:
        cfg.hydra.job.num = p.num
        cfg.hydra.job.id = p.num
        cfg.hydra.job.override_dirname = ",".join(sorted(p.overrides))
        try:
            dirs.append(Path(root) / str(cfg.hydra.sweep.subdir))
        except Exception as exc:  # noqa: BLE001
            return None, [], [_unresolved("hydra.sweep.subdir", settings, exc)]
    if not multirun:
        return Path(root), [Path(root)], []
    if len(set(dirs)) < len(dirs):
        return None, [], [Problem("hydra.sweep.subdir", None, f"{cfg.hydra.sweep.subdir!r} gives several points the "
                                  f"same directory; include ${{hydra.job.num}}", "override")]
    return Path(root), dirs, []


def _unresolved(key: str, settings: Dict[str, str], exc: Exception) -> Problem:
    return Problem(key, None, f"cannot resolve {settings.get(key, '(the default)')!r}: {' '.join(str(exc).split())}",
                   "override")


def write_inputs(job_dir: Path, overrides: Sequence[str], config: Dict[str, Any]) -> None:
    """``.hydra/config.yaml`` and ``.hydra/overrides.yaml``, as Hydra saves them for each job
    (the sweep summary reads the point's settings and objective from them)."""
    import yaml

    from .context import atomic_write
    hydra_dir = Path(job_dir) / ".hydra"
    atomic_write(hydra_dir / "config.yaml", yaml.safe_dump(config, sort_keys=False, default_flow_style=False))
    atomic_write(hydra_dir / "overrides.yaml", yaml.safe_dump(list(overrides), default_flow_style=False))


def point_config(settings: Any, job: Dict[str, Any]) -> Dict[str, Any]:
    """What a deployment point's ``.hydra/config.yaml`` holds: its deploy keys and its job."""
    from dataclasses import asdict, is_dataclass

    from .context import _plain
    deploy = asdict(settings) if is_dataclass(settings) else {}
    return {"deploy": _plain(deploy), "job": _plain(dict(job or {}))}


# --------------------------------------------------------------------------- before any point runs
def never_working(points: Sequence[SweepPoint], failed: Dict[int, List[Problem]]) -> List[Problem]:
    """The problems of swept values that fail in every point that has them, on the swept key
    itself (``deploy.prefill_workers=0``): a sweep is refused for them before anything runs.
    A value that fails only with some other value (a GPU budget) fails just those points."""
    swept: Dict[str, Dict[str, List[int]]] = {}
    for p in points:
        for ov in p.overrides:
            k, _, v = ov.partition("=")
            swept.setdefault(k.lstrip("+~"), {}).setdefault(v, []).append(p.num)
    swept = {k: vals for k, vals in swept.items() if len(vals) > 1}
    out: List[Problem] = []
    seen = set()
    for key, vals in swept.items():
        for _value, nums in vals.items():
            if not all(n in failed for n in nums):
                continue
            common = [pr for pr in failed[nums[0]] if _names(pr, key)
                      and all(any((q.key, q.message) == (pr.key, pr.message) for q in failed[n]) for n in nums)]
            for pr in common:
                if (pr.key, pr.message) not in seen:
                    seen.add((pr.key, pr.message))
                    out.append(pr)
    return out


def _names(problem: Problem, key: str) -> bool:
    """Whether a problem is about the swept key (a side key ``prefill.x`` is reported as such)."""
    k = problem.key.lstrip("+~")
    return k == key or k.endswith("." + key) or key.endswith("." + k)


def command_overrides(argv: Sequence[str]) -> List[str]:
    """The ``key=value`` overrides of a command, as Hydra lists a run's task overrides."""
    free = _override_positions(argv)
    return [t for p, t in enumerate(argv) if p in free and "=" in t]


def file_overrides(request) -> List[str]:
    """A deployment command's ``--config`` file settings as overrides, as the ordinary (Hydra) path
    records a file's settings among a run's task overrides: the file's ``deploy`` option and keys,
    its shared settings (group choices, record fields by their ``namespace.field`` keys, ``job.*``,
    ``hardware.*``), then each side's (``prefill.``/``decode.``).  Empty without a file; a file
    that cannot be read gives nothing here (composing the run reports it)."""
    from ..config.compose import Command, hydra_override_list, load_config_file, render_override, settings_from_mapping
    from ..config.deploy.model import SIDES

    path = getattr(request, "config_file", None)
    if not path:
        return []
    src = f"--config {path}"

    def rendered(data, source) -> List[str]:
        cmd = Command()
        settings_from_mapping(data, source, cmd, choices_ok=True)
        return [] if cmd.problems else hydra_override_list(cmd, include_hydra=False)

    if not request.file_sections_read:
        cmd = Command()
        load_config_file(path, cmd)
        return [] if cmd.problems else hydra_override_list(cmd, include_hydra=False)
    out = [f"deploy={request.file_option}"] if request.file_option else []
    out += [render_override(f"deploy.{k}", v) for k, v, source in request.deploy_settings if source == src]
    out += rendered(request.file_shared, src)
    for role in SIDES:
        if role in request.file_sides:
            out += [f"{role}.{o}" for o in rendered(request.file_sides[role], f"{src} ({role}:)")]
    return out


def with_file_overrides(file_ovs: Sequence[str], overrides: Sequence[str]) -> List[str]:
    """The file's overrides, then the command line's; a key the command line sets again is the
    command line's alone (it wins over the file, as it does when composing)."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    return [o for o in file_ovs if o.split("=", 1)[0].lstrip("+~") not in given] + list(overrides)
