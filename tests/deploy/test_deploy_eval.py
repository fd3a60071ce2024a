"""The deployment search's candidates, run through the workload simulation (the one simulator)."""
import dataclasses

import pytest

from sglang_hydra.jobs.deploy_eval import Plan, Sla, evaluate, meets, shortfall
from sglang_hydra.jobs.deploy_search import (Candidate, _Engines, base_rate, enumerate_candidates, evaluate_all,
                                             rate_search)
from sglang_hydra.workload.assemble import build_deployment
from sglang_hydra.workload.deployment import GiveUp, simulate
from sglang_hydra.workload.metrics import summarize_simulation
from sglang_hydra.workload.trace import Request


@pytest.fixture(scope="module")
def engines():
    from sglang_hydra.config.compose import compose
    rec, comp = compose(["model=llama3_1_8b", "hardware=h100_80gb"])
    return _Engines(rec, comp.hardware)


def steady(n, gap_ms, isl=2048, osl=64, shared=0):
    """``n`` requests ``gap_ms`` apart; the first ``shared`` prompt blocks are common to all."""
    blocks = isl // 512
    return [Request(i * gap_ms, isl, osl, tuple(range(shared)) + tuple(10_000 + i * 100 + b
                                                                      for b in range(blocks - shared)))
            for i in range(n)]


def test_a_candidate_is_built_as_the_workload_deployment_with_its_choices(engines):
    agg = build_deployment(engines.plan(Candidate("agg", 3, 2, hicache_ratio=2.0, policy="lfu",
                                                  router_policy="round_robin", chunk=1024)).inputs)
    side = agg.sides["agg"]
    assert agg.model.mode == "agg" and agg.model.router_policy == "round_robin" and agg.model.gpus == 6
    assert side["servers"] == 3 and side["tp_size"] == 2 and side["chunk_tokens"] == 1024
    assert side["cache"]["eviction_policy"] == "lfu" and side["cache"]["hierarchical"]
    pd = build_deployment(engines.plan(Candidate("disagg", 2, 1, 1, 4)).inputs)
    assert pd.model.mode == "disagg" and pd.model.gpus == 6 and pd.model.transfer_backend == "mooncake"
    assert pd.sides["prefill"]["servers"] == 2 and pd.sides["decode"]["tp_size"] == 4
    assert pd.sides["decode"]["cache"] == {}          # decode servers keep no radix cache (SGLang's PD rule)


def test_the_figures_are_the_replay_simulations_own(engines):
    plan = engines.plan(Candidate("agg", 2, 1, router_policy="cache_aware"))
    reqs = steady(200, 50, shared=2)
    sla = Sla(1000, 50)
    m = evaluate(plan, reqs, sla)
    built = build_deployment(plan.inputs)
    doc = summarize_simulation(simulate(built.model, reqs), sla_ttft_ms=1000, sla_tpot_ms=50)
    assert m["ttft_p90_ms"] == doc["latency"]["ttft_p90_ms"] and m["tpot_p90_ms"] == doc["latency"]["tpot_p90_ms"]
    assert m["tokens_per_s_per_gpu"] == doc["throughput"]["tokens_per_s_per_gpu"] and m["token_hit_rate"] > 0.3
    assert m["status"] == "ok" and meets(m, sla) and shortfall(m, sla) <= 1


def test_disaggregated_ttft_adds_the_kv_transfer_and_a_decode_step(engines):
    reqs = steady(1, 1000, isl=8192, osl=8)
    sla = Sla(1000, 50)
    agg = evaluate(engines.plan(Candidate("agg", 1, 1)), reqs, sla)
    pd = evaluate(engines.plan(Candidate("disagg", 1, 1, 1, 1)), reqs, sla)
    assert pd["ttft_p50_ms"] > agg["ttft_p50_ms"] > 0


