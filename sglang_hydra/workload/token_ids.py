"""Token ids for a trace request, made from its block hashes, so a real engine sees the sharing
the trace describes.

A Mooncake trace gives each request a list of ``hash_ids``, one per ``block_size`` tokens of the
prompt (the last block may be partial); two requests share a block exactly when they share its
hash id at the same position.  The prompt sent to an engine is the concatenation of one token
sequence per block: each block's tokens are drawn from a generator seeded by the block's hash
(and a salt), so the same hash gives the same tokens in every request and every run, a partial
block is a prefix of the full one, and different hashes give different tokens (a collision of
a whole 16-token page between two random sequences over a 32,000-token vocabulary is
vanishingly unlikely).  Nothing depends on Python's hash seed.
"""
from __future__ import annotations

import random
from typing import Dict, List, Sequence, Tuple

__all__ = ["TokenMaker"]

#: ids below this are left out: tokenizers put their special tokens (BOS, EOS, pad) there
FIRST_ORDINARY_ID = 16


class TokenMaker:
    """Makes (and remembers) each block's tokens for one vocabulary and block size."""

    def __init__(self, vocab_size: int, block_size: int = 512, salt: str = "sglang-hydra"):
        if vocab_size <= FIRST_ORDINARY_ID + 1:
            raise ValueError(f"model.vocab_size must exceed {FIRST_ORDINARY_ID + 1}, got {vocab_size}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.vocab_size = int(vocab_size)
        self.block_size = int(block_size)
        self.salt = salt
        self._blocks: Dict[int, Tuple[int, ...]] = {}

    def block(self, hash_id: int) -> Tuple[int, ...]:
        """The ``block_size`` tokens of the block with this hash."""
        got = self._blocks.get(hash_id)
        if got is None:
            rng = random.Random(f"{self.salt}:{self.block_size}:{hash_id}")
            lo, hi = FIRST_ORDINARY_ID, self.vocab_size - 1
            got = tuple(rng.randint(lo, hi) for _ in range(self.block_size))
            self._blocks[hash_id] = got
        return got

    def prompt(self, hash_ids: Sequence[int], input_length: int) -> List[int]:
        """The ``input_length`` prompt tokens of a request with these block hashes."""
        need = -(-int(input_length) // self.block_size)
        if len(hash_ids) < need:
            raise ValueError(f"{input_length} tokens need {need} block hashes, the request has {len(hash_ids)}")
        out: List[int] = []
        for h in hash_ids[:need]:
            out.extend(self.block(int(h)))
        return out[:int(input_length)]

    def unique(self, length: int, tag: int) -> List[int]:
        """``length`` tokens shared with no trace block (warm-up and calibration prompts)."""
        rng = random.Random(f"{self.salt}:unique:{tag}")
        return [rng.randint(FIRST_ORDINARY_ID, self.vocab_size - 1) for _ in range(int(length))]
