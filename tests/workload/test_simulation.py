"""The deployment simulation on hand-computable traces (a linear toy pass model, exact answers)."""
import pytest

from sglang_hydra.cache.movers import CountingMover
from sglang_hydra.cache.policies import make_policy
from sglang_hydra.cache.tiered import TieredCache
from sglang_hydra.workload.arrivals import arrival_times, trace_tick_ms
from sglang_hydra.workload.deployment import DeploymentModel, ServerGroup, simulate
from sglang_hydra.workload.engine import EngineSpec
from sglang_hydra.workload.metrics import flatten_metrics, summarize_simulation, weighted_quantile
from sglang_hydra.workload.router import Router
from sglang_hydra.workload.trace import Request
from sglang_hydra.workload.transfer import LINK_EFFICIENCY, link_efficiency, link_for


class ToyPass:
    """1 ms per pass + 10 us per computed token + 1 ns per decode KV token; attention free."""

    @staticmethod
    def attn_pairs(cached, new):
        return 0

    def step_s(self, new_tokens, pairs, decode_seqs, decode_kv_tokens, prefill_seqs=None):
        return 1e-3 + 1e-5 * new_tokens + 1e-9 * decode_kv_tokens


def req(t_ms, inp, out, ids=None):
    ids = ids if ids is not None else tuple(range(t_ms * 1000, t_ms * 1000 + -(-inp // 512)))
    return Request(float(t_ms), inp, out, tuple(ids))


def spec(**kw):
    base = dict(pass_model=ToyPass(), pool_tokens=1_000_000, max_running=64, chunk_tokens=None,
                max_prefill_tokens=1_000_000, gpus=1, layers=1, kv_bytes_per_token=1000.0)
    base.update(kw)
    return EngineSpec(**base)


def agg(s=None, *, dp=1, servers=1, lb="round_robin", router="round_robin", cache=False):
    s = s or spec()
    make = (lambda: TieredCache(CountingMover(s.pool_tokens), policy=make_policy("lru", None), page_size=1,
                                hierarchical=False)) if cache else None
    g = ServerGroup("agg", s, servers=servers, dp=dp, load_balance=lb, make_cache=make, page_size=1)
    return DeploymentModel("agg", {"agg": g}, router_policy=router)


def test_one_request_alone_ttft_is_its_prefill_pass_and_decode_follows():
    r = simulate(agg(), [req(0, 1000, 5)], arrival="as_is")
    s = r.requests[0]
    prefill = 1e-3 + 1e-5 * 1000
    assert s.first_token_s == pytest.approx(prefill)
    assert r.unloaded_ttft_s[0] == pytest.approx(prefill)
    # four decode passes for tokens 2..5, each reading the growing context
    decode = sum(1e-3 + 1e-5 + 1e-9 * (1001 + i) for i in range(4))
    assert s.finish_s == pytest.approx(prefill + decode)
    m = summarize_simulation(r, sla_ttft_ms=1000, sla_tpot_ms=100)
    assert m["latency"]["ttft_p50_ms"] == pytest.approx(prefill * 1000)
    assert m["latency"]["ttft_unloaded_p90_ms"] == pytest.approx(prefill * 1000)
    assert m["throughput"]["goodput_rps_per_gpu"] > 0 and m["requests"]["requests_completed"] == 1


def test_two_simultaneous_requests_on_dp2_round_robin_take_one_engine_each():
    reqs = [req(0, 2000, 3), req(0, 2000, 3)]
    r = simulate(agg(dp=2), reqs, arrival="as_is")
    a, b = r.requests
    assert a.engine is not b.engine
    assert a.first_token_s == pytest.approx(b.first_token_s) == pytest.approx(1e-3 + 1e-5 * 2000)
    # on one engine they share one prefill pass (one batch of 4000 tokens): later for both
    one = simulate(agg(dp=1), reqs, arrival="as_is")
    assert one.requests[0].first_token_s == pytest.approx(1e-3 + 1e-5 * 4000)


def test_chunked_prefill_splits_a_long_prompt_into_passes():
    r = simulate(agg(spec(chunk_tokens=4096)), [req(0, 10_000, 1)], arrival="as_is")
    e = r.engines["agg"][0]
    assert e.prefill_passes == 3
    assert r.requests[0].first_token_s == pytest.approx(3e-3 + 1e-5 * 10_000)


def test_max_running_requests_queues_the_rest():
    reqs = [req(0, 100, 50) for _ in range(4)]
    r = simulate(agg(spec(max_running=2)), reqs, arrival="as_is")
    firsts = sorted(s.first_token_s for s in r.requests)
    assert firsts[2] > firsts[1] + 40e-3     # the third waits for a finish (49 decode passes)


def test_a_full_pool_retracts_and_every_request_still_finishes():
    # the pool holds both prompts and the 0.7 x output reservation, but not all 400 outputs
    reqs = [req(0, 1000, 400), req(0, 1000, 400)]
    r = simulate(agg(spec(pool_tokens=2600)), reqs, arrival="as_is")
    e = r.engines["agg"][0]
    assert e.retracted >= 1
    assert all(s.finish_s is not None and s.decoded == 400 for s in r.requests)
    assert e.used == 0


def test_pd_transfer_time_scales_with_the_backend():
    def pd(backend):
        g_p = ServerGroup("prefill", spec(kv_bytes_per_token=128 * 1024), load_balance="round_robin")
        g_d = ServerGroup("decode", spec(kv_bytes_per_token=128 * 1024), load_balance="round_robin")
        m = DeploymentModel("disagg", {"prefill": g_p, "decode": g_d}, router_policy="round_robin",
                            transfer_backend=backend, nvlink_gbps=450, nic_gbps=50, gpus_per_node=1)
        return simulate(m, [req(0, 8000, 4)], arrival="as_is").requests[0]
    nixl, zmq = pd("nixl"), pd("zmq")
    nbytes = 8000 * 128 * 1024
    # one GPU per node: the KV crosses the 50 GB/s NICs (NIXL 0.85 and TCP 0.10 of a 400 Gb/s NIC)
    assert nixl.transfer_s == pytest.approx(0.9e-3 + nbytes / (50e9 * 0.85))
    assert zmq.transfer_s == pytest.approx(nbytes / (50e9 * 0.10))
    # TTFT = prefill + transfer + the first decode step
    first_decode = 1e-3 + 1e-5 + 1e-9 * 8000
    assert zmq.first_token_s == pytest.approx(1e-3 + 1e-5 * 8000 + zmq.transfer_s + first_decode)
    assert zmq.first_token_s > nixl.first_token_s


def test_link_efficiency_is_the_measurement_at_the_nearest_nic_rate():
    assert link_efficiency("mooncake", "nic", 50) == 0.475 and link_efficiency("mooncake", "nic", 25) == 0.87
    assert link_efficiency("mooncake", "nic", 12.5) == 0.87 and link_efficiency("zmq", "nic", 100) == 0.10
    assert link_efficiency("nixl", "nvlink", 450) == 0.84
    # every figure is a share of its medium, below the line rate
    assert all(0 < eff < 1 for media in LINK_EFFICIENCY.values() for pts in media.values() for _, eff in pts)
    nv = link_for("nixl", same_node=True, lanes=2, nvlink_gbps=450, nic_gbps=50)
    assert nv.bytes_per_s == pytest.approx(2 * 450e9 * 0.84)


def test_link_uses_nvlink_on_one_node_only_for_nixl():
    assert link_for("nixl", same_node=True, lanes=2, nvlink_gbps=450, nic_gbps=50).medium == "nvlink"
    assert link_for("zmq", same_node=True, lanes=2, nvlink_gbps=450, nic_gbps=50).medium == "nic"
    # SGLang's Mooncake backend runs MOONCAKE_PROTOCOL=rdma unless a custom NVLink memory pool is set
    assert link_for("mooncake", same_node=True, lanes=2, nvlink_gbps=450, nic_gbps=50).medium == "nic"
    with pytest.raises(ValueError, match="disaggregation_transfer_backend"):
        link_for("tcp", same_node=False, lanes=1, nvlink_gbps=1, nic_gbps=1)


def test_cache_aware_router_keeps_a_conversation_on_its_server():
    router = Router(4, "cache_aware", __import__("random").Random(0))
    turn1 = type("R", (), {"hash_ids": (1, 2, 3), "input_len": 1536})()
    turn2 = type("R", (), {"hash_ids": (1, 2, 3, 4), "input_len": 2048})()
    first = router.pick(turn1, 0.0)
    router.done(first)
    assert router.pick(turn2, 1.0) == first and router.cache_routed == 1


def test_round_robin_router_alternates():
    router = Router(3, "round_robin", __import__("random").Random(0))
    assert [router.pick(None, 0.0) for _ in range(4)] == [0, 1, 2, 0]


def test_arrivals_spread_within_the_tick_and_are_seeded():
    ts = [0, 0, 0, 3000, 3000, 6000]
    assert trace_tick_ms(ts) == 3000
    a = arrival_times(ts, how="spread", seed=1)
    assert all(t <= x < t + 3 for t, x in zip([0, 0, 0, 3, 3, 6], a))
    assert a == arrival_times(ts, how="spread", seed=1) != arrival_times(ts, how="spread", seed=2)
    assert arrival_times(ts, how="as_is", time_scale=2) == [0, 0, 0, 6, 6, 12]
    p = arrival_times(ts, how="poisson", seed=0)
    assert len(set(p)) == len(p)
    with pytest.raises(ValueError, match="time_scale"):
        arrival_times(ts, time_scale=0)


def test_the_prefix_cache_makes_a_repeated_prompt_cheaper():
    ids = tuple(range(20))
    reqs = [req(0, 10_000, 1, ids), req(5000, 10_000, 1, ids)]
    r = simulate(agg(cache=True), reqs, arrival="as_is")
    a, b = r.requests
    assert a.device_hit == 0 and b.device_hit >= 9_999
    assert (b.first_token_s - b.arrival_s) < (a.first_token_s - a.arrival_s) / 10


def test_flatten_metrics_names_every_leaf_once():
    assert flatten_metrics({"a": {"x_ms": 1, "b": {"y": 2}}, "l": [1]}) == {"x_ms": 1, "y": 2, "l": [1]}
    with pytest.raises(ValueError, match="twice"):
        flatten_metrics({"a": {"x": 1}, "b": {"x": 2}})
    assert weighted_quantile([1.0, 2.0], [9, 1], 0.9) == 1.0 and weighted_quantile([1.0, 2.0], [9, 1], 0.99) == 2.0


def test_pd_decode_pool_admits_a_long_request_alone_and_queues_the_rest():
    g_p = ServerGroup("prefill", spec(), load_balance="round_robin")
    g_d = ServerGroup("decode", spec(pool_tokens=3000), load_balance="round_robin")
    m = DeploymentModel("disagg", {"prefill": g_p, "decode": g_d}, router_policy="round_robin",
                        transfer_backend="nixl", nvlink_gbps=450, nic_gbps=50, gpus_per_node=8)
    # 2,500 prompt tokens + 0.7 x 2,000 reserved exceed the pool: admitted only alone, one after the other
    r = simulate(m, [req(0, 2500, 2000), req(0, 2500, 2000)], arrival="as_is")
    a, b = sorted(r.requests, key=lambda s: s.first_token_s)
    assert a.finish_s is not None and b.finish_s is not None
    assert b.first_token_s > a.finish_s                 # the second waited for the first to leave the pool
    assert r.engines["decode"][0].used == 0


def test_results_never_depend_on_the_wall_clock(monkeypatch):
    import time as _time
    reqs = [req(i * 100, 3000, 20) for i in range(30)]
    a = simulate(agg(dp=2, lb="total_tokens"), reqs, seed=3)
    monkeypatch.setattr(_time, "perf_counter", lambda: 12345.0)
    b = simulate(agg(dp=2, lb="total_tokens"), reqs, seed=3)
    assert [s.first_token_s for s in a.requests] == [s.first_token_s for s in b.requests]
    assert [s.finish_s for s in a.requests] == [s.finish_s for s in b.requests]
