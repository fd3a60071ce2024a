"""Whether a record's model architecture and KV geometry were stated or are the tiny stand-in.

The reference engine reads both from the checkpoint.  Here they come from a model preset, a
local checkpoint's ``config.json`` (rule ``model-geometry``) or fields set explicitly; a
``model_path`` that is none of these (a Hugging Face id such as ``Qwen/Qwen2.5-VL-7B-Instruct``)
keeps the field defaults, which are the ``tiny`` preset's two-layer Llama.  Rules that accept or
refuse a command by architecture or geometry must not judge such a stand-in: they skip the
check and say so (see :func:`unknown_model_hint`), and ``job.check=engine`` reports which of
the engine's model-dependent checks it could not judge.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Tuple

#: what names the model family: its architecture class and HF model_type
ARCHITECTURE_FIELDS = ("architecture", "model_type")
#: what shapes the KV cache (MLA or MHA, hybrid layers, layer and head counts)
GEOMETRY_FIELDS = ("attention_arch", "hybrid", "num_hidden_layers", "num_key_value_heads", "head_dim",
                   "kv_lora_rank")


@functools.lru_cache(maxsize=1)
def _model_presets() -> Tuple[Tuple[str, Dict[str, Any]], ...]:
    from ..presets import group_options, preset
    out = []
    for name in group_options("model"):
        data, _ = preset("model", name)
        out.append((name, dict((data or {}).get("model") or {}) if isinstance(data, dict) else {}))
    return tuple(out)


def presets_named_by(model_path: str) -> Tuple[Tuple[str, Dict[str, Any]], ...]:
    """The model presets whose name or ``model_path`` is ``model_path``, with their fields."""
    return tuple((name, data) for name, data in _model_presets() if model_path in (name, data.get("model_path")))


def _is_checkpoint(path: str) -> bool:
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


def _known(fields: Iterable[str], values: Mapping[str, Any], is_explicit: Callable[[str], bool],
           from_checkpoint: Callable[[str], bool]) -> bool:
    fields = tuple(fields)
    if any(is_explicit(f) or from_checkpoint(f) for f in fields):
        return True
    for _name, data in presets_named_by(str(values.get("model_path") or "")):
        if all(values.get(f) == data[f] for f in fields if f in data):
            return True     # the preset's own model (the default tiny one, say)
    return False


def known_in_resolution(cfg, fields: Iterable[str]) -> bool:
    """During resolution: were these fields stated (explicitly, by a chosen preset, or by a
    checkpoint's config.json), or are they the tiny defaults standing in for an unknown model?"""
    filled = {f for rule_id, f, _old, _new in cfg.log if rule_id == "model-geometry"}
    return _known(fields, cfg.values, lambda f: f in cfg.explicit, lambda f: f in filled)


def known_in_record(record, fields: Iterable[str]) -> bool:
    """The same question about a resolved record."""
    filled = {f for rule_id, f, _old, _new in getattr(record, "resolution_log", ()) if rule_id == "model-geometry"}
    values = record.to_dict()
    return _known(fields, values, record.is_explicit, lambda f: f in filled)


def architecture_known(cfg) -> bool:
    return known_in_resolution(cfg, ARCHITECTURE_FIELDS)


def geometry_known(cfg) -> bool:
    return known_in_resolution(cfg, GEOMETRY_FIELDS)


def unknown_model_hint(model_path: Any, what: str = "architecture") -> str:
    """Why a model-dependent check was skipped, and how to state the model."""
    return (f"the model's {what} is unknown (model_path {str(model_path)!r} is neither a selected model preset "
            "nor a local checkpoint directory with config.json); state it with model=<preset>, a checkpoint "
            f"directory, or model.{'architecture' if what == 'architecture' else 'attention_arch'}=...")


def skip_unjudged(cfg, check: str, what: str = "architecture") -> None:
    """An INFO note: ``check`` was not judged because the model is unknown."""
    cfg.info(f"{check} was not checked: {unknown_model_hint(cfg.model_path, what)}")
