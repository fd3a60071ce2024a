"""Every setting the simulation models moves its answer, the way it should (real records and presets)."""
import functools

import pytest

from sglang_hydra.config.compose import compose
from sglang_hydra.workload.assemble import DeploymentInputs, build_deployment
from sglang_hydra.workload.deployment import simulate
from sglang_hydra.workload.metrics import flatten_metrics, summarize_simulation
from sglang_hydra.workload.trace import load_trace, trace_path

BASE = ("model=llama3_1_8b", "hardware=h100_80gb")


@functools.lru_cache(maxsize=None)
def _trace(name="sample"):
    return load_trace(trace_path(name))   # sample: the bundled first 1,000 requests


@functools.lru_cache(maxsize=None)
def point(overrides=(), *, n=300, scale=1.0, mode="device_only", workers=1, router=None, pd=None,
          prefill=(), decode=(), pw=1, dw=1, trace="sample"):
    rec, composed = compose(list(BASE) + list(overrides))
    kw = dict(hardware=composed.hardware, workers=workers, router_policy=router, cache_mode=mode)
    if pd:
        pre, _ = compose(list(BASE) + list(overrides) + list(prefill))
        dec, _ = compose(list(BASE) + list(overrides) + list(decode))
        kw.update(prefill=pre, decode=dec, prefill_workers=pw, decode_workers=dw)
    else:
        kw["record"] = rec
    built = build_deployment(DeploymentInputs(**kw))
    reqs = [r for r in _trace(trace).requests[:n] if r.input_length + r.output_length < 100_000]
    res = simulate(built.model, reqs, time_scale=scale, seed=0)
    return flatten_metrics(summarize_simulation(res, sla_ttft_ms=2000, sla_tpot_ms=50))


def test_transfer_backend():
    m = {b: point((f"disagg.disaggregation_transfer_backend={b}",), pd=True) for b in ("nixl", "mooncake", "zmq")}
    assert m["nixl"]["transfer_p90_ms"] < m["mooncake"]["transfer_p90_ms"] < m["zmq"]["transfer_p90_ms"]
    assert m["nixl"]["ttft_unloaded_p90_ms"] < m["zmq"]["ttft_unloaded_p90_ms"]


def test_prefill_workers():
    one, three = point(pd=True, pw=1), point(pd=True, pw=3)
    assert three["ttft_p90_ms"] < one["ttft_p90_ms"] / 2


def test_decode_workers():
    one, two = point(pd=True, pw=3, dw=1, scale=0.5), point(pd=True, pw=3, dw=2, scale=0.5)
    assert two["tpot_p90_ms"] < one["tpot_p90_ms"]


def test_tp_per_side():
    base = point(pd=True, pw=2)
    wide_prefill = point(pd=True, pw=2, prefill=("parallel.tp_size=2",))
    wide_decode = point(pd=True, pw=2, decode=("parallel.tp_size=4",))
    assert wide_prefill["ttft_unloaded_p90_ms"] < base["ttft_unloaded_p90_ms"]
    assert wide_decode["tpot_p50_ms"] < base["tpot_p50_ms"]


def test_dp_size():
    one, four = point(), point(("parallel.dp_size=4",))
    assert four["ttft_p90_ms"] < one["ttft_p90_ms"] / 2


def test_router_policy_cache_aware_finds_more_prefix_hits():
    rr = point(workers=4, router="round_robin", n=1000)
    ca = point(workers=4, router="cache_aware", n=1000)
    assert ca["token_hit_rate"] > rr["token_hit_rate"]


def test_load_balance_method():
    rr = point(("parallel.dp_size=4", "parallel.load_balance_method=round_robin"))
    tt = point(("parallel.dp_size=4", "parallel.load_balance_method=total_tokens"))
    assert rr["ttft_p90_ms"] != tt["ttft_p90_ms"]
    assert tt["ttft_p99_ms"] <= rr["ttft_p99_ms"]


