"""Rules of the ``parallel`` namespace."""
from __future__ import annotations

from ..rulebook import Resolving, rule


@rule(1, "X-DP")
def fold_deprecated_dp_attention(cfg: Resolving) -> None:
    """The old --enable-dp-attention switch becomes attention data parallelism."""
    if cfg.enable_dp_attention and cfg.attn_dp_size == 1:
        cfg.declare(attn_dp_size=cfg.dp_size, dp_size=1)
    cfg.declare(enable_dp_attention=False)


@rule(1000, "X-DP")
def report_dp_attention(cfg: Resolving) -> None:
    """The resolved record reports the deprecated switch as "attention DP runs", the way the
    engine's resolved config does (width above one, not the elastic joiner's case), so that
    feeding a printed record back in folds nothing and resolves the same layout."""
    cfg.declare(enable_dp_attention=cfg.attn_dp_size > 1)
