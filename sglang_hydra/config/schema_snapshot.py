"""The reference engine's command-line surface, as a bundled snapshot of facts.

``snapshots/sglang_<version>.json`` is written by ``scripts/extract_schema.py`` from an
installed SGLang: every record field (namespace, type, default, required, resolvable,
has-a-flag) and every argparse action (option strings, action kind, value parser, choices,
nargs, const, default), plus the record's positional order.  No help text is stored.

The namespace classes in ``fields/`` are generated from it at import
(:func:`build_namespace`): a hand-written class names the fields this project gives rules,
bounds or its own defaults; every other field of the namespace comes from the snapshot.
``memory`` and ``disagg`` stay fully hand-written; :func:`sglang_hydra.config.drift.drift`
compares them with the schema of an installed engine and names every difference.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .spec import Arg, FlagSpec

SNAPSHOT_VERSION = "0.5.23"
SNAPSHOT_DIR = Path(__file__).resolve().parent / "snapshots"

# Namespaces whose classes are written by hand in full (no generated fields).
HAND_WRITTEN = ("memory", "disagg")


@functools.lru_cache(maxsize=4)
def load_snapshot(version: str = SNAPSHOT_VERSION) -> Dict[str, Any]:
    path = SNAPSHOT_DIR / f"sglang_{version.replace('.', '_')}.json"
    with open(path, "r", encoding="utf-8") as fh:
        return json.load(fh)


def top_namespace(ref_namespace: str) -> str:
    """``exec.moe`` -> ``exec``: this project keeps one config group per top-level namespace."""
    return ref_namespace.split(".", 1)[0]


def parse_type(text: str):
    """The snapshot's type spelling back to a typing object."""
    simple = {"bool": bool, "int": int, "float": float, "str": str, "Any": Any, "Dict": Dict[str, Any]}
    if text in simple:
        return simple[text]
    if text.startswith("Optional[") and text.endswith("]"):
        inner = parse_type(text[len("Optional["):-1])
        return Any if inner is Any else Optional[inner]
    if text.startswith("List[") and text.endswith("]"):
        return List[parse_type(text[len("List["):-1])]
    return Any


def flag_specs(entries: List[Dict[str, Any]]) -> Tuple[FlagSpec, ...]:
    out = []
    for e in entries:
        ch = e.get("choices")
        out.append(FlagSpec(flags=tuple(e["flags"]), action=e.get("action", "store"), parser=e.get("parser"),
                            choices=tuple(ch) if ch is not None else None, nargs=e.get("nargs"),
                            const=e.get("const"), required=bool(e.get("required"))))
    return tuple(out)


def _effective_type(entry: Dict[str, Any], actions: Tuple[FlagSpec, ...]):
    """The type of the values the reference's parser produces for this field.

    The reference annotates some fields ``Dict`` or ``Any`` but parses them as plain
    strings; the record holds what the parser produced, so the parser decides here."""
    text = entry["type"]
    if not actions:
        return parse_type(text)
    main = actions[0]
    if main.action == "lora_paths":
        return Optional[List[Any]]
    if main.parser in ("json", "json_list", "cuda_graph_config"):
        return parse_type(text) if text.startswith(("List[", "Optional[List[")) and "Any" not in text else Any
    if "Dict" in text or "Any" in text:
        if main.nargs in ("+", "*"):
            return Optional[List[str]]
        return Optional[str]
    return parse_type(text)


@functools.lru_cache(maxsize=4)
def reference_fields(version: str = SNAPSHOT_VERSION) -> Dict[str, Dict[str, Any]]:
    """Field name -> snapshot entry (with its flag entries under ``"actions"``), positional order."""
    snap = load_snapshot(version)
    by_dest: Dict[str, List[Dict[str, Any]]] = {}
    for fl in snap["flags"]:
        by_dest.setdefault(fl["dest"], []).append(fl)
    entries = {e["name"]: e for e in snap["fields"]}
    out: Dict[str, Dict[str, Any]] = {}
    for name in snap["positional_order"] + [n for n in entries if n not in snap["positional_order"]]:
        e = dict(entries[name])
        e["actions"] = by_dest.get(name, [])
        out[name] = e
    return out


