"""The deployment search's evaluator on hand-computable cases (a constant pass time)."""
import pytest

from sglang_hydra.jobs.deploy_eval import (BLOCK_TOKENS, EngineModel, Plan, Sla, TraceRequest, evaluate, meets,
                                           simulate)
from sglang_hydra.jobs.deploy_search import Candidate, enumerate_candidates, evaluate_all, rate_search

PASS_S = 0.01


def flat(new_tokens, attn_pairs, decode_seqs, decode_kv, prefill_seqs=None):
    """Every pass takes 10 ms, whatever it holds."""
    return PASS_S if new_tokens > 0 else 0.0


def engine(tp=1, kv=1_000_000, host=0, chunk=8192, radix=True, policy="lru", step=flat, mixed=False):
    return EngineModel(tp=tp, step_s=step, kv_tokens=kv, host_tokens=host, kv_bytes_per_token_rank=1000.0,
                       h2d_bytes_per_s=1e9, chunk_tokens=chunk, max_running=256, radix=radix,
                       eviction_policy=policy, mixed_chunk=mixed)


def req(t, isl=1024, osl=5, blocks=None):
    return TraceRequest(t, isl, osl, tuple(blocks if blocks is not None else range(int(t * 1000), int(t * 1000) + 2)))


def test_one_request_on_one_engine_is_one_prefill_pass_then_decode_steps():
    (r,) = simulate(Plan("agg", 1, engine()), [req(0.0, osl=5)])
    assert r.t_first == pytest.approx(PASS_S)                 # the prefill pass gives the first token
    assert r.t_done == pytest.approx(PASS_S * 5)              # then 4 decode steps


def test_a_long_prompt_is_chunked_over_several_passes():
    (r,) = simulate(Plan("agg", 1, engine(chunk=512)), [req(0.0, isl=2048, osl=1)])
    assert r.t_first == pytest.approx(4 * PASS_S) and r.t_done == r.t_first


def test_disaggregated_ttft_is_prefill_transfer_and_first_decode_step():
    plan = Plan("disagg", 1, engine(), 1, engine(radix=False), link_bytes_per_s=1e6)
    (r,) = simulate(plan, [req(0.0, isl=1000, osl=3)])
    transfer = 1000 * 1000.0 / 1e6                            # tokens x bytes per token / link
    assert r.t_first == pytest.approx(PASS_S + transfer + PASS_S)
    assert r.t_done == pytest.approx(PASS_S + transfer + 3 * PASS_S)


def test_requests_that_no_pool_holds_are_rejected_and_the_rest_served():
    m = evaluate(Plan("agg", 1, engine(kv=3000)), [req(0.0, isl=1000), req(0.1, isl=5000)], Sla(1000, 100))
    assert m["rejected_requests"] == 1 and m["requests"] == 2 and not meets(m, Sla(1000, 100))


def test_kv_admission_queues_what_does_not_fit():
    reqs = [req(0.0, isl=1000, osl=10), req(0.0, isl=1000, osl=10)]
    a, b = simulate(Plan("agg", 1, engine(kv=1500)), reqs)    # one at a time
    assert b.t_first >= a.t_done


def test_round_robin_spreads_and_cache_aware_keeps_a_prefix_on_one_worker():
    import random

    from sglang_hydra.jobs.deploy_eval import _Engine, _Req, _Router

    shared = [_Req(i, req(i * 1.0, blocks=[7, 8, 9, 100 + i])) for i in range(6)]

    def picks(policy):
        engines = [_Engine(i, engine(), "agg") for i in range(2)]
        router = _Router(engines, policy, random.Random(0))
        return [router.pick(r).idx for r in shared]

    assert picks("round_robin") == [0, 1, 0, 1, 0, 1]
    assert len(set(picks("cache_aware"))) == 1            # 3 of 4 blocks match: the same worker every time
    other = _Req(9, req(9.0, blocks=[50, 51, 52, 53]))
    engines = [_Engine(i, engine(), "agg") for i in range(2)]
    router = _Router(engines, "cache_aware", random.Random(0))
    first = router.pick(shared[0])
    first.outstanding += 1
    assert router.pick(other) is not first                 # no match: the least loaded worker


def test_hicache_hits_cost_a_host_copy_instead_of_compute():
    def by_tokens(new_tokens, *_a, **_k):
        return new_tokens * 1e-5
    blocks = list(range(8))
    warm, again = req(0.0, isl=8 * BLOCK_TOKENS, osl=1, blocks=blocks), req(10.0, isl=8 * BLOCK_TOKENS, osl=1, blocks=blocks)
    evict = req(5.0, isl=8 * BLOCK_TOKENS, osl=1, blocks=list(range(100, 108)))
    small = dict(kv=8 * BLOCK_TOKENS + 16, step=by_tokens)
    no_host = simulate(Plan("agg", 1, engine(**small)), [warm, evict, again])
    with_host = simulate(Plan("agg", 1, engine(host=16 * BLOCK_TOKENS, **small)), [warm, evict, again])
    assert with_host[2].t_first - 10.0 < no_host[2].t_first - 10.0      # the host tier kept the prompt


def test_results_do_not_depend_on_the_process_pool():
    plans = [Plan("agg", n, engine(), router_policy="power_of_two") for n in (1, 2, 3)]
    reqs = [req(i * 0.003, isl=2000, osl=20) for i in range(300)]
    sla = Sla(200, 50)
    assert evaluate_all(plans, reqs, sla, rate=False, processes=1) == evaluate_all(plans, reqs, sla, rate=False,
                                                                                    processes=2)


def test_rate_search_finds_a_higher_rate_for_more_replicas():
    reqs = [req(i * 0.1, isl=2000, osl=20) for i in range(200)]
    sla = Sla(100, 50)
    one = rate_search(Plan("agg", 1, engine()), reqs, sla)
    two = rate_search(Plan("agg", 2, engine()), reqs, sla)
    assert 0 < one["rate_rps"] < two["rate_rps"]
    assert meets(one, sla)


def test_candidates_fit_the_budget_and_vary_the_router_only_with_several_servers():
    space = {"modes": ["agg", "disagg"], "tp": [1, 2, 4, 8], "hicache_ratio": [0.0], "policies": ["lru"],
             "router_policies": ["round_robin", "cache_aware"]}
    cands = enumerate_candidates(8, 8, space)
    assert all(c.gpus <= 8 for c in cands)
    layouts = {(c.mode, c.workers, c.tp, c.decode_workers, c.decode_tp) for c in cands}
    assert len([l for l in layouts if l[0] == "agg"]) == 15 and len(layouts) == 86
    assert {c.router_policy for c in cands if c.workers == 1 and c.decode_workers <= 1} == {"round_robin"}
    assert len(enumerate_candidates(8, 8, space)) > len(layouts)
    full = enumerate_candidates(8, 8, {**space, "all_gpus": True})
    assert full and all(c.gpus == 8 for c in full)
    assert Candidate("agg", 4, 2).layout == "4 x TP2" and Candidate("disagg", 3, 1, 1, 4).layout == "3P TP1 + 1D TP4"
    assert not Candidate("agg", 1, 1, policy="ghost_lru").runnable and Candidate("agg", 1, 1).runnable
