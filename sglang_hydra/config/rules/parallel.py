"""Rules of the ``parallel`` namespace."""
from __future__ import annotations

from ..rulebook import Resolving, rule


@rule(1, "X-DP")
def fold_deprecated_dp_attention(cfg: Resolving) -> None:
    """The old --enable-dp-attention switch becomes attention data parallelism."""
    if cfg.enable_dp_attention and cfg.attn_dp_size == 1:
        cfg.declare(attn_dp_size=cfg.dp_size, dp_size=1)
    cfg.declare(enable_dp_attention=False)
