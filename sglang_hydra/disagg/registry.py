"""Backend registry: ``disaggregation_transfer_backend`` -> manager/sender/receiver/bootstrap classes.

Built-in backends are loaded lazily and by module name (importing this module never imports
Mooncake or NIXL, and no backend module imports this one): each module under
``sglang_hydra.disagg.backends`` exposes ``backend_classes()`` (raising
:class:`BackendUnavailableError` when it cannot run) and ``available()``.
A plugin registers its own backend with :func:`register_backend`, which also adds the name to
the config choices; plugins installed as packages can instead expose an entry point in the
``sglang_hydra.disagg_backends`` group (loaded by :func:`load_plugins`) whose object is a
zero-argument callable that calls :func:`register_backend`.
"""
from __future__ import annotations

import importlib
import logging
import os
from typing import Callable, Dict, Union

from sglang_hydra.config.choices import add_disagg_transfer_backend_choices

from .base import BackendClasses, BackendUnavailableError, KVClassType
from .buffers import KVArgs

logger = logging.getLogger("sglang_hydra.disagg")

# the zmq backend is this project's addition: make it a legal config value
add_disagg_transfer_backend_choices("zmq")


Loader = Callable[[], BackendClasses]
_REGISTRY: Dict[str, Loader] = {}
_CACHE: Dict[str, BackendClasses] = {}


def register_backend(name: str, classes: Union[BackendClasses, Loader], *, replace: bool = False,
                     extend_choices: bool = True) -> None:
    """Make ``name`` a transfer backend (a :class:`BackendClasses` or a lazy loader returning one)."""
    if not isinstance(name, str) or not name:
        raise ValueError("backend name must be a non-empty string")
    if name in _REGISTRY and not replace:
        raise ValueError(f"transfer backend {name!r} is already registered (pass replace=True)")
    _REGISTRY[name] = classes if callable(classes) and not isinstance(classes, BackendClasses) else (lambda c=classes: c)
    _CACHE.pop(name, None)
    if extend_choices:
        add_disagg_transfer_backend_choices(name)


def registered_backends():
    return sorted(_REGISTRY)


def resolve_backend_name(name: str) -> str:
    """Apply rule D-PD1: ``mooncake_tcp`` is Mooncake forced onto TCP (``MC_FORCE_TCP=1``)."""
    if name == "mooncake_tcp":
        os.environ.setdefault("MC_FORCE_TCP", "1")
        logger.info("disaggregation transfer backend 'mooncake_tcp' -> mooncake with MC_FORCE_TCP=1 "
                    "(TCP transport, no RDMA)")
        return "mooncake"
    return name


def backend_classes(name: str) -> BackendClasses:
    name = resolve_backend_name(name)
    if name not in _REGISTRY:
        raise ValueError(f"Unsupported transfer backend: {name!r} (known: {', '.join(registered_backends())})")
    if name not in _CACHE:
        _CACHE[name] = _REGISTRY[name]()
    return _CACHE[name]


def get_kv_class(backend: str, class_type: Union[KVClassType, str]):
    """The reference's factory: one class of ``backend`` (``None`` for fake's bootstrap server)."""
    if KVClassType(class_type) == KVClassType.KVARGS:
        return KVArgs
    return backend_classes(backend).get(class_type)


def backend_available(name: str) -> bool:
    """Can ``name`` run here (classes load and, for built-ins, the native library imports)?"""
    try:
        backend_classes(name)
    except BackendUnavailableError:
        return False
    module = _BUILTIN_MODULES.get(resolve_backend_name(name))
    if module is None:
        return True
    return bool(importlib.import_module(f"sglang_hydra.disagg.backends.{module}").available())


def load_plugins(group: str = "sglang_hydra.disagg_backends") -> int:
    from importlib.metadata import entry_points
    n = 0
    for ep in entry_points(group=group):
        ep.load()()
        n += 1
    return n


def _module_loader(module: str) -> Loader:
    def load() -> BackendClasses:
        return importlib.import_module(f"sglang_hydra.disagg.backends.{module}").backend_classes()
    return load


def _unavailable(message: str) -> Loader:
    def load() -> BackendClasses:
        raise BackendUnavailableError(message)
    return load


_BUILTIN_MODULES = {"mooncake": "mooncake", "zmq": "zmq_backend", "fake": "fake", "nixl": "nixl"}
register_backend("mooncake", _module_loader("mooncake"), extend_choices=False)
register_backend("zmq", _module_loader("zmq_backend"))
register_backend("fake", _module_loader("fake"), extend_choices=False)
register_backend("nixl", _module_loader("nixl"), extend_choices=False)
register_backend("ascend", _unavailable(
    "the 'ascend' transfer backend needs Huawei Ascend NPUs and the Ascend build of Mooncake "
    "(mooncake with ENABLE_ASCEND_TRANSFER_WITH_MOONCAKE / the CANN toolkit); it cannot run on this "
    "CPU machine. Use 'mooncake', 'mooncake_tcp' or 'zmq'."), extend_choices=False)
register_backend("mori", _unavailable(
    "the 'mori' transfer backend needs AMD Instinct GPUs with RDMA NICs and the ROCm `mori` package; "
    "it cannot run on this CPU machine. Use 'mooncake', 'mooncake_tcp' or 'zmq'."), extend_choices=False)
