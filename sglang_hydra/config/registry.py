"""Registries the layers above ``config`` fill in at start-up.

The config layer must not import anything above it (jobs, cache, memory, workload,
disagg), yet it validates things those layers define: the settings of each job
(``job.format=json``) and the parameters of each eviction policy
(``memory.radix_eviction_policy_config``).  So those layers register what config needs
to know here, and config only reads these tables.  ``sglang_hydra.plugins`` does the
registration for the built-in jobs and policies when the package is imported; choice
lists (``memory.radix_eviction_policy`` ...) have their own hooks in :mod:`.choices`.

Registration is deferred: importing ``sglang_hydra`` only hands :func:`add_registrar` the
function that does it, and the first *read* of any registry here or in :mod:`.choices` runs it.
So a process that imports one small module of the package (SGLang loading the engine plugin,
``sglang_hydra.cache.sglang_plugin``) does not load the jobs, the cache or anything else.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple


# ---------------------------------------------------------------------------- registrars
_REGISTRARS: List[Callable[[], None]] = []
_registering = False


def add_registrar(fn: Callable[[], None]) -> None:
    """Run ``fn`` (which fills these registries) before the first read of any of them."""
    if fn not in _REGISTRARS:
        _REGISTRARS.append(fn)


def run_registrars() -> None:
    """Run the registrars not run yet (each once; a registrar that reads a registry sees the
    tables as they are so far instead of recursing)."""
    global _registering
    if _registering:
        return
    _registering = True
    try:
        while _REGISTRARS:
            _REGISTRARS[0]()
            _REGISTRARS.pop(0)
    finally:
        _registering = False


# ---------------------------------------------------------------------------- job schemas
@dataclass(frozen=True)
class JobSchema:
    """What composing needs to know about one job: its settings and their allowed values.

    ``config_cls`` is the dataclass stored as ``job/<name>`` in Hydra's ConfigStore; its
    ``name`` field must default to the job's name (that is how a composed config tells which
    job was selected).  ``choices`` maps a setting to the values it accepts."""

    name: str
    config_cls: type
    choices: Mapping[str, Tuple[Any, ...]]


_JOB_SCHEMAS: Dict[str, JobSchema] = {}


def register_job_schema(name: str, config_cls: type, choices: Optional[Mapping[str, Any]] = None,
                        *, replace: bool = False) -> JobSchema:
    """Make ``job=<name>`` selectable with the settings of ``config_cls``.

    Registering the same class again is a no-op; a different class under a taken name is
    an error unless ``replace``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"job names must be non-empty strings, got {name!r}")
    if not (isinstance(config_cls, type) and dataclasses.is_dataclass(config_cls)):
        raise TypeError(f"job {name!r}: the settings class must be a dataclass, got {config_cls!r}")
    settings = {f.name: f for f in dataclasses.fields(config_cls)}
    name_field = settings.get("name")
    if name_field is None or name_field.default != name:
        raise ValueError(f"job {name!r}: {config_cls.__name__} needs a field `name: str = {name!r}`")
    choices = {str(k): tuple(v) for k, v in (choices or {}).items()}
    unknown = sorted(set(choices) - set(settings))
    if unknown:
        raise ValueError(f"job {name!r}: choices given for settings {config_cls.__name__} does not have: {unknown}")
    known = _JOB_SCHEMAS.get(name)
    if known is not None and known.config_cls is not config_cls and not replace:
        raise ValueError(f"job {name!r} is already registered with {known.config_cls.__name__}")
    schema = JobSchema(name, config_cls, MappingProxyType(choices))
    _JOB_SCHEMAS[name] = schema
    return schema


def job_schemas() -> Mapping[str, JobSchema]:
    """Every registered job by name (read-only)."""
    run_registrars()
    return MappingProxyType(_JOB_SCHEMAS)


# ----------------------------------------------------------------- policy parameter checks
#: ``checker(policy, config) -> error texts`` (empty: fine), or None when the checker does
#: not know ``policy`` (another checker may).
PolicyParamChecker = Callable[[str, Any], Optional[List[str]]]

_POLICY_PARAM_CHECKERS: List[PolicyParamChecker] = []


def register_policy_param_checker(checker: PolicyParamChecker) -> None:
    """Add a checker for ``memory.radix_eviction_policy_config`` (idempotent per checker)."""
    if not callable(checker):
        raise TypeError(f"a policy parameter checker must be callable, got {checker!r}")
    if checker not in _POLICY_PARAM_CHECKERS:
        _POLICY_PARAM_CHECKERS.append(checker)


def policy_param_checkers() -> Tuple[PolicyParamChecker, ...]:
    run_registrars()
    return tuple(_POLICY_PARAM_CHECKERS)


__all__ = ["add_registrar", "run_registrars", "JobSchema", "register_job_schema", "job_schemas", "PolicyParamChecker",
           "register_policy_param_checker", "policy_param_checkers"]
