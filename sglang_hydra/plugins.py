"""Start-up registration: the layers above ``config`` fill in its registries.

``config`` imports nothing above it, yet composing a record needs to know the jobs
(``job=replay job.format=json``), the eviction-policy names (``ghost_lru``) and how to check
a policy's parameters.  Importing ``sglang_hydra`` defers :func:`load_builtin_plugins` to the
first read of a registry (``config.registry.add_registrar``), so the command line,
``compose_record`` and every test see the same registries, and a process that needs none
(SGLang loading the engine plugin) does not pay for them.  All of it is
pure Python: nothing here imports torch, Triton or Hydra.

Third-party code extends the same registries directly: ``config.registry.register_job_schema``,
``cache.policies.register_eviction_policy``, ``config.choices.add_*_choices``.
"""
from __future__ import annotations

from typing import Any, List, Optional

_loaded = False


def load_builtin_plugins() -> None:
    """Register the built-in jobs, eviction policies and policy-parameter checks (idempotent)."""
    global _loaded
    if _loaded:
        return
    from .cache import hit_density, policies  # noqa: F401  (register each policy's name as a config choice)
    from .config.registry import register_policy_param_checker
    from .jobs import specs  # noqa: F401  (registers each job's settings)

    register_policy_param_checker(check_eviction_policy_params)
    _loaded = True


def check_eviction_policy_params(policy: str, cfg: Any) -> Optional[List[str]]:
    """The cache layer's check of ``radix_eviction_policy_config`` (None: not a known policy)."""
    from .cache.policies import available_policies, validate_policy_config

    if policy not in available_policies(include_replay_only=True):
        return None
    return list(validate_policy_config(policy, cfg))


__all__ = ["load_builtin_plugins", "check_eviction_policy_params"]
