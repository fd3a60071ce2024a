"""One static batch, the way a datasheet (and aiconfigurator's ``static`` mode) states it.

``batch_size`` requests arrive together, each with ``isl`` prompt tokens of which ``prefix``
are already cached; the engine prefills them all, then decodes ``osl`` tokens for every
request in lock step.  TTFT is the whole batch's prefill (every request gets its first
token when the last chunk ends); TPOT is the mean decode step while the contexts grow from
``isl`` to ``isl + osl``.  Pure arithmetic over :class:`~sglang_hydra.perf.pass_time.PassModel`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from .pass_time import PassModel

__all__ = ["StaticBatch", "static_batch", "prefill_chunks"]


@dataclass(frozen=True)
class StaticBatch:
    ttft_s: float
    tpot_s: float
    prefill_passes: int
    decode_steps: int

    @property
    def request_s(self) -> float:
        """Time until a request's last token: the prefill, then every decode step but the
        first token's (which the prefill produced)."""
        return self.ttft_s + self.tpot_s * max(0, self.decode_steps)


def prefill_chunks(batch_size: int, isl: int, prefix: int, chunk_tokens: Optional[int]
                   ) -> List[Tuple[int, int, int]]:
    """The prefill passes of the batch as (new tokens, causal pairs, sequences in the pass).

    SGLang's chunked prefill fills each pass with up to ``chunk_tokens`` new tokens, taking
    the requests in order and splitting the one that does not fit; ``None``: one pass."""
    new_per_seq = isl - prefix
    if new_per_seq < 1:                         # the last token is always computed
        new_per_seq, prefix = 1, isl - 1
    if not chunk_tokens:
        pairs = batch_size * PassModel.attn_pairs(prefix, new_per_seq)
        return [(batch_size * new_per_seq, pairs, batch_size)]
    passes = []
    cur_new = cur_pairs = cur_seqs = 0
    for _ in range(batch_size):
        done = 0
        while done < new_per_seq:
            n = min(chunk_tokens - cur_new, new_per_seq - done)
            cur_pairs += PassModel.attn_pairs(prefix + done, n)
            cur_new += n
            done += n
            if done == new_per_seq:
                cur_seqs += 1           # its last token is in this pass: one LM-head row
            if cur_new == chunk_tokens:
                passes.append((cur_new, cur_pairs, cur_seqs))
                cur_new = cur_pairs = cur_seqs = 0
    if cur_new:
        passes.append((cur_new, cur_pairs, cur_seqs))
    return passes


def static_batch(model: PassModel, *, isl: int, osl: int, batch_size: int, prefix: int = 0,
                 chunk_tokens: Optional[int] = None) -> StaticBatch:
    """TTFT and mean TPOT (seconds) of one static batch on ``model``."""
    passes = prefill_chunks(batch_size, isl, prefix, chunk_tokens)
    ttft = sum(model.step_s(n, pairs, 0, 0, seqs) for n, pairs, seqs in passes)
    steps = max(0, osl - 1)         # the prefill produced the first output token
    step_s = model.step_s
    total = 0.0
    for k in range(1, steps + 1):   # step k reads the prompt and the k tokens generated so far
        total += step_s(batch_size, 0, batch_size, batch_size * (isl + k))
    tpot = total / steps if steps else step_s(batch_size, 0, batch_size, batch_size * (isl + 1))
    return StaticBatch(ttft_s=ttft, tpot_s=tpot, prefill_passes=len(passes), decode_steps=steps)
