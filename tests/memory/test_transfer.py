"""Transfer matrix: every layout × io backend × granularity × dtype, bit-exact against a
plain per-row torch reference that addresses each layout by its own formula.

The ``kernel`` backend runs the Triton kernels in the interpreter: TRITON_INTERPRET=1 is
set for this module only (our kernels are created lazily, after the variable is read).
"""
import pytest
import torch

from sglang_hydra.memory import build_memory, make_transfer, verify
from sglang_hydra.memory.errors import TransferIndexError
from sglang_hydra.memory.transfer_direct import DirectTransfer

from .conftest import small_record

SENTINEL = 0x5A


@pytest.fixture(autouse=True, scope="module")
def triton_interpreter():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "1")
        yield


def host_row(hpool, fam, l, t):
    """Host (H, D) row of token t, layer l, by the layout's address formula."""
    b, ps = hpool.buffers[fam], hpool.page_size
    lay = hpool.layout
    if lay == "layer_first":
        return b[l, t]
    if lay == "page_first":
        return b[t, l]
    if lay in ("page_first_direct", "page_first_kv_split"):
        return b[t // ps, l, t % ps]
    if lay == "page_head":
        return b[t // ps, :, t % ps, l, :]
    raise AssertionError(lay)


def device_row(dpool, hpool, fam, l, t):
    src, cols = hpool.device_source(fam)
    row = dpool.buffers[src][l, t]
    return row if cols is None else row[..., cols]


def reference_copy(dpool, hpool, hp, dp, layer, num_tokens, to_host):
    ps = hpool.page_size
    n = len(hp)
    layers = range(dpool.layer_num) if layer is None else [layer]
    for i in range(n):
        ntok = ps if (num_tokens is None or i < n - 1) else num_tokens - (n - 1) * ps
        for j in range(ntok):
            ht, dt = hp[i] * ps + j, dp[i] * ps + j
            for fam in hpool.buffers:
                for l in layers:
                    if to_host:
                        host_row(hpool, fam, l, ht).copy_(device_row(dpool, hpool, fam, l, dt))
                    else:
                        device_row(dpool, hpool, fam, l, dt).copy_(host_row(hpool, fam, l, ht))


def as_bytes(t):
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def fill(bufs, gen=None, value=None):
    for b in bufs:
        v = as_bytes(b)
        if value is None:
            v.copy_(torch.randint(0, 256, v.shape, dtype=torch.uint8, generator=gen))
        else:
            v.fill_(value)


def snapshot(bufs):
    return [as_bytes(b).clone() for b in bufs]


DTYPES = {"fp16": dict(dtype="float16"), "bf16": dict(), "fp32": dict(dtype="float32"),
          "fp8": dict(kv_cache_dtype="fp8_e4m3")}
MHA = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA = ["layer_first", "page_first", "page_first_direct", "page_first_kv_split"]

# (host pages, device pages, num_tokens or None): non-contiguous, repeated sources,
# consecutive runs, the last page of each pool, a partial last page
CASES = {
    True: [([5, 2, 16, 6, 7], [3, 1, 1, 8, 0], None),       # backup: repeated device source
           ([9, 10, 11, 0], [4, 5, 6, 2], 14)],              # runs + partial last page (2 of 4)
    False: [([4, 4, 16, 0, 9], [2, 6, 8, 7, 1], None),       # load: repeated host source
            ([3, 12, 13, 14], [0, 5, 6, 7], 13)],
}


def _run_matrix(rec, big_host, io, min_run_bytes=None, cases=None, stage_bytes=None, device=None):
    gen = torch.Generator().manual_seed(1)
    cases = CASES if cases is None else cases
    with build_memory(rec, device=device, host_memory=big_host, strict_io=False) as m:
        # the record's rules may rewrite io for a layout (M-HC8); the matrix wants both
        x = make_transfer(m.device_pool, m.host_pool, io)
        assert x.effective == io, x.describe()
        if min_run_bytes is not None:
            assert isinstance(x, DirectTransfer)
            x.min_run_bytes = min_run_bytes
        if stage_bytes is not None:
            assert isinstance(x, DirectTransfer)
            x.stage_bytes = stage_bytes
        dbufs = list(m.device_pool.buffers.values())
        hbufs = list(m.host_pool.buffers.values())
        assert m.host_pool.page_num == 17 and m.device_pool.total_pages == 9
        for to_host in (True, False):
            for hp, dp, nt in cases[to_host]:
                for layer in (None, 1):
                    src, dst = (dbufs, hbufs) if to_host else (hbufs, dbufs)
                    fill(src, gen)
                    fill(dst, value=SENTINEL)
                    fill_src = snapshot(src)
                    reference_copy(m.device_pool, m.host_pool, hp, dp, layer, nt, to_host)
                    want = snapshot(dst)
                    fill(dst, value=SENTINEL)
                    op = x.backup if to_host else x.load
                    op(torch.tensor(hp), torch.tensor(dp), layer=layer, num_tokens=nt)
                    x.synchronize()
                    for w, b in zip(want, dst):
                        assert torch.equal(as_bytes(b), w), (to_host, hp, dp, layer, nt)
                    for s, b in zip(fill_src, src):
                        assert torch.equal(as_bytes(b), s)   # source untouched
                    assert (want[0] == SENTINEL).any()       # untouched parts kept the sentinel


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("io", ["direct", "kernel"])
@pytest.mark.parametrize("layout", MHA)
def test_mha_matrix(layout, io, dtype, big_host):
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend=io,
                       **DTYPES[dtype])
    _run_matrix(rec, big_host, io)


@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
@pytest.mark.parametrize("io", ["direct", "kernel"])
@pytest.mark.parametrize("layout", MLA)
def test_mla_matrix(layout, io, dtype, big_host):
    rec = small_record(attention_arch="mla", kv_lora_rank=8, qk_rope_head_dim=4, enable_hierarchical_cache=True,
                       hicache_mem_layout=layout, hicache_io_backend=io, **DTYPES[dtype])
    _run_matrix(rec, big_host, io)


@pytest.mark.parametrize("io", ["direct", "kernel"])
@pytest.mark.parametrize("layout", ["page_first", "page_first_direct"])
def test_asymmetric_kv(layout, io, big_host):
    rec = small_record(v_head_dim=4, enable_hierarchical_cache=True, hicache_mem_layout=layout,
                       hicache_io_backend=io)
    _run_matrix(rec, big_host, io)


@pytest.mark.parametrize("min_run_bytes", [0, 1 << 40])
@pytest.mark.parametrize("layout", MHA)
def test_direct_both_strategies(layout, min_run_bytes, big_host):
    """Slice copies per run (0) and gather/scatter (huge threshold) give the same bytes."""
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend="direct")
    _run_matrix(rec, big_host, "direct", min_run_bytes)


