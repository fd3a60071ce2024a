"""``mm``: multimodal options that interact with encoder disaggregation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..spec import arg


@dataclass
class Mm:
    enable_prefix_mm_cache: bool = arg(False, "Cache encoder outputs by prefix (encoder servers only).")
    enable_broadcast_mm_inputs_process: bool = arg(False, "Broadcast processed multimodal inputs to all ranks.")
    mm_enable_dp_encoder: Optional[bool] = arg(None, "Run the vision encoder data-parallel.")
