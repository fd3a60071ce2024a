"""Prefix cache: the weighted radix tree, eviction policies, and the tiered cache (device,
host, storage) over that one tree with a counting mover.

Pure Python; imports neither torch nor Hydra (the real-bytes mover, ``bytes_mover``, and the
storage backends import torch and are imported on their own).
"""
from .policies import (
    EvictionPolicy,
    Param,
    PolicyInfo,
    available_policies,
    get_policy_info,
    make_policy,
    register_eviction_policy,
    validate_policy_config,
)
from . import hit_density  # noqa: F401  (registers the "hit_density" eviction policy)
from .movers import CountingMover, storage_page_key
from .radix import MatchResult, RadixTree, TreeNode, block_page_keys, chained_page_keys
from .tiered import TieredCache

__all__ = [
    "EvictionPolicy", "Param", "PolicyInfo", "available_policies", "get_policy_info",
    "make_policy", "register_eviction_policy", "validate_policy_config",
    "MatchResult", "RadixTree", "TreeNode", "block_page_keys", "chained_page_keys",
    "TieredCache", "CountingMover", "storage_page_key",
]
