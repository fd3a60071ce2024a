"""``device``: where the KV pool lives."""
from __future__ import annotations

from typing import Optional

from ..schema_snapshot import build_namespace
from ..spec import arg


class _DeviceRules:
    device: Optional[str] = arg(
        None, "Device type (cuda, cpu, ...). Unset: cuda when a GPU is visible, else cpu; "
        "any ':N' index is dropped.")


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Device = build_namespace("device", _DeviceRules)
