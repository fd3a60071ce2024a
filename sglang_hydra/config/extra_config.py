"""Parsing of ``memory.hicache_storage_backend_extra_config`` (rule RT-5).

The value is JSON text or ``@path`` to a .json, .toml, .yaml or .yml file.  A few keys
tune prefetching and are taken out here (with type checks); the rest belongs to the
storage backend.  The reference parses this when the cache starts; here it is parsed
while the record is resolved so a typo fails before anything is built.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Tuple


@dataclass(frozen=True)
class StorageExtraConfig:
    prefetch_threshold: int = 256
    prefetch_timeout_base: float = 1.0
    prefetch_timeout_per_ki_token: float = 0.25
    hicache_storage_pass_prefix_keys: bool = False
    backend: Dict[str, Any] = field(default_factory=dict)   # everything else, for the backend


_NUM = (int, float)


def load_extra_config(value: Optional[str]) -> Dict[str, Any]:
    """JSON text or @file -> dict (raises ValueError with a clear message)."""
    if value is None or str(value).strip() == "":
        return {}
    text = str(value).strip()
    if text.startswith("@"):
        path = Path(text[1:])
        ext = path.suffix.lower()
        if not path.is_file():
            raise ValueError(f"config file {path} does not exist")
        if ext == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
        elif ext == ".toml":
            import tomllib
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        elif ext in (".yaml", ".yml"):
            import yaml
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        else:
            raise ValueError(f"{path}: unsupported config format {ext or '(none)'}; use .json, .toml, .yaml or .yml")
    else:
        data = json.loads(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"must describe a JSON object, got {type(data).__name__}")
    return data


def parse_extra_config(value: Optional[str], storage_backend: Optional[str] = None) -> StorageExtraConfig:
    """Validate and split the extra config (raises ValueError naming the bad key)."""
    try:
        data = dict(load_extra_config(value))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at position {exc.pos})") from None
    out: Dict[str, Any] = {}
    checks: Tuple[Tuple[str, Any, tuple, str], ...] = (
        ("prefetch_threshold", 256, (int,), "an integer"),
        ("prefetch_timeout_base", 1, _NUM, "a number"),
        ("prefetch_timeout_per_ki_token", 0.25, _NUM, "a number"),
        ("hicache_storage_pass_prefix_keys", False, (bool,), "a boolean"),
    )
    for key, default, types, what in checks:
        v = data.pop(key, default)
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise ValueError(f"key {key!r} must be {what}, got {type(v).__name__} {v!r}")
        out[key] = v
    data.pop("tp_lcm_size", None)
    if storage_backend == "dynamic":
        for req in ("backend_name", "module_path", "class_name"):
            if not data.get(req):
                raise ValueError(f"the 'dynamic' storage backend needs key {req!r} (with backend_name, module_path, class_name)")
    return StorageExtraConfig(backend=data, **out)
