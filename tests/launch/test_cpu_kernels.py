"""The torch ``sgl_kernel`` that job=launch gives a CPU server, against plain-torch references.

The package is loaded from its file under a private name: it never becomes ``sgl_kernel`` in
this interpreter (only the launched server has it on its path).  Every output starts poisoned,
so a slot the kernel should write and does not, or one it should leave and overwrites, shows.
"""
from __future__ import annotations

import importlib.util
import random
import sys

import pytest
import torch

from sglang_hydra.jobs.engine_process import KERNEL_SHIM_DIR

POISON = -7


@pytest.fixture(scope="module")
def kernels():
    path = KERNEL_SHIM_DIR / "sgl_kernel" / "__init__.py"
    spec = importlib.util.spec_from_file_location("hydra_cpu_sgl_kernel_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert "sgl_kernel" not in sys.modules      # nothing here imports it under its real name
    return mod


def _reference_assign(rows, table, starts, ends, locs):
    out = table.clone()
    offset = 0
    for r, s, e in zip(rows.tolist(), starts.tolist(), ends.tolist()):
        for j in range(s, e):
            out[r, j] = locs[offset]
            offset += 1
    return out


@pytest.mark.parametrize("seed", range(6))
def test_assign_req_to_token_pool_matches_the_reference(kernels, seed):
    rng = random.Random(seed)
    pool_len, n_rows = 64, 12
    batch = rng.randint(1, 8)
    rows = torch.tensor(rng.sample(range(n_rows), batch), dtype=torch.int64)
    starts, ends = [], []
    for _ in range(batch):
        s = rng.randint(0, pool_len - 1)
        starts.append(s)
        ends.append(rng.randint(s, pool_len))      # empty slices too
    starts_t, ends_t = torch.tensor(starts, dtype=torch.int64), torch.tensor(ends, dtype=torch.int64)
    total = sum(e - s for s, e in zip(starts, ends))
    locs = torch.randperm(10_000)[:total].to(torch.int64) + 1
    table = torch.full((n_rows, pool_len), POISON, dtype=torch.int32)
    want = _reference_assign(rows, table, starts_t, ends_t, locs)
    kernels.assign_req_to_token_pool_cpu(rows, table, starts_t, ends_t, locs, pool_len)
    assert torch.equal(table, want)
    assert int((table != POISON).sum()) == total          # exactly the requested slots were written


def test_assign_refuses_what_does_not_fit(kernels):
    table = torch.zeros((2, 8), dtype=torch.int32)
    with pytest.raises(ValueError):
        kernels.assign_req_to_token_pool_cpu(torch.tensor([0]), table, torch.tensor([4]), torch.tensor([9]),
                                             torch.arange(5), 8)
    with pytest.raises(ValueError):
        kernels.assign_req_to_token_pool_cpu(torch.tensor([0]), table, torch.tensor([0]), torch.tensor([6]),
                                             torch.arange(3), 8)


def _buffers(dtype, rows, row_shape, n_layers, seed):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn((rows, *row_shape), generator=g) * 100).to(dtype) for _ in range(n_layers)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.uint8])
def test_copy_all_layer_kv_cache_moves_every_layer(kernels, dtype):
    rows, n_layers = 40, 4
    ks = _buffers(dtype, rows, (2, 8), n_layers, 1)
    vs = _buffers(dtype, rows, (2, 8), n_layers, 2)
    bufs = ks + vs
    want = [b.clone() for b in bufs]
    src = torch.tensor([3, 7, 8, 20, 31], dtype=torch.int64)
    tgt = torch.tensor([10, 0, 39, 21, 5], dtype=torch.int64)
    for w in want:
        w[tgt] = w[src].clone()
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in bufs])
    kernels.copy_all_layer_kv_cache_cpu(ptrs, strides, tgt, src)
    for got, w in zip(bufs, want):
        assert torch.equal(got, w)


def test_copy_reads_every_source_before_writing(kernels):
    """Overlapping moves (a target that is also a source) act as one gather, then one scatter."""
    buf = torch.arange(10 * 4, dtype=torch.float32).view(10, 4)
    want = buf.clone()
    src, tgt = torch.tensor([1, 2, 3]), torch.tensor([2, 3, 4])
    want[tgt] = want[src].clone()
    kernels.copy_all_layer_kv_cache_cpu(torch.tensor([buf.data_ptr()], dtype=torch.uint64),
                                        torch.tensor([16]), tgt, src)
    assert torch.equal(buf, want)
    assert torch.equal(buf[4], torch.arange(12, 16, dtype=torch.float32))   # slot 3's old row, not slot 1's


def test_copy_leaves_other_rows_and_bytes_alone(kernels):
    """A buffer whose rows are wider than the copied stride (a strided view) keeps the rest."""
    base = torch.full((6, 8), POISON, dtype=torch.int16)
    base[2, :] = torch.arange(8, dtype=torch.int16)
    kernels.copy_all_layer_kv_cache_cpu(torch.tensor([base.data_ptr()], dtype=torch.uint64),
                                        torch.tensor([16]), torch.tensor([5]), torch.tensor([2]))
    assert torch.equal(base[5], base[2])
    assert int((base[[0, 1, 3, 4]] != POISON).sum()) == 0
    kernels.copy_all_layer_kv_cache_cpu(torch.tensor([base.data_ptr()], dtype=torch.uint64),
                                        torch.tensor([16]), torch.tensor([], dtype=torch.int64),
                                        torch.tensor([], dtype=torch.int64))      # nothing to move
    with pytest.raises(ValueError):
        kernels.copy_all_layer_kv_cache_cpu(torch.tensor([base.data_ptr()], dtype=torch.uint64),
                                            torch.tensor([16]), torch.tensor([1, 2]), torch.tensor([3]))


def test_speculative_helpers_exist_and_refuse(kernels):
    """SGLang imports them at module level on a CPU; calling one says what is missing."""
    for name in ("assign_draft_cache_locs_contiguous_cpu", "assign_extend_cache_locs_cpu",
                 "build_tree_kernel_efficient_cpu", "verify_tree_greedy_cpu", "rotate_input_ids_cpu",
                 "fill_accept_out_cache_loc_cpu", "fill_bonus_tokens_cpu"):
        with pytest.raises(NotImplementedError, match="speculative decoding on CPU"):
            getattr(kernels, name)()


def test_no_amx_op_is_registered(kernels):
    """SGLang checks ``torch.ops.sgl_kernel.convert_weight_packed`` to pick its Intel AMX layers;
    the stand-in registers no op, so its layers take their plain-torch code."""
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