def test_chunked_prefill_size():
    small, big = point(("schedule.chunked_prefill_size=1024",)), point(("schedule.chunked_prefill_size=16384",))
    assert small["ttft_unloaded_p90_ms"] > big["ttft_unloaded_p90_ms"]


def test_max_running_requests():
    few, many = point(("schedule.max_running_requests=2",), scale=4), point(scale=4)
    assert few["ttft_p90_ms"] > many["ttft_p90_ms"]
    assert few["decode_batch_mean"] < many["decode_batch_mean"]


POOL = ("schedule.max_total_tokens=150000", "schedule.page_size=512")


def test_hicache_ratio():
    low = point(POOL + ("memory=hicache", "memory.hicache_ratio=1.5"), mode="sim", n=600, scale=3)
    high = point(POOL + ("memory=hicache", "memory.hicache_ratio=6"), mode="sim", n=600, scale=3)
    assert high["host_hit_tokens"] > low["host_hit_tokens"]
    assert high["token_hit_rate"] > low["token_hit_rate"]


def test_eviction_policy():
    pool = ("schedule.max_total_tokens=512000", "schedule.page_size=512")
    lru = point(pool + ("memory.radix_eviction_policy=lru",), n=4000, scale=3, trace="conversation")
    lfu = point(pool + ("memory.radix_eviction_policy=lfu",), n=4000, scale=3, trace="conversation")
    assert lru["token_hit_rate"] != lfu["token_hit_rate"]


def test_page_size():
    fine = point(("schedule.page_size=512",), n=4000, scale=3, trace="conversation")
    coarse = point(("schedule.page_size=2048",), n=4000, scale=3, trace="conversation")
    assert fine["token_hit_rate"] > coarse["token_hit_rate"]


def test_time_scale_relieves_the_queue():
    assert point(scale=4)["ttft_p90_ms"] < point(scale=1)["ttft_p90_ms"]


@pytest.mark.parametrize("key", ["schedule.schedule_policy=lof", "deploy"])
def test_settings_it_cannot_model_are_refused(key):
    if key == "deploy":
        with pytest.raises(ValueError, match="deploy.router_policy"):
            point(router="manual")
    else:
        with pytest.raises(ValueError, match="schedule.schedule_policy"):
            point((key,))


def test_disaggregated_pass_scales():
    """The presets carry no PD pass scale (the PD cost is the simulated KV transfer, paid once); an
    explicit what-if scale slows a disaggregated server's passes, both sides, and leaves an
    aggregated server alone."""
    raw = ("hardware.disagg_prefill_pass_scale=1.0", "hardware.disagg_decode_pass_scale=1.0")
    scaled = ("hardware.disagg_prefill_pass_scale=1.2", "hardware.disagg_decode_pass_scale=1.2")
    assert point(pd=True, pw=2) == point(raw, pd=True, pw=2)
    slow, bare = point(scaled, pd=True, pw=2), point(raw, pd=True, pw=2)
    assert slow["ttft_unloaded_p90_ms"] > bare["ttft_unloaded_p90_ms"]
    assert slow["tpot_p50_ms"] > bare["tpot_p50_ms"]
    assert point() == point(scaled)


def test_default_max_running_follows_sglang():
    """SGLang 0.5.23 sizes its request table at 512 per context length of pool tokens, clamped to
    2048..4096 and at most half the pool: Llama-3.1-8B (131,072 context) gets 2048, not 4096."""
    from sglang_hydra.workload.assemble import default_max_running

    rec, _ = compose(list(BASE))
    assert default_max_running(rec, 450_000) == 2048
    assert default_max_running(rec, 2_000_000) == 4096       # 7,812 clamped
    assert default_max_running(rec, 3_000) == 1_500
    rec2, _ = compose(list(BASE) + ["schedule.max_running_requests=64"])
    assert default_max_running(rec2, 450_000) == 64
