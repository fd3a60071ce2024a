"""One dataclass per namespace; the class *is* the namespace.

To add a namespace: write ``fields/<name>.py`` with one dataclass and list it in
``NAMESPACES`` below.  To add a field: add one line to its class.  Nothing else changes:
the record, the Hydra schema, the legacy flags and ``--help`` are generated.
"""
from __future__ import annotations

from .device import Device
from .execution import Exec
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
}

__all__ = ["NAMESPACES", "Device", "Exec", "Mm", "Disagg", "Memory", "Model", "Parallel", "Schedule", "Serving", "Spec"]