def test_a_request_no_pool_holds_rejects_the_deployment(engines):
    small = _Engines(dataclasses.replace(engines.record, max_total_tokens=3000), engines.hardware)
    m = evaluate(small.plan(Candidate("agg", 1, 1)), steady(3, 100, isl=4096), Sla(1000, 100))
    assert m["status"] == "rejected" and m["rejected_requests"] == 3 and not meets(m, Sla(1000, 100))


def test_give_up_stops_only_runs_that_cannot_meet_the_ttft_percentile(engines):
    model = build_deployment(engines.plan(Candidate("agg", 1, 1)).inputs).model
    flood = steady(600, 5, isl=8192, osl=32)                 # 200 prompts/s of 8k tokens on one GPU
    full = simulate(model, flood)
    stop = simulate(model, flood, give_up=GiveUp(ttft_s=1.0, late_allowed=60, wait_s=10.0))
    assert full.stopped_at_s is None and stop.stopped_at_s is not None
    assert sum(s.finish_s is not None for s in stop.requests) < len(flood)
    late = sum(1 for s in full.requests if s.first_token_s - s.arrival_s > 1.0)
    assert late > 60                                         # the full run misses the bound too
    light = steady(100, 500, isl=2048, osl=32)
    a = summarize_simulation(simulate(model, light), sla_ttft_ms=1000, sla_tpot_ms=50)
    run = simulate(model, light, give_up=GiveUp(ttft_s=1.0, late_allowed=10, wait_s=10.0))
    b = summarize_simulation(run, sla_ttft_ms=1000, sla_tpot_ms=50)
    assert run.stopped_at_s is None and a["latency"] == b["latency"]   # a run that may pass runs whole


def test_a_saturated_candidate_is_marked_and_misses_the_sla(engines):
    m = evaluate(engines.plan(Candidate("agg", 1, 1)), steady(600, 5, isl=8192, osl=32), Sla(1000, 50))
    assert m["status"] == "saturated" and not meets(m, Sla(1000, 50)) and shortfall(m, Sla(1000, 50)) >= 10


def test_results_do_not_depend_on_the_process_pool(engines):
    plans = [engines.plan(Candidate("agg", n, 1, router_policy="power_of_two")) for n in (1, 2, 3)]
    reqs = steady(150, 40, shared=1)
    sla = Sla(500, 50)
    assert evaluate_all(plans, reqs, sla, rate=False, processes=1) == evaluate_all(plans, reqs, sla, rate=False,
                                                                                    processes=2)


def test_rate_search_scales_the_arrivals_and_finds_more_for_more_replicas(engines):
    reqs = steady(120, 500, isl=4096, osl=64)
    assert base_rate(reqs, "as_is", 0.5) == pytest.approx(2 * base_rate(reqs, "as_is", 1.0))
    sla = Sla(1000, 50)
    one = rate_search(engines.plan(Candidate("agg", 1, 1)), reqs, sla, arrival="as_is")
    two = rate_search(engines.plan(Candidate("agg", 2, 1, router_policy="round_robin")), reqs, sla, arrival="as_is")
    assert 0 < one["rate_rps"] < two["rate_rps"]
    assert meets(one, sla) and one["rate_rps"] == pytest.approx(base_rate(reqs, "as_is") * one["rate_factor"])


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
    assert isinstance(_plan_of(Candidate("agg", 2, 2)), Plan)


def _plan_of(c):
    from sglang_hydra.config.compose import compose
    rec, comp = compose(["model=llama3_1_8b", "hardware=h100_80gb"])
    return _Engines(rec, comp.hardware).plan(c)


def test_an_error_that_is_not_infeasibility_propagates(engines, monkeypatch):
    """Only a request no pool holds is a rejected row; any other ValueError of the simulation is a bug
    or an unmodelled setting and must reach the user (it used to become a row of zeros)."""
    import sglang_hydra.workload.deployment as deployment

    def broken(*args, **kwargs):
        raise ValueError("a bug in the simulation")

    monkeypatch.setattr(deployment, "simulate", broken)
    with pytest.raises(ValueError, match="a bug in the simulation"):
        evaluate(engines.plan(Candidate("agg", 1, 1)), steady(3, 100), Sla(1000, 100))
