"""``spec``: speculative decoding settings that cache and PD rules depend on."""
from __future__ import annotations

from typing import Optional

from ..schema_snapshot import build_namespace
from ..spec import arg


class _SpecRules:
    speculative_algorithm: Optional[str] = arg(
        None, "Speculative decoding algorithm (EAGLE, EAGLE3, NEXTN, DSPARK, STANDALONE, NGRAM, DFLASH ...); "
        "upper-cased, NEXTN means EAGLE.")
    speculative_eagle_topk: Optional[int] = arg(None, "Draft branches per step.")
    speculative_num_draft_tokens: Optional[int] = arg(None, "Draft tokens verified per step.")
    speculative_draft_attention_backend: Optional[str] = arg(None, "Attention backend of the draft model.")


# Every reference field of the namespace; the class above names those with rules or our own defaults.
Spec = build_namespace("spec", _SpecRules)
