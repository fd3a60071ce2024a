"""The real client (jobs/engine_client.py) against a streaming test double of /generate."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglang_hydra.jobs.engine_client import Planned, flush_cache, run_requests
from sglang_hydra.utils.ports import free_port

sys.path.insert(0, str(Path(__file__).parent))
from fake_engine import started  # noqa: E402


@pytest.fixture
def engine():
    with started("--prefill-ms", "20", "--decode-ms", "10", "--weight-version", "agg3") as url:
        yield url


def test_every_token_is_timed_and_the_servers_words_are_kept(engine):
    m = run_requests(engine, [Planned(0, list(range(100, 140)), 5)])[0]
    assert m.ok and m.error is None
    assert len(m.token_times_s) == 5 and m.completion_tokens == 5 and m.prompt_tokens == 40
    assert m.token_times_s == sorted(m.token_times_s)
    assert m.sent_s < m.first_token_s <= m.finish_s
    assert m.weight_version == "agg3"
    # the first token waits for the prefill, each later one for a decode step: the gaps show it
    gaps = [b - a for a, b in zip(m.token_times_s, m.token_times_s[1:])]
    assert min(gaps) > 0


def test_cached_tokens_and_flush(engine):
    prompt = list(range(1000, 1040))      # 40 tokens: two whole 16-token pages and a partial one
    first, again = run_requests(engine, [Planned(0, prompt, 1), Planned(1, prompt, 1)])
    assert first.cached_tokens == 0 and again.cached_tokens == 32
    flush_cache(engine)
    assert run_requests(engine, [Planned(2, prompt, 1)])[0].cached_tokens == 0


def test_sequential_pacing_never_overlaps_and_scheduled_pacing_does(engine):
    plan = [Planned(i, [i + 50] * 20, 4, send_at_s=0.0) for i in range(4)]
    seq = run_requests(engine, plan, pacing="sequential")
    assert all(b.sent_s >= a.finish_s for a, b in zip(seq, seq[1:]))
    together = run_requests(engine, plan, pacing="scheduled")
    # sent together, served one at a time by the double: someone waits for another's whole request
    assert max(m.sent_s for m in together) < min(m.finish_s for m in together)
    assert [m.index for m in together] == [0, 1, 2, 3]


def test_an_unreachable_server_is_an_error_per_request():
    port = free_port()
    got = run_requests(f"http://127.0.0.1:{port}", [Planned(0, [1, 2, 3], 2)], timeout=2)
    assert not got[0].ok and "Error" in got[0].error


def test_a_stop_leaves_the_rest_unsent(engine):
    import threading
    stop = threading.Event()
    stop.set()
    got = run_requests(engine, [Planned(i, [9] * 20, 1, send_at_s=0.0) for i in range(3)], pacing="scheduled",
                       stop=stop)
    assert [m.error for m in got] == ["not sent"] * 3
