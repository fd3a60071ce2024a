"""Legal non-default values for any record field, as (python value, legacy argv tokens).

Shared by the surface tests and the differential test: it knows every action kind of the
reference parser (store_true, --x/--no-x, nargs '?', '+' and '*', JSON parsers, LoRA paths).
"""
from __future__ import annotations

import json
import random
import typing
from typing import Any, List, Optional, Tuple

from sglang_hydra.config.coerce import allowed_choices, base_type
from sglang_hydra.config.legacy import field_actions

_CG = {"decode": {"bs": [1, 2, 4]}, "prefill": {"max_bs": 8}}
# Free-text fields the reference already interprets while parsing (log_level names a logging level).
_TEXT_VALUES = {"log_level": ["debug", "info", "warning", "error"]}


def reference_choices(name: str):
    """The reference's own choices for a field (ours may have plugin additions such as ghost_lru)."""
    from sglang_hydra.config.schema_snapshot import reference_fields
    for act in reference_fields().get(name, {}).get("actions", []):
        if act.get("choices"):
            return act["choices"]
    return None


def _main_action(fi):
    acts = [a for a in field_actions(fi) if not a.action.startswith("deprecated")]
    return acts[0] if acts else None


def _elem(fi):
    tp, _ = base_type(fi)
    if typing.get_origin(tp) in (list, typing.List):
        (e,) = typing.get_args(tp) or (str,)
        return e
    return tp


def sample(fi, rng: random.Random) -> Optional[Tuple[Any, List[str]]]:
    """A value differing from the default and the tokens that set it; None if the flag cannot."""
    act = _main_action(fi)
    if act is None:
        return None
    flag = act.flags[0]
    default = fi.default_value()
    if act.action == "store_true":
        return None if default is True else (True, [flag])
    if act.action == "boolean_optional":
        v = (not default) if default is not None else rng.random() < 0.5
        return v, [flag if v else "--no-" + flag[2:]]
    if act.action == "lora_paths":
        v = [f"/lora/a{rng.randint(0, 99)}", {"lora_name": "x", "lora_path": "/lora/x"}]
        return v, [flag, v[0], json.dumps(v[1])]
    opts = reference_choices(fi.name) or allowed_choices(fi) or (list(act.choices) if act.choices else None)
    if fi.name in _TEXT_VALUES:
        opts = _TEXT_VALUES[fi.name]
    elem = _elem(fi)
    if opts:
        pool = [o for o in opts if o != default]
        if not pool:
            return None
        if act.nargs in ("+", "*"):
            v = rng.sample(pool, k=min(len(pool), rng.randint(1, 2)))
            return v, [flag, *map(str, v)]
        v = rng.choice(pool)
        return v, [flag, str(v)]
    parser = act.parser or "str"
    if parser == "json":
        v = {"k": rng.randint(0, 9), "s": "t"}
        return v, [flag, json.dumps(v)]
    if parser == "json_list":
        v = [rng.randint(1, 9), rng.randint(10, 99)] if elem is int else ["a", "b"]
        return v, [flag, json.dumps(v)]
    if parser == "cuda_graph_config":
        return _CG, [flag, json.dumps(_CG)]
    if act.nargs in ("+", "*"):
        n = rng.randint(1, 3)
        if elem is int:
            v = [rng.randint(1, 512) for _ in range(n)]
        elif elem is float:
            v = [round(rng.uniform(0.1, 2.0), 3) for _ in range(n)]
        else:
            v = [f"item{rng.randint(0, 99)}" for _ in range(n)]
        return v, [flag, *map(str, v)]
    if parser in ("int", "human_readable_int"):
        v = rng.randint(2, 5000)
        if v == default:
            v += 1
        if parser == "human_readable_int" and rng.random() < 0.3:
            return v * 1000, [flag, f"{v}k"]
        return v, [flag, str(v)]
    if parser == "float":
        v = round(rng.uniform(0.05, 0.95), 3)
        if v == default:
            v = 0.123
        return v, [flag, repr(v)]
    if act.nargs == "?" and rng.random() < 0.3:
        return act.const, [flag]
    v = f"v{rng.randint(0, 9999)}-{fi.name[:6]}"
    return v, [flag, v]
