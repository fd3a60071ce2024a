import json
"""Every registered eviction policy drives HiCache (full mode) through cache/policies.py."""
import pytest

from sglang_hydra.cache.hicache import HiCache
from sglang_hydra.cache.policies import available_policies, get_policy_info
from sglang_hydra.cache.storage import SimStorage, page_hashes
from sglang_hydra.config.errors import ConfigError
from sglang_hydra.config.testing import make_record
from sglang_hydra.memory import build_memory

PS = 16
#: parameters a policy cannot run without (tlru needs threshold > next_prompt_estimate)
CONFIGS = {"tlru": {"threshold": 8 * 128, "next_prompt_estimate": 2 * 128}}
FULL_MODE_POLICIES = [p for p in available_policies() if not get_policy_info(p).cls.needs_future]
REPLAY_ONLY = [p for p in available_policies() if get_policy_info(p).cls.needs_future]


def _keys(ids):
    return page_hashes([(i,) for i in ids])


def _cache(policy, dev_pages=2, **kw):
    mem = build_memory(make_record(enable_hierarchical_cache=True, hicache_ratio=4.0, max_total_tokens=dev_pages * PS,
                                   page_size=PS, hicache_write_policy="write_through", hicache_io_backend="direct"))
    return HiCache(mem, write_policy="write_through", eviction_policy=policy, **kw)


def test_policy_decides_the_victim():
    a, b, c = (_keys([i]) for i in (1, 2, 3))
    victims = {}
    for policy in ("lru", "fifo"):
        cache = _cache(policy)
        cache.serve(a)
        cache.serve(b)
        cache.serve(a)            # a is older (fifo) but more recent (lru)
        cache.serve(c)            # device holds 2 pages: one of a, b is demoted to host
        victims[policy] = [x for x, k in (("a", a[0]), ("b", b[0])) if cache.tier_of(k) == "host"]
        cache.check_invariants()
    assert victims == {"lru": ["b"], "fifo": ["a"]}


def test_priority_policy_keeps_high_priority_pages():
    cache = _cache("priority")
    a, b, c = (_keys([i]) for i in (1, 2, 3))
    cache.serve(a, priority=5)
    cache.serve(b)
    cache.serve(c)               # b (priority 0) goes although a is older
    assert cache.tier_of(a[0]) == "device+host" and cache.tier_of(b[0]) == "host"


@pytest.mark.parametrize("policy", FULL_MODE_POLICIES)
def test_each_policy_replays_with_byte_identical_loads(policy, full_mode):
    from sglang_hydra.workload.synthetic import generate_conversations

    # multi-turn conversations reuse their history at once; 16 device pages force evictions
    reqs = generate_conversations(seed=0, conversations=12, min_turns=3, max_turns=5)
    rec = make_record(enable_hierarchical_cache=True, hicache_ratio=2.0, max_total_tokens=48 * 128, page_size=128,
                      hicache_write_policy="write_through", hicache_io_backend="direct",
                      hicache_storage_backend_extra_config='{"prefetch_threshold": 128}')
    r = full_mode(rec, reqs, policy=policy, policy_config=CONFIGS.get(policy), storage=SimStorage())
    assert r["policy"] == policy
    counts = r["cache"]["tier_counts"]
    assert counts["device_evicted_pages"] > 0 and counts["host_evicted_pages"] > 0   # the policy had to choose
    assert r["cache"]["host_hit_tokens"] + r["cache"]["storage_hit_tokens"] > 0     # and pages came back from below
    f = r["full_mode"]
    assert f["verified_pages"] > 0 and f["verify_mismatch_pages"] == 0              # every load byte-identical


@pytest.mark.parametrize("policy", REPLAY_ONLY)
def test_replay_only_policy_is_refused_clearly(policy):
    with pytest.raises(ValueError, match="job.mode=device_only"):
        _cache(policy)


def test_unknown_policy_and_bad_config_are_errors():
    with pytest.raises(ValueError, match="unknown eviction policy 'nope'"):
        _cache("nope")
    with pytest.raises(ValueError, match="threshold"):
        _cache("tlru")                              # no threshold > next_prompt_estimate


def test_replay_job_runs_a_replay_only_policy_in_full_mode(tmp_path):
    """job.mode=full runs the simulation on one engine, which knows the whole trace in order:
    belady works there too."""
    from sglang_hydra.jobs.context import JobContext
    from sglang_hydra.jobs.replay import run

    from sglang_hydra.config.hardware import compose_hardware

    rec = make_record(enable_hierarchical_cache=True, max_total_tokens=1024 * PS, page_size=PS,
                      hicache_io_backend="direct", context_length=131072)
    run(rec, {"mode": "full", "policy": "belady", "max_requests": 2, "progress": False},
        JobContext(output_dir=tmp_path, hardware=compose_hardware("h100_80gb")[0]))
    out = json.loads((tmp_path / "metrics.json").read_text())
    assert out["deployment"]["eviction_policy"] == "belady" and out["requests"]["requests_completed"] == 2
