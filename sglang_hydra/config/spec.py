"""How a record field is declared.

Every field of every namespace is a ``dataclasses.field`` whose metadata holds one
:class:`Arg`.  The Hydra schema, the legacy argparse surface, ``--help`` and the
validation layer are all generated from it, so a field's flag, aliases, choices and
default are written down exactly once.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple, Union

# A choices entry is either a fixed tuple of strings or the name of a mutable registry
# list in ``choices.py`` (so plugins can extend it after the field was declared).
Choices = Union[Tuple[str, ...], str, None]


@dataclass(frozen=True)
class FlagSpec:
    """One argparse action of the reference engine's parser, as facts.

    ``action`` is ``store``, ``store_true``, ``boolean_optional`` (``--x``/``--no-x``),
    ``lora_paths``, ``deprecated_store_true`` or ``deprecated_store_const``; ``parser`` names
    the value parser (``int``, ``float``, ``str``, ``json``, ``json_list``,
    ``human_readable_int``, ``nullable_str``, ``cuda_graph_backend``, ``cuda_graph_config``).
    """

    flags: Tuple[str, ...]
    action: str = "store"
    parser: Optional[str] = None
    choices: Optional[Tuple[Any, ...]] = None
    nargs: Any = None
    const: Any = None
    required: bool = False


@dataclass(frozen=True)
class Arg:
    """Metadata attached to one record field."""

    help: str = ""
    # Replaces the derived primary flag ``--field-name``.
    cli_name: Optional[str] = None
    aliases: Tuple[str, ...] = ()
    choices: Choices = None
    # ``"json"`` (json.loads), ``"json_list"`` (JSON list in one token) or None.
    parser: Optional[str] = None
    nargs: Optional[str] = None
    # The field may be rewritten by resolution rules of other namespaces (reference flag).
    resolvable: bool = False
    # No legacy flag and no Hydra key: the record fills it in itself.
    no_cli: bool = False
    # Shape-only fields (model KV geometry) have no flag in the reference engine.
    hydra_only: bool = False
    # Inclusive numeric bounds checked at composition time (None: unbounded).
    ge: Optional[float] = None
    le: Optional[float] = None
    gt: Optional[float] = None
    # The reference engine's argparse actions for this field, from the schema snapshot.
    # Empty for hand-written fields: their single action is derived from the options above.
    actions: Tuple[FlagSpec, ...] = ()
    # A key in its config group but no legacy flag (the reference has none either).
    no_flag: bool = False
    # The reference's own namespace path when it is finer than ours (``exec.moe``).
    ref_namespace: Optional[str] = None
    # The reference requires a value (it has no default).
    required: bool = False


def arg(default: Any = dataclasses.MISSING, help: str = "", *, factory: Optional[Callable[[], Any]] = None, **meta: Any):
    """Declare a field: ``name: T = arg(default, "why it exists", cli_name=..., choices=...)``."""
    if isinstance(meta.get("aliases"), list):
        meta["aliases"] = tuple(meta["aliases"])
    if isinstance(meta.get("choices"), list):
        meta["choices"] = tuple(meta["choices"])
    md = {"arg": Arg(help=help, **meta)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=md)
    return dataclasses.field(default=default, metadata=md)


def arg_of(f: dataclasses.Field) -> Arg:
    return f.metadata.get("arg") or Arg()


def has_flag(a: Arg) -> bool:
    """Whether the field can be set with a reference command-line flag."""
    if a.actions:
        return True
    return not (a.no_cli or a.hydra_only or a.no_flag)


def primary_flag(name: str, a: Arg) -> str:
    if a.actions:
        return a.actions[0].flags[0]
    return a.cli_name or "--" + name.replace("_", "-")


def flags_of(name: str, a: Arg) -> Sequence[str]:
    if a.actions:
        return tuple(f for act in a.actions for f in act.flags)
    return (primary_flag(name, a),) + tuple(a.aliases)
