"""job=replay under ``cache_semantics=sglang`` follows SGLang 0.5.23's scheduler (docs/whatif.md,
"Follows the engine"): one test per difference found, on the loop the command line runs
(``build_deployment`` + ``simulate``).  The per-request identity with SGLang itself is
tests/cache/test_engine_radix_differential.py (reference venv)."""
import pytest

from sglang_hydra.config.compose import compose_record
from sglang_hydra.config.hardware import compose_hardware
from sglang_hydra.workload.assemble import DeploymentInputs, build_deployment
from sglang_hydra.workload.deployment import simulate
from sglang_hydra.workload.trace import Request, load_trace, trace_path


def run(reqs, *, ps=16, pool=200000, chunk=None, policy="lru", arrival="sequential", extra=()):
    rec = compose_record(["model=llama3_1_8b", f"schedule.page_size={ps}", f"schedule.max_total_tokens={pool}",
                          f"schedule.chunked_prefill_size={chunk or -1}", f"memory.radix_eviction_policy={policy}",
                          *extra])
    hw, problems = compose_hardware("h100_80gb", [])
    assert not problems
    built = build_deployment(DeploymentInputs(hardware=hw, record=rec, cache_mode="device_only", cache_semantics="sglang"))
    try:
        sim = simulate(built.model, reqs, arrival=arrival)
    finally:
        built.close()
    return sim, sim.engines["agg"][0]


def prompt(length, first=1, output=1, t=0.0):
    blocks = -(-length // 512)
    return Request(t, length, output, tuple(range(first, first + blocks)))


def test_a_repeated_prompt_hits_len_minus_one_rounded_down_to_a_page():
    """The real server on this CPU: a repeated 2,752-token prompt (page 16) reports 2,736 cached."""
    sim, _ = run([prompt(2752), prompt(2752, t=1.0)])
    assert [s.device_hit for s in sim.requests] == [0, 2736]
    sim, _ = run([prompt(2752), prompt(2752, t=1.0)], ps=1)
    assert sim.requests[1].device_hit == 2751            # page 1: only the last token is recomputed


def test_partial_pages_are_never_keyed():
    sim, e = run([prompt(100)])
    assert e.cache.size == 100 // 16                     # 6 whole pages; the 7th (4 tokens) is not kept
    sim, _ = run([prompt(100), prompt(600, t=1.0)])      # same first block, longer
    assert sim.requests[1].device_hit == 96


def test_generated_tokens_enter_the_tree_at_finish_keyed_by_the_prompt():
    """kv_committed_len at finish is len + output - 1; it is inserted page-aligned.  A greedy
    engine answers the same prompt with the same tokens, so a repeat adds no pages."""
    sim, e = run([prompt(2752, output=40)])
    assert e.cache.size == (2752 + 40 - 1) // 16
    sim, e = run([prompt(2752, output=40), prompt(2752, output=40, t=1.0)])
    assert e.cache.size == (2752 + 40 - 1) // 16
    sim, e = run([prompt(2752, output=40), prompt(2752, first=100, output=40, t=1.0)])
    assert e.cache.size == 2 * ((2752 + 40 - 1) // 16)


def test_a_chunked_prompt_is_inserted_chunk_by_chunk():
    """checkpoint_kv_cache after every chunk: one tree node per chunk (eviction is per node)."""
    _, e = run([prompt(2752, output=20)], chunk=1024)
    segs = {n.seg for n in e.cache.iter_nodes()}
    assert len(segs) == 4                # chunks end at 1,024 / 2,048 / 2,752, then the output page
    _, e = run([prompt(2752, output=20)])
    assert len({n.seg for n in e.cache.iter_nodes()}) == 2


def test_the_clock_ticks_where_the_engine_reads_it():
    """time.monotonic() in SGLang: the waiting-prefix touch (1), the match (1), the checkpoint
    after the prefill (insert 1 + new node 2 + re-match 1), the finish (insert 1 + new node 2 +
    the prompt's re-insert 1 + re-match 1); decode steps and evictions read nothing."""
    _, e = run([prompt(2752, output=40)])
    assert e.cache.now == 11
    _, e = run([prompt(2752, output=400)])
    assert e.cache.now == 11


def test_lru_refreshes_waiting_prefixes_every_32nd_scheduling_call(monkeypatch):
    from sglang_hydra.cache.radix import RadixTree

    seen = []
    real = RadixTree.engine_touch
    monkeypatch.setattr(RadixTree, "engine_touch", lambda self, *a: (seen.append(a[2]), real(self, *a)))
    run([prompt(700, first=10 * i, t=float(i)) for i in range(40)])
    assert seen == [700 // 16, 700 // 16]                   # calls 0 and 32, the whole prompt
    seen.clear()
    run([prompt(700, first=10 * i, t=float(i)) for i in range(40)], policy="lfu")
    assert seen == []


def test_sequential_arrivals_wait_for_the_previous_answer():
    sim, _ = run([prompt(700, first=10 * i, output=20) for i in range(5)])
    reqs = sim.requests
    for a, b in zip(reqs, reqs[1:]):
        assert b.arrival_s == a.finish_s and b.first_token_s > a.finish_s


@pytest.mark.parametrize("ps,pool,extra", [(16, 150000, ()), (1, 120000, ()), (16, 120000, ("parallel.dp_size=2",))])
def test_concurrent_runs_keep_one_pool(ps, pool, extra):
    """Under load the tree and the running requests share the pool: at the end every request has
    finished, none holds a page, the tree fits the pool, and no hit exceeds len - 1 tokens."""
    reqs = [r for r in list(load_trace(trace_path("conversation")))[:1500] if r.input_length + 1 <= pool]
    sim, _ = run(reqs, ps=ps, pool=pool, arrival="spread", extra=extra)
    assert all(s.finish_s is not None for s in sim.requests)
    assert sum(s.device_hit for s in sim.requests) > 0
    for e in sim.engines["agg"]:
        assert e.private == 0 and 0 < e.cache.size <= e.pool_pages
    assert all(s.device_hit <= (s.input_len - 1) // ps * ps for s in sim.requests)


def test_the_real_servers_hit_rate_on_the_conversation_trace():
    """A real SGLang 0.5.23 server on CPU (docs/whatif.md), one request at a time: the first 400
    conversation requests of at most 12,288 tokens, outputs capped at 8, page 16, a 60,000-token
    pool: sum(cached_tokens) / sum(prompt tokens) = 0.1006497."""
    import dataclasses

    reqs = [r for r in load_trace(trace_path("conversation")) if r.input_length <= 12288][:400]
    reqs = [dataclasses.replace(r, output_length=min(r.output_length, 8)) for r in reqs]
    sim, _ = run(reqs, ps=16, pool=60000, chunk=4096)
    hit, total = sum(s.device_hit for s in sim.requests), sum(s.input_len for s in sim.requests)
    assert round(hit / total, 7) == 0.1006497
