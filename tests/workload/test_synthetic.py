"""Synthetic multi-turn generator: determinism, format validity, prefix sharing."""
from sglang_hydra.config.testing import make_record
from sglang_hydra.workload import SyntheticConfig, generate_conversations, replay
from sglang_hydra.workload.trace import parse_line


def test_deterministic_and_seed_sensitive():
    a = generate_conversations(conversations=40, seed=3)
    b = generate_conversations(SyntheticConfig(conversations=40, seed=3))
    c = generate_conversations(conversations=40, seed=4)
    assert a == b and a != c


def test_requests_are_valid_trace_lines_and_sorted():
    reqs = generate_conversations(conversations=60, seed=1, prefix_groups=3)
    ts = [r.timestamp for r in reqs]
    assert ts == sorted(ts)
    for i, r in enumerate(reqs, start=1):
        back = parse_line(r.to_json(), i)
        assert back.hash_ids == r.hash_ids and back.input_length == r.input_length


def test_turns_extend_history_and_groups_share_system_prompt():
    cfg = SyntheticConfig(conversations=6, min_turns=3, max_turns=3, system_prompt_tokens=1536,
                          prefix_groups=2, seed=7)
    reqs = generate_conversations(cfg)
    assert len(reqs) == 18
    by_conv = {}
    for r in reqs:
        by_conv.setdefault(r.conversation, []).append(r)
    for conv, turns in by_conv.items():
        for prev, nxt in zip(turns, turns[1:]):
            full = prev.input_length // 512
            assert nxt.hash_ids[:full] == prev.hash_ids[:full]
            assert nxt.input_length > prev.input_length
    firsts = {c: t[0].hash_ids[:3] for c, t in by_conv.items()}
    assert firsts[0] == firsts[2] == firsts[4]
    assert firsts[1] == firsts[3] and firsts[0] != firsts[1]


def test_replay_on_synthetic_hits_history():
    reqs = generate_conversations(conversations=30, min_turns=2, max_turns=4, seed=2)
    res = replay(make_record(page_size=512, max_total_tokens=10_000 * 512), reqs, policy="lru")
    assert res.block_hit_rate > 0.3 and res.requests == len(reqs)
