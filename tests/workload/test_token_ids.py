"""Token ids from block hashes: shared blocks share tokens, in every process."""
from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_hydra.workload.token_ids import FIRST_ORDINARY_ID, TokenMaker


def test_shared_hashes_share_tokens_and_partial_blocks_are_prefixes():
    mk = TokenMaker(32000, block_size=512)
    a = mk.prompt([11, 12, 13], 1300)
    b = mk.prompt([11, 12, 99], 1100)
    assert len(a) == 1300 and len(b) == 1100
    assert a[:1024] == b[:1024]                  # blocks 11 and 12
    assert a[1024:1100] != b[1024:1100]          # third blocks differ
    c = mk.prompt([11, 12, 13], 1536)
    assert c[:1300] == a                         # a partial block is a prefix of the whole one
    assert all(FIRST_ORDINARY_ID <= t < 32000 for t in c)


def test_too_few_hashes_and_bad_vocab_are_refused():
    mk = TokenMaker(32000, block_size=512)
    with pytest.raises(ValueError, match="block hashes"):
        mk.prompt([1], 600)
    with pytest.raises(ValueError, match="vocab_size"):
        TokenMaker(10)


def test_the_same_tokens_in_another_process_with_another_hash_seed():
    code = ("from sglang_hydra.workload.token_ids import TokenMaker;"
            "print(sum(TokenMaker(32000).prompt([5, 6], 700)))")
    runs = {subprocess.run([sys.executable, "-c", code], env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
                           capture_output=True, text=True, check=True).stdout for seed in ("1", "2")}
    assert runs == {f"{sum(TokenMaker(32000).prompt([5, 6], 700))}\n"}


def test_unique_prompts_share_nothing_with_the_trace_or_each_other():
    mk = TokenMaker(32000, block_size=16)
    u1, u2 = mk.unique(64, tag=1), mk.unique(64, tag=2)
    assert u1 != u2 and u1[:16] != mk.block(1)
