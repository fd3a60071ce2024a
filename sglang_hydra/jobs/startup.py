"""Start Hydra's runtime without work a plain run never uses.

A run that needs Hydra's runtime (any ``hydra.*`` setting, ``-m``) pays, before the job
starts, for two things the command line already rules out:

* **the mode probe**: Hydra composes the whole config once only to read ``hydra.mode``,
  then composes it again for the run.  Nothing in ``conf/`` sets the mode (a test checks),
  so when the command line does not either, the probe's answer is known: none, and ``-m``
  alone decides between a run and a multirun.
* **plugin discovery**: Hydra imports every module of every installed ``hydra_plugins``
  package.  The launchers and sweepers CI installs (Ray, Optuna, submitit, joblib) cost
  about 120 ms of a 0.8 s start; a command that selects none of them needs none of them.

Both shortcuts rely on internals of the pinned hydra-core 1.3.8 and fall back to Hydra's own
behaviour whenever the command might need it, or when those internals are not as expected.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import pkgutil
from collections import defaultdict
from typing import Iterable, Iterator, Optional, Sequence, Set

log = logging.getLogger(__name__)

# Launcher and sweeper plugin packages that are only needed when the command selects them,
# and the option-name fragments that select them (``hydra/launcher=ray_local`` is our own
# preset on top of the Ray launcher).
_ON_DEMAND = {
    "hydra_ray_launcher": ("ray",),
    "hydra_submitit_launcher": ("submitit",),
    "hydra_joblib_launcher": ("joblib",),
    "hydra_optuna_sweeper": ("optuna",),
}
# Options of hydra/launcher and hydra/sweeper whose plugin is known; anything else (an
# option from a user's config directory, say) may pull in any plugin, so all are scanned.
_KNOWN_OPTIONS = {"basic", "ray", "ray_aws", "ray_local", "submitit_local", "submitit_slurm", "joblib", "optuna"}


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def mode_is_unset(hydra_only: Sequence[str]) -> bool:
    """True when nothing this command composes can set ``hydra.mode``: no ``hydra.mode``
    override and no ``hydra.searchpath`` (whose configs could set it); conf/ never does.
    Then Hydra's probe would find no mode, and Hydra picks it from ``-m`` alone."""
    return not any(_key(o).startswith(("hydra.mode", "hydra.searchpath")) for o in hydra_only)


@contextlib.contextmanager
def mode_probe_skipped(skip: bool) -> Iterator[None]:
    """Let Hydra skip the compose that only reads ``hydra.mode`` when we know it is unset.

    Hydra treats a probe that returns None as "no mode configured" and runs a single job
    (``hydra.mode=RUN``) or, with ``-m``, a multirun: exactly what it does when the probe
    finds nothing.  One full composition (a third of a ``hydra.*`` run's start-up) is saved."""
    if not skip:
        yield
        return
    from hydra._internal.hydra import Hydra
    probe = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = probe


def plugin_packages_needed(hydra_only: Sequence[str], hydra_flags: Sequence[str]) -> Optional[Set[str]]:
    """The on-demand plugin packages this command can use (None: it may use any, scan all).

    ``hydra/launcher=joblib`` needs the joblib package, ``hydra/sweeper=optuna`` Optuna's;
    flags that list or explain plugins (``--info``, ``--hydra-help``, completion)
    and a ``hydra.searchpath`` need the full scan."""
    if any(f.split("=")[0] in ("--info", "-i", "--hydra-help", "-sc", "--shell-completion")
           for f in hydra_flags):
        return None
    needed: Set[str] = set()
    for o in hydra_only:
        key = _key(o)
        if key.startswith("hydra.searchpath"):
            return None
        if key in ("hydra/launcher", "hydra/sweeper"):
            option = o.split("=", 1)[1].strip() if "=" in o else ""
            if option not in _KNOWN_OPTIONS:
                return None
            needed |= {pkg for pkg, marks in _ON_DEMAND.items() if any(m in option for m in marks)}
    return needed


def discover_plugins(needed: Optional[Iterable[str]]) -> bool:
    """Create Hydra's plugin registry from every plugin module except the on-demand packages
    not in ``needed``; returns False (and leaves discovery to Hydra) when ``needed`` is None,
    the registry already exists, or Hydra's internals differ from what this code expects."""
    if needed is None:
        return False
    try:
        from hydra.core.plugins import Plugins, _is_concrete_plugin_type
        from hydra.core.singleton import Singleton
        if Plugins in Singleton._instances:
            return False
        skip = set(_ON_DEMAND) - set(needed)
        walk = [importlib.import_module("hydra._internal.core_plugins")]
        inspect_too = []      # hydra_plugins.<x> itself: Hydra's walk inspects it as well
        try:
            namespace = importlib.import_module("hydra_plugins")
        except ImportError:   # no plugin installed at all
            namespace = None
        for info in pkgutil.iter_modules(namespace.__path__ if namespace else [], prefix="hydra_plugins."):
            name = info.name.rsplit(".", 1)[-1]
            if name in skip or (name.startswith("_") and not name.startswith("__")):
                continue
            module = importlib.import_module(info.name)
            inspect_too.append(module)
            if info.ispkg:
                walk.append(module)
        registry = Plugins.__new__(Plugins)
        registry.plugin_type_to_subclass_list = defaultdict(list)
        registry.class_name_to_class = {}
        scanned, registry.stats = Plugins._scan_all_plugins(modules=walk)
        for module in inspect_too:
            scanned += [obj for _, obj in inspect.getmembers(module) if _is_concrete_plugin_type(obj)]
        seen = set()
        for cls in scanned:
            if cls not in seen:
                seen.add(cls)
                registry._register(cls)
        Singleton._instances[Plugins] = registry
        return True
    except Exception as exc:  # Hydra changed: its own discovery still works
        log.debug("plugin discovery shortcut not used: %s", exc)
        return False

