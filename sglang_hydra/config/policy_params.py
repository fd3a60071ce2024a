"""Checking ``radix_eviction_policy_config`` when the record is resolved.

Each eviction policy declares its parameters beside its implementation
(``sglang_hydra.cache.policies``; plugins register theirs the same way).  The config layer
asks that registry, so an unknown key or a bad value fails while the record is resolved,
naming the policy, the key and what is allowed, instead of when the tree is built.  The
cache package is pure Python, so this import keeps the config layer free of torch.
"""
from __future__ import annotations

from typing import Any, List


def validate_policy_config(policy: str, cfg: Any) -> List[str]:
    """Error texts for ``cfg`` as keyword arguments of ``policy`` (empty list: fine)."""
    from ..cache.policies import available_policies, validate_policy_config as check

    if policy not in available_policies(include_replay_only=True):
        return []  # an unknown name is already reported by the choices check
    return list(check(policy, cfg))
