"""Deterministic multi-turn conversation workload in the Mooncake request format.

Each conversation opens with a system prompt shared by every conversation of its
*prefix group* (``prefix_groups`` groups, conversations assigned round-robin), then
alternates user messages and model replies.  Turn ``t``'s prompt is the whole history so
far plus a new user message, so consecutive turns of a conversation share every full
512-token block of the previous prompt, exactly like the real trace.

Block ids follow the trace convention: an id names a whole prefix.  A block that lies
entirely inside a group's system prompt is shared by the group; any other block belongs to
its conversation, and a partial block is additionally keyed by how many tokens it holds
(its content differs from the full block of the next turn).  Ids are assigned in order of
first appearance, starting at 0.

Arrivals: conversations start as a Poisson process of ``arrival_rate`` conversations per
second; the gap between a reply and the next user turn is exponential with mean
``think_time_s`` plus the reply's decode time at ``decode_tokens_per_s``.  Lengths are drawn
from exponential distributions with the given means (at least 1 token).  Everything comes
from one ``random.Random(seed)``, so a configuration always yields the same requests.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Dict, List, Tuple

from .trace import BLOCK_SIZE, Request

__all__ = ["SyntheticConfig", "generate_conversations"]


@dataclass(frozen=True)
class SyntheticConfig:
    conversations: int = 200
    min_turns: int = 1
    max_turns: int = 8
    system_prompt_tokens: int = 1024
    prefix_groups: int = 1
    user_tokens_mean: float = 300.0
    output_tokens_mean: float = 250.0
    arrival_rate: float = 2.0          # new conversations per second
    think_time_s: float = 30.0
    decode_tokens_per_s: float = 50.0
    block_size: int = BLOCK_SIZE
    seed: int = 0

    def check(self) -> None:
        if self.conversations < 0:
            raise ValueError("conversations must be >= 0")
        if not 1 <= self.min_turns <= self.max_turns:
            raise ValueError("need 1 <= min_turns <= max_turns")
        if self.system_prompt_tokens < 0 or self.prefix_groups < 1:
            raise ValueError("system_prompt_tokens must be >= 0 and prefix_groups >= 1")
        if self.user_tokens_mean <= 0 or self.output_tokens_mean <= 0:
            raise ValueError("length means must be positive")
        if self.arrival_rate <= 0 or self.think_time_s < 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("arrival_rate and decode_tokens_per_s must be positive, "
                             "think_time_s >= 0")
        if self.block_size <= 0:
            raise ValueError("block_size must be positive")


def _length(rng: random.Random, mean: float) -> int:
    return max(1, int(rng.expovariate(1.0 / mean)))


def generate_conversations(config: SyntheticConfig = None, **overrides) -> List[Request]:
    """Requests of all conversations, sorted by timestamp (ties keep generation order)."""
    if config is None:
        config = SyntheticConfig(**overrides)
    elif overrides:
        from dataclasses import replace

        config = replace(config, **overrides)
    config.check()
    rng = random.Random(config.seed)
    bs = config.block_size
    ids: Dict[Tuple, int] = {}

    def block_id(owner: Tuple, j: int, end: int) -> int:
        full = end == (j + 1) * bs
        key = (owner, j) if full else (owner, j, end)
        got = ids.get(key)
        if got is None:
            got = ids[key] = len(ids)
        return got

    pending: List[Tuple[float, int, Request]] = []
    order = 0
    start = 0.0
    sys_len = config.system_prompt_tokens
    for conv in range(config.conversations):
        start += rng.expovariate(config.arrival_rate)
        group = conv % config.prefix_groups
        turns = rng.randint(config.min_turns, config.max_turns)
        history = sys_len
        t = start
        for _turn in range(turns):
            prompt = history + _length(rng, config.user_tokens_mean)
            output = _length(rng, config.output_tokens_mean)
            n_blocks = -(-prompt // bs)
            hids = []
            for j in range(n_blocks):
                end = min((j + 1) * bs, prompt)
                owner = ("g", group) if end <= sys_len and end == (j + 1) * bs else ("c", conv)
                hids.append(block_id(owner, j, end))
            ts_ms = round(t * 1000.0, 3)
            pending.append((ts_ms, order, Request(ts_ms, prompt, output, tuple(hids),
                                                   0, conv)))
            order += 1
            history = prompt + output
            think = rng.expovariate(1.0 / config.think_time_s) if config.think_time_s > 0 else 0.0
            t += output / config.decode_tokens_per_s + think
    pending.sort(key=lambda x: (x[0], x[1]))
    return [p[2] for p in pending]
