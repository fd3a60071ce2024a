"""``device``: where the KV pool lives."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..spec import arg


@dataclass
class Device:
    device: Optional[str] = arg(
        None, "Device type (cuda, cpu, ...). Unset: cuda when a GPU is visible, else cpu; "
        "any ':N' index is dropped.")
