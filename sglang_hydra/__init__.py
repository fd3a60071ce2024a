"""sglang-hydra: SGLang's memory and disaggregation settings as Hydra-composed dataclasses.

``compose_record`` turns Hydra overrides and the reference engine's flags into one
resolved, immutable ``ServerArgs``; later stages (memory pools, caches, PD transfer,
replay) read only that record.  Importing this package loads only the config layer's
registry (standard library): it hands the registry the function that registers the built-in
jobs and eviction policies (:mod:`sglang_hydra.plugins`), which runs on the first read of a
registry.  So the SGLang engine plugin (:mod:`sglang_hydra.cache.sglang_plugin`) loads
inside a server without the jobs, the config composer or the cache.
"""
from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "compose_record": ("sglang_hydra.config.compose", "compose_record"),
    "legacy_parser": ("sglang_hydra.config.legacy", "legacy_parser"),
    "ServerArgs": ("sglang_hydra.config.record", "ServerArgs"),
    "ConfigError": ("sglang_hydra.config.errors", "ConfigError"),
    "namespace_of": ("sglang_hydra.config.record", "namespace_of"),
    "get_memory": ("sglang_hydra.config.record", "get_memory"),
    "get_disagg": ("sglang_hydra.config.record", "get_disagg"),
    "get_model": ("sglang_hydra.config.record", "get_model"),
    "get_schedule": ("sglang_hydra.config.record", "get_schedule"),
    "get_parallel": ("sglang_hydra.config.record", "get_parallel"),
    "get_device": ("sglang_hydra.config.record", "get_device"),
    "get_spec": ("sglang_hydra.config.record", "get_spec"),
    "get_serving": ("sglang_hydra.config.record", "get_serving"),
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        import importlib
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sglang_hydra' has no attribute {name!r}")


def _register_builtins() -> None:
    from .plugins import load_builtin_plugins

    load_builtin_plugins()


def _defer_registration() -> None:
    from .config.registry import add_registrar

    add_registrar(_register_builtins)


_defer_registration()
