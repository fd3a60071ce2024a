"""Device/host pool shapes and bytes, plan sizing and errors, allocator invariants."""
import json

import pytest
import torch
from hypothesis import given, settings, strategies as st

from sglang_hydra.config.errors import ConfigError
from sglang_hydra.memory.hostmem import HostMemoryInfo
from sglang_hydra.memory import build_memory, make_plan
from sglang_hydra.memory.device_pool import AllocatorError, PageAllocator
from sglang_hydra.memory.errors import MemorySetupError

from .conftest import GiB, small_record

MHA_FORMULAS = {
    "layer_first": lambda L, S, P, ps, H, D: (L, S, H, D),
    "page_first": lambda L, S, P, ps, H, D: (S, L, H, D),
    "page_first_direct": lambda L, S, P, ps, H, D: (P, L, ps, H, D),
    "page_head": lambda L, S, P, ps, H, D: (P, H, ps, L, D),
}


@pytest.mark.parametrize("layout", list(MHA_FORMULAS))
def test_mha_shapes_and_bytes(layout, big_host):
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend="kernel",
                       num_key_value_heads=4, tp_size=2, head_dim=8, hicache_ratio=2.0)
    with build_memory(rec, host_memory=big_host, strict_io=False) as m:
        p = m.plan
        L, H, D, ps = 2, 2, 8, 4
        assert p.bytes_per_token == 2 * H * D * L * 2 and p.bytes_per_page == p.bytes_per_token * ps
        assert p.device_tokens == 32 and p.device_pages == 8
        for b in m.device_pool.k_buffer + m.device_pool.v_buffer:
            assert tuple(b.shape) == (32 + ps, H, D) and b.dtype == torch.bfloat16
        hp = m.host_pool
        S = p.host_tokens
        assert S == (32 * 2 // ps + 1) * ps and hp.page_num == S // ps
        want = MHA_FORMULAS[layout](L, S, S // ps, ps, H, D)
        assert tuple(hp.kv_buffer.shape) == (2,) + want
        assert hp.nbytes == p.host_bytes == S * p.bytes_per_token
        assert m.device_pool.nbytes == p.device_bytes == (32 + ps) * p.bytes_per_token
        assert m.device_pool.get_kv_size_bytes() == (p.device_bytes // 2, p.device_bytes // 2)
        names = [(b.where, b.name, tuple(b.shape), b.bytes) for b in p.buffers]
        assert ("host", "k", want, hp.nbytes // 2) in names
        json.dumps(p.to_dict())
        assert "io backend" in p.render()
        # contiguous buffers for transfer engines
        bufs = m.device_pool.contiguous_buffers()
        assert len(bufs) == 2 * L and all(t.is_contiguous() for _, t in bufs)
        assert m.device_pool.page_bytes_per_buffer == [ps * H * D * 2] * (2 * L)
        assert bufs[0][0] == "k.0" and bufs[-1][0] == "v.1"
    assert m.closed and m.host_pool is None


@pytest.mark.parametrize("layout,shapes", [
    ("layer_first", lambda L, S, P, ps: {"kv": (L, S, 1, 12)}),
    ("page_first", lambda L, S, P, ps: {"kv": (S, L, 1, 12)}),
    ("page_first_direct", lambda L, S, P, ps: {"kv": (P, L, ps, 1, 12)}),
    ("page_first_kv_split", lambda L, S, P, ps: {"k": (P, L, ps, 1, 8), "v": (P, L, ps, 1, 4)}),
])
def test_mla_shapes(layout, shapes, big_host):
    rec = small_record(attention_arch="mla", kv_lora_rank=8, qk_rope_head_dim=4, enable_hierarchical_cache=True,
                       hicache_mem_layout=layout, hicache_io_backend="kernel", kv_cache_dtype="fp8_e4m3")
    with build_memory(rec, host_memory=big_host, strict_io=False) as m:
        p = m.plan
        assert p.bytes_per_token == 12 * 2 * 1
        assert [tuple(b.shape) for b in m.device_pool.kv_buffer] == [(36, 1, 12)] * 2
        assert m.device_pool.kv_buffer[0].dtype == torch.uint8
        assert m.device_pool.get_key_buffer(0).dtype == torch.float8_e4m3fn
        assert m.device_pool.get_value_buffer(0).shape == (36, 1, 8)
        S = p.host_tokens
        want = shapes(2, S, S // 4, 4)
        assert {k: tuple(v.shape) for k, v in m.host_pool.buffers.items()} == want
        assert m.host_pool.nbytes == S * 24


def test_dtypes_and_errors(big_host):
    for kv, dt, want in [("auto", "float16", torch.float16), ("auto", "float32", torch.float32),
                         ("bf16", "float32", torch.bfloat16), ("fp8_e5m2", "auto", torch.float8_e5m2)]:
        with build_memory(small_record(kv_cache_dtype=kv, dtype=dt), host_memory=big_host) as m:
            assert m.device_pool.dtype == want
    with pytest.raises(MemorySetupError) as ei:
        make_plan(small_record(kv_cache_dtype="fp4_e2m1"), host_memory=big_host)
    assert ei.value.key == "model.kv_cache_dtype" and ei.value.flag == "--kv-cache-dtype"


@pytest.mark.parametrize("kw,key", [
    (dict(hicache_mem_layout="page_first_kv_split"), "memory.hicache_mem_layout"),
    (dict(attention_arch="mla", kv_lora_rank=8, qk_rope_head_dim=4, hicache_mem_layout="page_head"),
     "memory.hicache_mem_layout"),
    (dict(v_head_dim=4, hicache_mem_layout="layer_first"), "memory.hicache_mem_layout"),
    (dict(hicache_io_backend="kernel_ascend"), "memory.hicache_io_backend"),
    (dict(hicache_size=10_000), "memory.hicache_size"),
    (dict(hicache_ratio=1e9, hicache_host_memory_fraction=None), "memory.hicache_ratio"),
])
def test_bad_layout_io_and_budget_are_setup_errors(kw, key, big_host, monkeypatch):
    import sglang_hydra.memory.host_pool as hpmod
    monkeypatch.setattr(hpmod, "allocate_zeroed", lambda *a, **k: pytest.fail("allocated before the check"))
    rec = small_record(enable_hierarchical_cache=True, **kw)
    with pytest.raises(MemorySetupError) as ei:
        build_memory(rec, host_memory=big_host)
    assert ei.value.key == key, ei.value


def test_strict_io_matrix(big_host):
    from sglang_hydra.memory.geometry import kv_geometry
    from sglang_hydra.memory.plan import check_layout_io
    g = kv_geometry(small_record())
    with pytest.raises(MemorySetupError):
        check_layout_io(g, "page_head", "direct")
    with pytest.raises(MemorySetupError):
        check_layout_io(g, "page_first_direct", "kernel")
    check_layout_io(g, "page_head", "direct", strict=False)
    check_layout_io(g, "layer_first", "direct")


def test_sizing_paths(big_host):
    # mem_fraction_static of the CPU host budget, capped
    p = make_plan(small_record(max_total_tokens=None, mem_fraction_static=0.5),
                  host_memory=HostMemoryInfo.fixed(256 << 20))
    assert p.device_tokens == ((256 << 20) // 2 // p.bytes_per_token) // 4 * 4
    assert "mem_fraction_static 0.5" in p.device_budget_reason
    p = make_plan(small_record(max_total_tokens=None, mem_fraction_static=0.9), host_memory=big_host)
    # a CPU pool is a stand-in: what a run needs, not most of the RAM
    assert p.device_bytes <= (256 << 20) + p.bytes_per_page and "capped at 256 MiB" in p.device_budget_reason
    with pytest.raises(MemorySetupError) as ei:
        make_plan(small_record(max_total_tokens=None, mem_fraction_static=0.5), host_memory=HostMemoryInfo.fixed(100))
    assert ei.value.key == "schedule.mem_fraction_static"
    with pytest.raises(ConfigError, match="smaller than one page"):   # now refused when resolved
        small_record(max_total_tokens=3)
    # host: size wins, ratio, auto-size capped by the budget
    p = make_plan(small_record(enable_hierarchical_cache=True, hicache_size=1), host_memory=big_host)
    assert p.host_tokens == (10 ** 9 // p.bytes_per_token // 4 + 1) * 4 and "hicache_size" in p.host_budget_reason
    p = make_plan(small_record(enable_hierarchical_cache=True, hicache_ratio=3.0, hicache_host_memory_fraction=None),
                  host_memory=big_host)
    assert p.host_tokens == (96 // 4 + 1) * 4 and p.host_budget_reason.startswith("hicache_ratio")
    dev_bytes = 36 * 128
    # after booking the CPU device pool and the reserve: 2 device pools; fraction 0.5 -> 1 pool
    budget_info = HostMemoryInfo.fixed(10 * GiB + dev_bytes + 2 * dev_bytes)
    p = make_plan(small_record(enable_hierarchical_cache=True, hicache_host_memory_fraction=0.5),
                  host_memory=budget_info)
    assert p.host_ratio == pytest.approx(0.95)
    assert p.host_tokens == (int(32 * 0.95) // 4 + 1) * 4
    assert p.host_budget_reason.startswith("auto-size")
    assert p.host_bytes <= p.host_budget_bytes
    with pytest.raises(MemorySetupError) as ei:
        make_plan(small_record(enable_hierarchical_cache=True, hicache_host_memory_fraction=0.8),
                  host_memory=HostMemoryInfo.fixed(GiB))
    assert ei.value.key == "memory.hicache_host_memory_fraction"


def test_kernel_fallback_is_reported(big_host, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    p = make_plan(small_record(enable_hierarchical_cache=True, hicache_io_backend="kernel",
                               hicache_mem_layout="page_first"), host_memory=big_host)
    assert p.io_backend == "kernel" and p.io_backend_effective == "direct"
    assert "direct" in p.io_note and any("TRITON_INTERPRET" in n for n in p.notes)


# ---- allocators ---------------------------------------------------------------------------

def test_allocator_basics():
    a = PageAllocator(32, 4)
    assert a.available_size() == 32
    x = a.alloc(8)
    assert x.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert a.alloc(28) is None and a.available_size() == 24
    with pytest.raises(AllocatorError):
        a.alloc(3)
    a.free(x[:1])
    with pytest.raises(AllocatorError, match="double free"):
        a.free(x[:1])
    with pytest.raises(AllocatorError):
        a.free_page_ids(torch.tensor([0]))
    assert a.alloc(4).tolist() == [4, 5, 6, 7]   # recently freed page comes back first
    t = PageAllocator(4, 1)
    y = t.alloc(2)
    t.free(y[:1])
    assert t.alloc(3).tolist() == [3, 4, 1]       # token allocator: freed slots go to the back


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.booleans(), st.lists(st.tuples(st.booleans(), st.integers(0, 6)), max_size=40))
def test_allocator_invariants(ps, need_sort, ops):
    num_pages = 10
    a = PageAllocator(num_pages * ps, ps, need_sort=need_sort)
    held = []
    for is_alloc, k in ops:
        if is_alloc:
            before = a.available_size()
            got = a.alloc(k * ps)
            if got is None:
                assert k * ps > before and a.available_size() == before
            else:
                pages = (got[::ps] // ps).tolist()
                assert len(pages) == k and all(1 <= p <= num_pages for p in pages)
                assert (got.view(-1, ps) % ps == torch.arange(ps)).all()
                assert not set(pages) & {p for h in held for p in h}
                held.append(pages)
        elif held:
            pages = held.pop(k % len(held))
            a.free_page_ids(torch.tensor(pages, dtype=torch.int64))
            if pages:
                with pytest.raises(AllocatorError):
                    a.free_page_ids(torch.tensor(pages[:1]))
        in_use = sum(len(h) for h in held)
        assert a.available_size() == (num_pages - in_use) * ps
        assert sorted(a.allocated_pages().tolist()) == sorted(p for h in held for p in h)


def test_host_free_list(big_host):
    with build_memory(small_record(enable_hierarchical_cache=True, hicache_ratio=1.0,
                                   hicache_host_memory_fraction=None), host_memory=big_host) as m:
        h = m.host_pool
        total = h.available_size()
        assert total == h.size
        s = h.alloc(8)
        assert s.tolist()[:4] == [0, 1, 2, 3]                    # host page 0 is usable
        assert h.alloc(total) is None
        assert h.free(s) == 8 and h.available_size() == total
        with pytest.raises(AllocatorError, match="double free"):
            h.free(s)
        assert h.alloc(total) is not None


def test_failed_build_frees(big_host, monkeypatch):
    import sglang_hydra.memory.build as b
    closed = []
    orig = b.DeviceKVPool.close
    monkeypatch.setattr(b.DeviceKVPool, "close", lambda self: (closed.append(1), orig(self)))
    monkeypatch.setattr(b, "HostKVPool", lambda *a, **k: (_ for _ in ()).throw(MemoryError("boom")))
    with pytest.raises(MemoryError):
        build_memory(small_record(enable_hierarchical_cache=True), host_memory=big_host)
    assert closed
