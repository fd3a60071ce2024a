"""Prefix (radix) cache simulation: page-granular radix tree and eviction policies.

Pure Python; imports neither torch nor Hydra.
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
from .radix import MatchResult, RadixTree, TreeNode, block_page_keys, chained_page_keys

__all__ = [
    "EvictionPolicy", "Param", "PolicyInfo", "available_policies", "get_policy_info",
    "make_policy", "register_eviction_policy", "validate_policy_config",
    "MatchResult", "RadixTree", "TreeNode", "block_page_keys", "chained_page_keys",
]
