"""Checking ``radix_eviction_policy_config`` when the record is resolved.

Each eviction policy declares its parameters beside its implementation (the cache layer;
plugins declare theirs the same way).  The cache layer registers a checker for them in
:mod:`.registry` at start-up, so an unknown key or a bad value fails while the record is
resolved, naming the policy, the key and what is allowed, instead of when the tree is
built, and the config layer never imports the cache layer.
"""
from __future__ import annotations

from typing import Any, List

from .registry import policy_param_checkers


def validate_policy_config(policy: str, cfg: Any) -> List[str]:
    """Error texts for ``cfg`` as keyword arguments of ``policy`` (empty list: fine).

    The first registered checker that knows ``policy`` decides; a name no checker knows is
    left to the choices check, which reports unknown names already."""
    for checker in policy_param_checkers():
        errors = checker(policy, cfg)
        if errors is not None:
            return list(errors)
    return []
