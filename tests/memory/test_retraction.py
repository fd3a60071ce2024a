"""RT-1: a decode server's retraction backup and its host-pool ratio, settled with the plan."""
import pytest

from sglang_hydra.memory import build_memory, make_plan

from .conftest import small_record

DECODE = dict(disaggregation_mode="decode", disaggregation_transfer_backend="mooncake",
              hicache_host_memory_fraction=None, max_total_tokens=64)


def test_decode_mha_backs_up_to_a_small_host_pool(big_host):
    # 0.2 x 64 tokens is less than one longest request (min(ctx - 1, 64) = 63 -> 64 tokens
    # in 4-token pages), so the ratio is raised to 1.0.
    rec = small_record(**DECODE, context_length=4096)
    assert rec.hicache_ratio is None and rec.disaggregation_decode_retraction_backup is None
    with build_memory(rec, host_memory=big_host) as m:
        p = m.plan
        assert p.retraction_backup == "host_pool" and not p.hicache
        assert p.host_ratio == pytest.approx(1.0) and "one longest request" in p.host_budget_reason
        assert m.host_pool is not None and p.host_tokens == (64 // 4 + 1) * 4
        assert "decode retraction backup only" in p.render()


def test_backup_only_ratio_without_floor_and_doubled_floor(big_host):
    p = make_plan(small_record(**DECODE, context_length=5), host_memory=big_host)
    # longest request 4 tokens -> floor 4/64 < 0.2
    assert p.host_ratio == pytest.approx(0.2)
    p = make_plan(small_record(**DECODE, context_length=9, disaggregation_decode_host_receive_threshold=0.5),
                  host_memory=big_host)
    assert p.host_ratio == pytest.approx(0.25)     # 8 tokens, doubled to 16, over 64


def test_hicache_on_decode_uses_two(big_host):
    rec = small_record(**DECODE, enable_hierarchical_cache=True, disaggregation_decode_enable_radix_cache=True)
    p = make_plan(rec, host_memory=big_host)
    assert p.hicache and p.retraction_backup == "cpu_tensor" and p.host_ratio == pytest.approx(2.0)


@pytest.mark.parametrize("extra,why", [
    (dict(disaggregation_decode_enable_radix_cache=True), "decode radix cache"),
    (dict(enable_priority_scheduling=True), "priority preemption"),
    (dict(attention_arch="mla", kv_lora_rank=16, qk_rope_head_dim=8), "MLA pool"),
])
def test_pools_that_cannot_mirror_fall_back_to_cpu_tensors(big_host, extra, why):
    p = make_plan(small_record(**DECODE, **extra), host_memory=big_host)
    assert p.retraction_backup == "cpu_tensor" and why in p.retraction_reason
    assert p.host_tokens == 0


def test_explicit_choice_is_kept_and_other_roles_have_none(big_host):
    p = make_plan(small_record(**DECODE, disaggregation_decode_retraction_backup="cpu_tensor"), host_memory=big_host)
    assert (p.retraction_backup, p.host_tokens) == ("cpu_tensor", 0)
    p = make_plan(small_record(max_total_tokens=64), host_memory=big_host)
    assert p.retraction_backup is None and p.host_tokens == 0
