"""``observability``: logging, metrics and tracing (all fields from the reference schema)."""
from __future__ import annotations


from ..schema_snapshot import build_namespace


class _ObservabilityRules:
    """No field of this namespace has a rule here yet."""


Observability = build_namespace("observability", _ObservabilityRules)
