"""Prefix cache: the weighted radix tree, eviction policies, and the tiered cache (device,
host, storage) over that one tree with a counting mover.

Pure Python; imports neither torch nor Hydra (the real-bytes mover, ``bytes_mover``, and the
storage backends import torch and are imported on their own).  The names below load on first
use (PEP 562), so importing one module of this package (SGLang loading
:mod:`.sglang_plugin` in a server) loads no other.
"""
from __future__ import annotations

import importlib

_LAZY = {
    **{name: "policies" for name in ("EvictionPolicy", "Param", "PolicyInfo", "available_policies",
                                     "get_policy_info", "make_policy", "register_eviction_policy",
                                     "validate_policy_config")},
    **{name: "radix" for name in ("MatchResult", "RadixTree", "TreeNode", "block_page_keys", "chained_page_keys")},
    "TieredCache": "tiered",
    "CountingMover": "movers",
    "storage_page_key": "movers",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
