"""``lora``: LoRA adapters served beside the base model (all fields from the reference schema)."""
from __future__ import annotations


from ..schema_snapshot import build_namespace


class _LoraRules:
    """No field of this namespace has a rule here yet."""


Lora = build_namespace("lora", _LoraRules)
