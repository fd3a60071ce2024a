"""Version drift: how this project's hand-written namespaces differ from an installed engine's.

``memory`` and ``disagg`` are written out by hand (see :mod:`.schema_snapshot`), so a newer
SGLang can add a field, change a default or a choice list without anything here noticing.
``job.check=engine`` hands :func:`drift` the schema the installed engine reports and warns
about every difference.  This sits above the record and the legacy flags, which it reads.
"""
from __future__ import annotations

from typing import Any, Dict, List

from .coerce import allowed_choices
from .legacy import flag_actions
from .record import FIELDS
from .schema_snapshot import HAND_WRITTEN, top_namespace


def fields_summary(snapshot: Dict[str, Any], namespaces=HAND_WRITTEN) -> Dict[str, Dict[str, Any]]:
    """name -> {type, default, flags, choices, nargs, parser} for the fields of ``namespaces``."""
    by_dest: Dict[str, List[Dict[str, Any]]] = {}
    for fl in snapshot.get("flags", []):
        by_dest.setdefault(fl["dest"], []).append(fl)
    out = {}
    for e in snapshot.get("fields", []):
        if top_namespace(e.get("namespace") or "") not in namespaces:
            continue
        acts = by_dest.get(e["name"], [])
        out[e["name"]] = {
            "namespace": top_namespace(e["namespace"]), "type": e.get("type"), "default": e.get("default"),
            "flags": [f for a in acts for f in a["flags"]],
            "choices": next((a.get("choices") for a in acts if a.get("choices") is not None), None),
            "nargs": next((a.get("nargs") for a in acts if a.get("nargs") is not None), None),
        }
    return out


def builtin_summary(namespaces=HAND_WRITTEN) -> Dict[str, Dict[str, Any]]:
    """The same summary for this project's own (hand-written) memory/disagg fields."""
    acts: Dict[str, List[Any]] = {}
    for a in dict.fromkeys(flag_actions().values()):
        acts.setdefault(a.dest, []).append(a)
    out = {}
    for name, fi in FIELDS.items():
        if fi.namespace not in namespaces:
            continue
        mine = acts.get(name, [])
        out[name] = {
            "namespace": fi.namespace, "default": fi.default_value(),
            "flags": [f for a in mine for f in a.option_strings],
            "choices": allowed_choices(fi),
            "nargs": next((a.nargs for a in mine if a.nargs not in (None, 0)), None),
        }
    return out


def drift(installed: Dict[str, Any], namespaces=HAND_WRITTEN) -> List[str]:
    """One line per difference between an installed engine's memory/disagg fields and ours.

    ``installed`` is a snapshot as ``extract_schema.py`` writes it.  Added and removed
    fields, changed defaults, flags, choices and nargs are named; extra choices that a
    plugin added on our side are not differences (only the reference's list must be a prefix).
    """
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
        if t["default"] != o["default"]:
            lines.append(f"{key}: default {o['default']!r} here, {t['default']!r} in SGLang {version}")
        if t["flags"] and t["flags"] != o["flags"]:
            lines.append(f"{key}: flags {o['flags']} here, {t['flags']} in SGLang {version}")
        tc, oc = t["choices"], o["choices"]
        if tc is not None and (oc is None or list(oc)[:len(tc)] != list(tc)):
            lines.append(f"{key}: choices {oc} here, {tc} in SGLang {version}")
        if tc is None and oc is not None and t["flags"]:
            lines.append(f"{key}: choices {oc} here, any value in SGLang {version}")
        if t["nargs"] != o["nargs"] and t["flags"]:
            lines.append(f"{key}: nargs {o['nargs']!r} here, {t['nargs']!r} in SGLang {version}")
    return lines
