"""``mm``: multimodal options that interact with encoder disaggregation."""
from __future__ import annotations

from typing import Optional

from ..schema_snapshot import build_namespace
from ..spec import arg


class _MmRules:
    enable_prefix_mm_cache: bool = arg(False, "Cache encoder outputs by prefix (encoder servers only).")
    enable_broadcast_mm_inputs_process: bool = arg(False, "Broadcast processed multimodal inputs to all ranks.")
    mm_enable_dp_encoder: Optional[bool] = arg(None, "Run the vision encoder data-parallel.")


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Mm = build_namespace("mm", _MmRules)
