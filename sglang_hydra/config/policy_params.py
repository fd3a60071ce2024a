"""Parameters each eviction policy accepts, for checking ``radix_eviction_policy_config``.

The cache package registers its policies' parameter tables here (a plugin registering a
policy does the same), so the config layer can reject an unknown key or a bad value when
the record is resolved, naming the policy, the key and what is allowed, instead of
failing later when the tree is built.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

# policy -> {param: (check(value) -> error text or None, description)}
_PARAMS: Dict[str, Dict[str, tuple]] = {}
_VALIDATORS: Dict[str, Callable[[Dict[str, Any]], List[str]]] = {}


def _int_ge(lo: int):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int):
            return f"must be an integer >= {lo}, got {v!r}"
        if v < lo:
            return f"must be an integer >= {lo}, got {v!r}"
        return None
    return check


def _number_ge(lo: float):
    def check(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return f"must be a number >= {lo:g}, got {v!r}"
        if v < lo:
            return f"must be a number >= {lo:g}, got {v!r}"
        return None
    return check


def register_policy_params(name: str, params: Dict[str, tuple],
                           validator: Optional[Callable[[Dict[str, Any]], List[str]]] = None) -> None:
    _PARAMS[name] = dict(params)
    if validator is not None:
        _VALIDATORS[name] = validator


def _tlru_check(cfg: Dict[str, Any]) -> List[str]:
    t, n = cfg.get("threshold", 0), cfg.get("next_prompt_estimate", 0)
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (t, n)) and t <= n:
        return [f"tlru needs threshold > next_prompt_estimate (both in tokens), got threshold={t} and "
                f"next_prompt_estimate={n}; otherwise no prefix is ever protected and tlru equals lru"]
    return []


register_policy_params("lru", {})
register_policy_params("lfu", {})
register_policy_params("fifo", {})
register_policy_params("priority", {})
register_policy_params("slru", {"protected_threshold": (_int_ge(1), "hits before a prefix is protected (integer >= 1)")})
register_policy_params("tlru", {
    "threshold": (_number_ge(0), "tokens of a request that must stay cached (>= 0)"),
    "next_prompt_estimate": (_number_ge(0), "expected tokens of the next prompt (>= 0, below threshold)"),
}, _tlru_check)


def known_policies() -> List[str]:
    return list(_PARAMS)


def validate_policy_config(policy: str, cfg: Any) -> List[str]:
    """Error texts for ``cfg`` as keyword arguments of ``policy`` (empty list: fine)."""
    try:  # the cache package may declare more policies and parameters
        import sglang_hydra.cache.policies  # noqa: F401
    except ImportError:
        pass
    if cfg is None:
        cfg = {}
    if not isinstance(cfg, dict):
        return [f"must be a JSON object of keyword arguments for policy {policy!r}, got {type(cfg).__name__}"]
    params = _PARAMS.get(policy)
    if params is None:
        return []  # unknown policies are rejected by the choices check
    errors = []
    for k, v in cfg.items():
        if k not in params:
            allowed = ", ".join(params) if params else "no parameters"
            errors.append(f"policy {policy!r} has no parameter {k!r} (it takes: {allowed})")
            continue
        msg = params[k][0](v)
        if msg:
            errors.append(f"parameter {k!r} of policy {policy!r} {msg}")
    if not errors and policy in _VALIDATORS:
        errors += _VALIDATORS[policy](cfg)
    return errors
