"""One dataclass per namespace; the class *is* the namespace.

Every field of the reference engine's record comes from the bundled schema snapshot
(``schema_snapshot.build_namespace``); a namespace module declares by hand only the fields
that carry rules, bounds or this project's own defaults (``memory`` and ``disagg`` are
written out in full).  The record, the Hydra schema, the legacy flags and ``--help`` are
generated from these classes.
"""
from __future__ import annotations

from .device import Device
from .execution import Exec
from .lora import Lora
from .observability import Observability
from .mm import Mm
from .disagg import Disagg
from .memory import Memory
from .model import Model
from .parallel import Parallel
from .schedule import Schedule
from .serving import Serving
from .spec import Spec

# namespace path -> class, in the order namespaces are collected.
NAMESPACES = {
    "model": Model,
    "disagg": Disagg,
    "spec": Spec,
    "exec": Exec,
    "device": Device,
    "parallel": Parallel,
    "memory": Memory,
    "schedule": Schedule,
    "serving": Serving,
    "mm": Mm,
    "lora": Lora,
    "observability": Observability,
}

__all__ = ["NAMESPACES", "Device", "Exec", "Lora", "Observability", "Mm", "Disagg", "Memory", "Model", "Parallel", "Schedule", "Serving", "Spec"]
