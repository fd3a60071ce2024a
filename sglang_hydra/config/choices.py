"""Choice lists that plugins may extend.

Fields that name a list here (``choices="RADIX_EVICTION_POLICY"``) read it at parse and
validation time, so a plugin that calls an ``add_*_choices`` hook before the first
composition makes its new name a legal value everywhere: legacy flags, Hydra overrides and
presets.  The layers above call these hooks when they register something (the cache layer
for each eviction policy); this module never imports them.
"""
from __future__ import annotations

from typing import Dict, Iterable, List

from .registry import run_registrars

_REGISTRY: Dict[str, List[str]] = {
    "RADIX_EVICTION_POLICY": ["lru", "lfu", "slru", "priority", "tlru"],
    "DISAGG_TRANSFER_BACKEND": ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"],
    "HICACHE_STORAGE_BACKEND": [
        "file", "sim", "mooncake", "npu_memcache", "hf3fs", "nixl", "aibrix", "dynamic",
        "eic", "simm", "mori", "shm", "tensorcast", "seaweedfs",
    ],
}


def choices(name: str) -> List[str]:
    """The current list registered under ``name``.

    Names that the layers above add (``ghost_lru`` from the cache layer's policy registry)
    are here once ``sglang_hydra.plugins`` has run, which the first read does (see
    :func:`.registry.add_registrar`)."""
    run_registrars()
    return _REGISTRY[name]


def _extend(name: str, values: Iterable[str]) -> None:
    lst = _REGISTRY[name]
    for v in values:
        if not isinstance(v, str) or not v:
            raise ValueError(f"choice names must be non-empty strings, got {v!r}")
        if v not in lst:
            lst.append(v)


def add_radix_eviction_policy_choices(*names: str) -> None:
    """Make new eviction-policy names legal for ``memory.radix_eviction_policy``."""
    _extend("RADIX_EVICTION_POLICY", names)


def add_disagg_transfer_backend_choices(*names: str) -> None:
    """Make new transfer-backend names legal for ``disagg.disaggregation_transfer_backend``."""
    _extend("DISAGG_TRANSFER_BACKEND", names)


def add_hicache_storage_backend_choices(*names: str) -> None:
    """Make new storage-backend names legal for ``memory.hicache_storage_backend``."""
    _extend("HICACHE_STORAGE_BACKEND", names)


# sglang-hydra's own transfer backend: pure-Python ZMQ, for machines without Mooncake.
add_disagg_transfer_backend_choices("zmq")


# Which eviction policies SGLang itself can run (issue 20).  The cache layer fills this in at
# import (``cache.policies``): the engine's own choices, and those our engine plugin adds.
_ENGINE_POLICIES = {"builtin": (), "plugin": (), "plugin_name": "", "hooked": ()}


def set_engine_policy_support(builtin: Iterable[str], plugin: Iterable[str], plugin_name: str,
                              hooked: Iterable[str] = ()) -> None:
    _ENGINE_POLICIES.update(builtin=tuple(builtin), plugin=tuple(plugin), plugin_name=plugin_name,
                            hooked=tuple(hooked))


def engine_policy_support() -> dict:
    """``{"builtin": names, "plugin": names, "plugin_name": entry-point name, "hooked": the
    plugin policies that run only in the plugin's hooked RadixCache}``."""
    run_registrars()
    return dict(_ENGINE_POLICIES)
