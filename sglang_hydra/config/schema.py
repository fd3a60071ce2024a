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


def _schema_class(namespace: str, cls, only=None) -> type:
    from .fastclass import fast_dataclass
    specs = []
    for fi in hydra_fields(namespace):
        if only is not None and fi.name not in only:
            continue
        if fi.default_factory is not dataclasses.MISSING:
            d = dataclasses.field(default_factory=fi.default_factory, metadata=dict(help=fi.arg.help))
        else:
            d = dataclasses.field(default=fi.default, metadata=dict(help=fi.arg.help))
        specs.append((fi.name, _schema_type(fi), d))
    return fast_dataclass(f"{cls.__name__}Schema", specs, namespace={"__doc__": cls.__doc__})


def _root_class(only=None) -> type:
    schemas = {ns: _schema_class(ns, cls, only) for ns, cls in NAMESPACES.items()}
    specs = [(ns, sc, dataclasses.field(default_factory=sc)) for ns, sc in schemas.items()]
    specs.append(("job", Any, dataclasses.field(default=None)))
    from .hardware import Hardware  # composed beside the record, typed like it
    specs.append(("hardware", Hardware, dataclasses.field(default_factory=Hardware)))
    return dataclasses.make_dataclass("ServerArgsSchema", specs)


_registered = False


def core_field_names() -> set:
    """Fields a slim schema always holds: every field some preset in conf/ sets (the command's
    own fields are added by the caller)."""
    from .presets import GROUPS, group_options, preset
    names = set()
    keys = {fi.key: n for n, fi in FIELDS.items()}
    for group in GROUPS:
        if group == "job":
            continue
        for option in group_options(group):
            data, _ = preset(group, option)
            for ns, settings in (data.items() if isinstance(data, dict) else ()):
                for k in (settings if isinstance(settings, dict) else ()):
                    if f"{ns}.{k}" in keys:
                        names.add(keys[f"{ns}.{k}"])
    return names


def register_configs(only=None, jobs=None) -> None:
    """Store the schema, the job options and the generated help page (idempotent).

    ``only`` (field names) registers a slim schema: those fields plus :func:`core_field_names`;
    ``jobs`` (job names) stores only those jobs' option schemas.  The CLI uses both for runs
    that do not show the config (a ``hydra.*`` setting, a sweep): OmegaConf's cost grows with
    every node stored, merged and copied, and the record gets the defaults of the fields left
    out anyway.  ``--cfg``, ``--help`` and completion use all fields and every job."""
    global _registered
    if _registered:
        return
    ROOT_SCHEMA = _root_class(None if only is None else set(only) | core_field_names())
    from hydra.core.config_store import ConfigStore

    from .help import help_config
    from .registry import job_schemas

    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=ROOT_SCHEMA)
    for name, job in job_schemas().items():
        if jobs is None or name in jobs:
            store.store(group="job", name=name, node=job.config_cls)
    store.store(group="hydra/help", name="sglang_help", node=help_config())
    _registered = True


def all_keys() -> List[str]:
    return [fi.key for fi in FIELDS.values() if not fi.arg.no_cli]
