"""Version drift: how this project's hand-written namespaces differ from an installed engine's.

``memory`` and ``disagg`` are written out by hand (see :mod:`.schema_snapshot`), so a newer
SGLang can add a field, change a default or a choice list without anything here noticing.
``job.check=engine`` hands :func:`drift` the schema the installed engine reports and warns
about every difference.  This sits above the record and the legacy flags, which it reads.
"""
from __future__ import annotations

import typing
from typing import Any, Dict, List, Optional

from .coerce import allowed_choices
from .legacy import field_actions
from .record import FIELDS
from .schema_snapshot import HAND_WRITTEN, top_namespace


def type_text(tp: Any) -> str:
    """A typing object in the snapshot's spelling (``Optional[List[int]]``, ``Optional[Dict]``)."""
    if tp is Any:
        return "Any"
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return f"Optional[{type_text(args[0])}]"
    if origin in (list, List):
        (elem,) = typing.get_args(tp) or (Any,)
        return f"List[{type_text(elem)}]"
    if origin in (dict, Dict) or tp is dict:
        return "Dict"
    return getattr(tp, "__name__", str(tp))


def _actions_summary(acts: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The facts drift compares, from a list of snapshot flag entries (one per argparse action)."""
    main = acts[0] if acts else {}
    return {
        "flags": [f for a in acts for f in a["flags"]],
        "choices": next((a.get("choices") for a in acts if a.get("choices") is not None), None),
        "nargs": next((a.get("nargs") for a in acts if a.get("nargs") not in (None, 0)), None),
        "action": main.get("action"),
        "parser": main.get("parser") if main.get("action") in ("store", "lora_paths") else None,
    }


def fields_summary(snapshot: Dict[str, Any], namespaces=HAND_WRITTEN) -> Dict[str, Dict[str, Any]]:
    """name -> {namespace, type, default, flags, choices, nargs, action, parser} for the fields of ``namespaces``."""
    by_dest: Dict[str, List[Dict[str, Any]]] = {}
    for fl in snapshot.get("flags", []):
        by_dest.setdefault(fl["dest"], []).append(fl)
    out = {}
    for e in snapshot.get("fields", []):
        if top_namespace(e.get("namespace") or "") not in namespaces:
            continue
        out[e["name"]] = {"namespace": top_namespace(e["namespace"]), "type": e.get("type"),
                          "default": e.get("default"), **_actions_summary(by_dest.get(e["name"], []))}
    return out


def builtin_summary(namespaces=HAND_WRITTEN) -> Dict[str, Dict[str, Any]]:
    """The same summary for this project's own (hand-written) memory/disagg fields."""
    out = {}
    for name, fi in FIELDS.items():
        if fi.namespace not in namespaces:
            continue
        acts = [{"flags": list(a.flags), "action": a.action, "parser": a.parser or "str",
                 "choices": list(a.choices) if a.choices is not None else None, "nargs": a.nargs}
                for a in field_actions(fi)]
        summary = _actions_summary(acts)
        summary["choices"] = allowed_choices(fi) if acts else None  # plugin-added choices included
        out[name] = {"namespace": fi.namespace, "type": type_text(fi.type), "default": fi.default_value(), **summary}
    return out


def _flag_lines(key: str, ours: List[str], theirs: List[str], version: str) -> List[str]:
    lines = [f"{key}: flag {f} removed in SGLang {version}" for f in ours if f not in theirs]
    lines += [f"{key}: flag {f} added in SGLang {version}" for f in theirs if f not in ours]
    if not lines and ours != theirs:
        lines.append(f"{key}: flags {ours} here, {theirs} in SGLang {version}")
    return lines


def drift(installed: Dict[str, Any], namespaces=HAND_WRITTEN) -> List[str]:
    """One line per difference between an installed engine's memory/disagg fields and ours.

    ``installed`` is a snapshot as ``extract_schema.py`` writes it.  Added and removed
    fields, changed namespaces, types, defaults, added and removed flags, action kinds
    (store, store_true, ...), value parsers, choices and nargs are each named; extra choices
    that a plugin added on our side are not differences (only the reference's list must be
    a prefix)."""
    theirs = fields_summary(installed, namespaces)
    ours = builtin_summary(namespaces)
    version = installed.get("version", "?")
    lines = []
    for name in theirs:
        if name not in ours:
            lines.append(f"{theirs[name]['namespace']}.{name}: SGLang {version} has this field, sglang-hydra does not")
    for name in ours:
        if name not in theirs:
            if not ours[name]["flags"]:
                continue   # our own hydra-only additions (KV geometry, the bootstrap secret) have no flag to drift
            lines.append(f"{ours[name]['namespace']}.{name}: sglang-hydra has this field, SGLang {version} does not")
    for name in theirs:
        if name not in ours:
            continue
        t, o = theirs[name], ours[name]
        key = f"{o['namespace']}.{name}"
        if t["namespace"] != o["namespace"]:
            lines.append(f"{key}: namespace is {t['namespace']!r} in SGLang {version}")
        if t["type"] is not None and t["type"] != o["type"]:
            lines.append(f"{key}: type {o['type']} here, {t['type']} in SGLang {version}")
        if t["default"] != o["default"]:
            lines.append(f"{key}: default {o['default']!r} here, {t['default']!r} in SGLang {version}")
        lines += _flag_lines(key, o["flags"], t["flags"], version)
        if not (t["flags"] and o["flags"]):
            continue   # one side has no flag: the flag lines said so; nothing else to compare
        if t["action"] != o["action"]:
            lines.append(f"{key}: action {o['action']} here, {t['action']} in SGLang {version}")
        elif t["parser"] != o["parser"]:
            lines.append(f"{key}: value parser {o['parser']} here, {t['parser']} in SGLang {version}")
        tc, oc = t["choices"], o["choices"]
        if tc is not None and (oc is None or list(oc)[:len(tc)] != list(tc)):
            lines.append(f"{key}: choices {oc} here, {tc} in SGLang {version}")
        if tc is None and oc is not None:
            lines.append(f"{key}: choices {oc} here, any value in SGLang {version}")
        if t["nargs"] != o["nargs"]:
            lines.append(f"{key}: nargs {o['nargs']!r} here, {t['nargs']!r} in SGLang {version}")
    return lines
