"""The transfer matrix on a CUDA GPU: the compiled Triton kernels (not the interpreter),
bit-exact against the per-row torch reference, host pools pinned.

Skipped without a GPU (CI has none).  On a GPU machine run this module on its own, so no
interpreter setting from the CPU matrix is in the environment:

    python -m pytest -q tests/memory/test_transfer_cuda.py
"""
import pytest
import torch

from .conftest import small_record
from .test_transfer import DTYPES, MHA, MLA, _run_matrix

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def compiled_triton(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("io", ["direct", "kernel"])
@pytest.mark.parametrize("layout", MHA)
def test_mha_matrix_on_gpu(layout, io, dtype, big_host):
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend=io,
                       **DTYPES[dtype])
    _run_matrix(rec, big_host, io, device="cuda")


@pytest.mark.parametrize("io", ["direct", "kernel"])
@pytest.mark.parametrize("layout", MLA)
def test_mla_matrix_on_gpu(layout, io, big_host):
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend=io,
                       attention_arch="mla", kv_lora_rank=8, qk_rope_head_dim=4)
    _run_matrix(rec, big_host, io, device="cuda")


def test_compiled_variants_are_exactly_the_planned_keys(big_host, monkeypatch):
    """Triton compiles one variant per planned (width, MODE, BLOCK, VEC, warps) and no more:
    page counts, tails and strides never add a variant at run time, so the ahead-of-time
    compile of scripts/compile_kernels.py covers what a GPU runs."""
    from sglang_hydra.memory import transfer_triton

    monkeypatch.setattr(transfer_triton, "_KERNELS", {})          # a fresh jit with an empty cache
    planned = set()
    real_launch = transfer_triton.launch

    def recording_launch(kernel, plan):
        planned.add((plan.args[0].element_size(), plan.mode, plan.block, plan.vec, plan.num_warps))
        real_launch(kernel, plan)

    monkeypatch.setattr(transfer_triton, "launch", recording_launch)
    for layout in MHA:
        for dtype in ("bf16", "fp8"):
            rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend="kernel",
                               **DTYPES[dtype])
            _run_matrix(rec, big_host, "kernel", device="cuda")
    kernel = transfer_triton._kernel()
    compiled = kernel.device_caches[torch.cuda.current_device()][0]
    assert planned and len(compiled) == len(planned), (sorted(planned), list(compiled))
