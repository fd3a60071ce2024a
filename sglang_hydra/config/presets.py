"""The ``conf/`` directory: config groups, their preset files and the default choices.

Both composers read presets, and so do the hardware and deploy groups and the Hydra schema
(which keeps every field some preset sets), so the lookup lives here, below all of them.
A preset file is read once per modification time.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, List, Optional, Sequence, Tuple

from .errors import did_you_mean
from .fields import NAMESPACES
from .registry import job_schemas

# ``job`` and ``hardware`` are composed beside the record (config/hardware.py), not into it.
GROUPS = tuple(NAMESPACES) + ("job", "hardware")


@functools.lru_cache(maxsize=1)
def conf_dir() -> Path:
    """The ``conf/`` directory: beside the package's own source tree (a checkout: the presets that
    go with this code, even when an editable install of another checkout maps ``sglang_hydra.conf``
    elsewhere), else shipped as package ``sglang_hydra.conf``."""
    here = Path(__file__).resolve().parents[2] / "conf"
    if (here / "config.yaml").is_file():
        return here
    try:
        import importlib.util
        spec = importlib.util.find_spec("sglang_hydra.conf")
        if spec and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                if (Path(loc) / "config.yaml").is_file():
                    return Path(loc)
    except ImportError:
        pass
    raise FileNotFoundError("cannot find the conf/ directory (config.yaml) of sglang-hydra")


def yaml_load(path: Path) -> Any:
    """A YAML file's data, with the C loader when PyYAML has one."""
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, "r", encoding="utf-8") as fh:
        return yaml.load(fh, Loader=loader)


_GLOBAL_PACKAGE = re.compile(r"^#\s*@package\s+_global_\s*$", re.M)


@functools.lru_cache(maxsize=256)
def _load_preset(path: str, group: str, mtime: float) -> Tuple[Any, bool]:
    """(settings by namespace, plain); plain is False when the file needs Hydra.

    A preset normally holds fields of its own group's namespace.  One headed
    ``# @package _global_`` may also set fields of other namespaces (``hicache_file`` picks
    a page size); as long as it is a plain ``{namespace: {field: value}}`` mapping the
    direct composer applies it too.  Defaults lists and other packages go through Hydra.
    """
    text = Path(path).read_text(encoding="utf-8")
    data = yaml_load(Path(path)) or {}
    if not isinstance(data, dict):
        return data, True
    if _GLOBAL_PACKAGE.search(text):
        plain = "defaults" not in data and all(k in NAMESPACES and isinstance(v, dict) for k, v in data.items())
        return data, plain
    plain = "@package" not in text and "defaults" not in data
    return {group: data}, plain


def preset(group: str, option: str) -> Tuple[Any, bool]:
    """The preset ``group/option`` as ``{namespace: {field: value}}`` (None when missing)."""
    p = conf_dir() / group / f"{option}.yaml"
    if not p.is_file():
        return None, True
    return _load_preset(str(p), group, p.stat().st_mtime)


def group_options(group: str) -> List[str]:
    """The options of a config group: its preset files, and for ``job`` every registered job too."""
    d = conf_dir() / group
    names = sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []
    if group == "job":
        names = sorted(set(names) | set(job_schemas()))
    return names


def no_such_option(group: str, option: str, options: Sequence[str], kind: str = "preset") -> str:
    """Why ``group=option`` selects nothing: the options the group has, and the closest one."""
    if not options:
        return (f"group '{group}' has no {kind}s to select ('{option}' given); set its fields instead, "
                f"as {group}.<field>=value")
    return (f"no {kind} '{option}' in group '{group}'; available: {', '.join(options)}"
            f"{did_you_mean(option, options)}")


@functools.lru_cache(maxsize=1)
def default_choices() -> Tuple[Tuple[str, Optional[str]], ...]:
    """Group -> option pairs from the defaults list of conf/config.yaml (None: ``null``,
    the group selects no preset unless the user picks one)."""
    data = yaml_load(conf_dir() / "config.yaml") or {}
    out = []
    for entry in data.get("defaults", []):
        if isinstance(entry, dict):
            for k, v in entry.items():
                if k in GROUPS:
                    out.append((k, v))
    return tuple(out)