@functools.lru_cache(maxsize=4)
def fields_by_namespace(version: str = SNAPSHOT_VERSION) -> Dict[str, Dict[str, Dict[str, Any]]]:
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for name, entry in reference_fields(version).items():
        out.setdefault(top_namespace(entry["namespace"] or ""), {})[name] = entry
    return out


def _declared_fields(cls: type) -> Dict[str, dataclasses.Field]:
    """The ``arg(...)`` declarations of a plain (or dataclass) rules class, in order."""
    if dataclasses.is_dataclass(cls):
        return {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for name in cls.__dict__.get("__annotations__", {}):
        f = cls.__dict__.get(name)
        if not isinstance(f, dataclasses.Field):
            f = dataclasses.field(default=f)
        out[name] = f
    return out


def _default_field(default: Any, md: Dict[str, Any]) -> dataclasses.Field:
    if isinstance(default, (list, dict)):
        frozen = json.dumps(default)
        return dataclasses.field(default_factory=lambda: json.loads(frozen), metadata=md)
    return dataclasses.field(default=default, metadata=md)


def _generated_arg(entry: Dict[str, Any], actions: Tuple[FlagSpec, ...]) -> Arg:
    underscore = entry["name"].startswith("_")
    return Arg(help="", actions=actions, no_cli=underscore, no_flag=not actions,
               resolvable=bool(entry.get("resolvable")), required=bool(entry.get("required")),
               ref_namespace=entry["namespace"] if entry["namespace"] != top_namespace(entry["namespace"]) else None)


def _merge_arg(hand: Arg, entry: Dict[str, Any], actions: Tuple[FlagSpec, ...]) -> Arg:
    """A hand-written field keeps its help, bounds and rule options; flags and choices follow the reference."""
    return dataclasses.replace(
        hand, actions=actions, no_flag=not actions, cli_name=None, aliases=(),
        choices=None, parser=None, nargs=None,
        resolvable=hand.resolvable or bool(entry.get("resolvable")),
        ref_namespace=entry["namespace"] if entry["namespace"] != top_namespace(entry["namespace"]) else None)


def build_namespace(namespace: str, hand_cls: type, *, version: str = SNAPSHOT_VERSION) -> type:
    """The namespace's dataclass: every reference field of ``namespace`` in positional order
    (hand-written declarations win for help, bounds, defaults and rule options), then the
    hand-written fields the reference does not have (e.g. the model's KV geometry)."""
    import typing
    hand = _declared_fields(hand_cls)
    hints = typing.get_type_hints(hand_cls) if hand else {}
    specs = []
    seen = set()
    for name, entry in fields_by_namespace(version).get(namespace, {}).items():
        seen.add(name)
        actions = flag_specs(entry["actions"])
        if name in hand:
            f = hand[name]
            a = _merge_arg(f.metadata["arg"], entry, actions)
            md = {"arg": a}
            if f.default_factory is not dataclasses.MISSING:
                fld = dataclasses.field(default_factory=f.default_factory, metadata=md)
            else:
                fld = dataclasses.field(default=f.default, metadata=md)
            specs.append((name, hints[name], fld))
        else:
            tp = _effective_type(entry, actions)
            if entry["default"] is None and tp is not Any and typing.get_origin(tp) is not typing.Union:
                tp = Optional[tp]  # annotated ``str`` with a None default: the record holds None
            specs.append((name, tp, _default_field(entry["default"], {"arg": _generated_arg(entry, actions)})))
    for name, f in hand.items():
        if name in seen:
            continue
        copy = dataclasses.field(default=f.default, default_factory=f.default_factory, metadata=f.metadata)
        specs.append((name, hints[name], copy))
    from .fastclass import fast_dataclass
    cls_name = hand_cls.__name__.strip("_")
    cls_name = cls_name[:-len("Rules")] if cls_name.endswith("Rules") else cls_name
    return fast_dataclass(cls_name, specs, namespace={"__doc__": hand_cls.__doc__}, module=hand_cls.__module__)
