"""The Hydra/OmegaConf view of the namespaces, and its registration in ConfigStore.

OmegaConf 2.3 cannot hold every Python type the record uses (no ``Literal``; an
``Optional[Dict]`` that defaults to None cannot be set from an override), so the schema
is generated from the namespace classes with such fields typed ``Any``.  Their real types,
choices and bounds are enforced by :mod:`coerce` right after composition, which also lets
every bad value of a command be reported together.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Dict, List

from .fields import NAMESPACES
from .record import FIELDS, FieldInfo, fields_of_namespace

SCHEMA_NAME = "_server_args_schema"


def _schema_type(fi: FieldInfo):
    tp = fi.type
    inner = tp
    optional = False
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner, optional = args[0], True
    origin = typing.get_origin(inner)
    if origin in (dict, typing.Dict) or (optional and origin in (list, typing.List)):
        return Any
    return tp


def hydra_fields(namespace: str) -> List[FieldInfo]:
    """Fields settable through Hydra (every field except the record's own bookkeeping)."""
    return [fi for fi in fields_of_namespace(namespace) if not fi.arg.no_cli]


def _schema_class(namespace: str, cls) -> type:
    specs = []
    for fi in hydra_fields(namespace):
        if fi.default_factory is not dataclasses.MISSING:
            d = dataclasses.field(default_factory=fi.default_factory, metadata=dict(help=fi.arg.help))
        else:
            d = dataclasses.field(default=fi.default, metadata=dict(help=fi.arg.help))
        specs.append((fi.name, _schema_type(fi), d))
    return dataclasses.make_dataclass(f"{cls.__name__}Schema", specs, namespace={"__doc__": cls.__doc__})


SCHEMAS: Dict[str, type] = {ns: _schema_class(ns, cls) for ns, cls in NAMESPACES.items()}


def _root_class() -> type:
    specs = [(ns, sc, dataclasses.field(default_factory=sc)) for ns, sc in SCHEMAS.items()]
    specs.append(("job", Any, dataclasses.field(default=None)))
    from .hardware import Hardware  # composed beside the record, typed like it
    specs.append(("hardware", Hardware, dataclasses.field(default_factory=Hardware)))
    return dataclasses.make_dataclass("ServerArgsSchema", specs)


ROOT_SCHEMA = _root_class()

_registered = False


def register_configs() -> None:
    """Store the schema, the job options and the generated help page (idempotent)."""
    global _registered
    if _registered:
        return
    from hydra.core.config_store import ConfigStore

    from ..jobs.specs import JOB_SPECS
    from .help import help_config

    cs = ConfigStore.instance()
    cs.store(name=SCHEMA_NAME, node=ROOT_SCHEMA)
    for name, spec in JOB_SPECS.items():
        cs.store(group="job", name=name, node=spec.config_cls)
    cs.store(group="hydra/help", name="sglang_help", node=help_config())
    from ..jobs.sweeps import register_sweeper_defaults  # optuna: direction from job.objective
    register_sweeper_defaults(cs)
    _registered = True


def all_keys() -> List[str]:
    return [fi.key for fi in FIELDS.values() if not fi.arg.no_cli]