# long consecutive runs on both sides, a host-only run (what the host free list hands out)
# with scattered device pages, and the same pages reversed (no run at all)
RUN_CASES = {
    True: [(list(range(3, 10)), list(range(1, 8)), None),
           (list(range(10, 17)), [8, 1, 5, 2, 7, 3, 0], 26),
           (list(range(16, 9, -1)), [0, 3, 7, 2, 5, 1, 8], 25)],
    False: [(list(range(0, 8)), list(range(1, 9)), 30),
            (list(range(9, 16)), [4, 8, 0, 6, 2, 7, 1], None),
            (list(range(15, 8, -1)), list(range(7, 0, -1)), 27)],
}


@pytest.mark.parametrize("min_run_bytes", [0, 1 << 40])
@pytest.mark.parametrize("layout", MHA)
def test_direct_runs_vs_scattered(layout, min_run_bytes, big_host):
    """Sorted consecutive runs (one slice copy each) and scattered pages give the reference bytes."""
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend="direct")
    _run_matrix(rec, big_host, "direct", min_run_bytes, cases=RUN_CASES)


@pytest.mark.parametrize("stage_bytes", [0, 1, 3 * 128])
@pytest.mark.parametrize("dtype", ["bf16", "fp8"])
def test_direct_page_head_staging(stage_bytes, dtype, big_host):
    """page_head all-layer copies via the token-major staging buffer: off, 1 token per block,
    and (bf16) 3-token blocks that divide neither the page nor the partial last page."""
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout="page_head", hicache_io_backend="direct",
                       **DTYPES[dtype])
    with build_memory(rec, host_memory=big_host, strict_io=False) as m:
        x = make_transfer(m.device_pool, m.host_pool, "direct")
        x.min_run_bytes, x.stage_bytes = 0, stage_bytes
        x.backup([3], [2])
        ps = m.device_pool.page_size
        per_token = m.device_pool.nbytes // m.device_pool.rows         # K and V, all layers
        tb = min(ps, max(1, stage_bytes // per_token))
        want = 1 if stage_bytes == 0 else 2 * -(-ps // tb)          # staged: 2 copies per block
        assert x.stats["backup"].launches == want
        x.load([3], [2], layer=1)                                     # one layer: never staged
        assert x.stats["load"].launches == 1
    _run_matrix(rec, big_host, "direct", 0, stage_bytes=stage_bytes)
    _run_matrix(rec, big_host, "direct", 0, cases=RUN_CASES, stage_bytes=stage_bytes)


@pytest.mark.parametrize("layout", MHA)
def test_direct_moves_k_and_v_together(layout, big_host):
    """Symmetric K/V share one allocation per side: one copy per page run covers both."""
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend="direct")
    with build_memory(rec, host_memory=big_host, strict_io=False) as m:
        x = make_transfer(m.device_pool, m.host_pool, "direct")
        x.min_run_bytes = 0
        x.stage_bytes = 0
        x.backup([5, 2, 9, 10], [3, 1, 4, 5])            # runs: 5->3, 2->1, (9,10)->(4,5)
        assert x.stats["backup"].launches == 3
        for l in range(m.device_pool.layer_num):
            x.load([5, 2, 9, 10], [3, 1, 4, 5], layer=l)
        assert x.stats["load"].launches == 3 * m.device_pool.layer_num


@pytest.mark.parametrize("io", ["direct", "kernel"])
def test_bad_indices_write_nothing(io, big_host):
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout="page_head", hicache_io_backend=io)
    with build_memory(rec, host_memory=big_host, strict_io=False) as m:
        m.transfer = make_transfer(m.device_pool, m.host_pool, io)
        fill(m.host_pool.buffers.values(), value=SENTINEL)
        fill(m.device_pool.buffers.values(), torch.Generator().manual_seed(0))
        before = snapshot(m.host_pool.buffers.values())
        bad = [
            dict(host_pages=[0, 17], device_pages=[1, 2]),        # host page out of range
            dict(host_pages=[0, 1], device_pages=[1, 9]),         # device page out of range
            dict(host_pages=[-1], device_pages=[1]),
            dict(host_pages=[3, 3], device_pages=[1, 2]),         # repeated destination
            dict(host_pages=[3], device_pages=[1, 2]),            # length mismatch
            dict(host_pages=[3], device_pages=[1], num_tokens=5),  # more tokens than pages
            dict(host_pages=[3], device_pages=[1], layer=2),
        ]
        for kw in bad:
            with pytest.raises(TransferIndexError):
                m.transfer.backup(**kw)
        for b, s in zip(m.host_pool.buffers.values(), before):
            assert torch.equal(as_bytes(b), s)
        assert m.transfer.backup([], []) == 0


@pytest.mark.parametrize("io", ["direct", "kernel"])
def test_verify_roundtrip_and_injected_corruption(io, big_host):
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout="page_first"
                       if io == "kernel" else "page_first_direct", hicache_io_backend=io)
    m = build_memory(rec, host_memory=big_host)
    rep = verify(m, rounds=2, pages=4, progress=False)
    assert rep.ok and rep.mismatched_bytes == 0 and rep.io_backend_effective == io
    assert set(rep.gbps) == {"backup_all", "load_layer", "backup_layer", "load_all"}
    assert not m.closed

    def corrupt(mem):
        as_bytes(mem.host_pool.k_buffer).view(-1)[::7] ^= 0xFF

    rep = verify(m, rounds=1, pages=4, progress=False, corrupt=corrupt)
    assert not rep.ok and rep.mismatched_bytes > 0 and rep.freed
    assert m.closed and m.host_pool is None and m.device_pool is None
    assert "FAILED" in rep.render()


def test_verify_without_hicache(big_host):
    with build_memory(small_record(), host_memory=big_host) as m:
        assert m.host_pool is None and m.transfer is None
        assert verify(m, progress=False).skipped
