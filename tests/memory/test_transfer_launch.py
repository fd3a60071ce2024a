"""GPU readiness of the transfer code, checked without a GPU.

* The Triton launch is built the same way for every device: block size and warps follow
  from the page size, every launch passes ``BLOCK`` (a CUDA pool under
  ``TRITON_INTERPRET=1`` used to launch without it: TypeError), and nothing is autotuned
  on the live pools.
* Many blocks per page and masked tails, run in the interpreter against the torch
  reference with poisoned destinations (the regular matrix has one block per page).
* Transfer timing: CUDA events on a CUDA device (copies are only queued when a call
  returns), wall time on CPU.
"""
import inspect
from types import SimpleNamespace

import pytest
import torch

from sglang_hydra.memory import build_memory, make_transfer
from sglang_hydra.memory import transfer_triton
from sglang_hydra.memory.transfer_direct import CudaEventClock, TransferStats, WallClock, clock_for
from sglang_hydra.memory.transfer_triton import (LANE_BYTES, MAX_BYTES_PER_PROGRAM, MIN_BLOCK_BYTES, _page_copy,
                                                  block_for_page, plan_group_launch)

from .conftest import small_record
from .test_transfer import MHA, MLA, _run_matrix

LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas"}


def bind_like_triton(args, kwargs):
    """What Triton does with a launch before compiling: bind the kernel's parameters
    (launch options aside); a missing ``BLOCK``/``MODE`` raises TypeError here."""
    params = {k: v for k, v in kwargs.items() if k not in LAUNCH_OPTIONS}
    return inspect.signature(_page_copy).bind(*args, **params)


class RecordingKernel:
    """Stands in for the jitted kernel: ``kernel[grid](*args, **kwargs)`` binds and records."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            bind_like_triton(args, kwargs)
            self.launches.append((grid, kwargs))
        return run


# ----------------------------------------------------------------------- block size choice
@pytest.mark.parametrize("page_size", [1, 16, 64, 128, 512])
@pytest.mark.parametrize("row_bytes", [64, 576 * 2, 8 * 128 * 2, 32 * 128 * 4])
@pytest.mark.parametrize("elem_bytes", [1, 2, 4, 8])
@pytest.mark.parametrize("access_bytes", [16, 8, 1])
def test_block_follows_page_size(page_size, row_bytes, elem_bytes, access_bytes):
    vec = max(1, access_bytes // elem_bytes)
    page_elems = page_size * row_bytes // elem_bytes
    block, warps = block_for_page(page_elems, elem_bytes, vec)
    most = MAX_BYTES_PER_PROGRAM // LANE_BYTES          # accesses in the largest program
    accesses = block // vec
    assert block & (block - 1) == 0 and block % vec == 0
    assert MIN_BLOCK_BYTES // LANE_BYTES <= accesses <= most
    if page_elems <= most * vec:
        assert block >= page_elems                  # a small page is one program
    else:
        assert accesses == most
    assert warps in (1, 2, 4, 8)
    assert 1 <= accesses // (32 * warps) <= 4       # every lane: one to four accesses
    if vec * elem_bytes == LANE_BYTES:              # full-width accesses: 512 B .. 16 KiB programs
        assert MIN_BLOCK_BYTES <= block * elem_bytes <= MAX_BYTES_PER_PROGRAM
    if vec == LANE_BYTES // elem_bytes:
        assert block_for_page(page_elems, elem_bytes) == (block, warps)   # the default is full width


def test_block_for_page_rejects_nonsense():
    with pytest.raises(ValueError):
        block_for_page(0, 8)
    with pytest.raises(ValueError):
        block_for_page(16, 3)
    with pytest.raises(ValueError):
        block_for_page(16, 8, 4)        # 32-byte accesses do not exist
    with pytest.raises(ValueError):
        block_for_page(16, 1, 3)


def test_llama_pages_split_into_16k_programs():
    # llama3-8B: 8 KV heads x 128 dims bf16 = 2 KiB per token row, moved as int64
    block, warps = block_for_page(64 * 2048 // 8, 8)
    assert (block, warps) == (2048, 8)


# ------------------------------------------------------------------------------ launch path
def _views(layers=2, pages=5, page_size=4, heads=2, head_dim=8, families=2):
    """Canonical int64 views of a symmetric pool: K and V in one allocation."""
    storage = torch.zeros(families, layers, pages, page_size, heads, head_dim, dtype=torch.int64)
    return [storage[f] for f in range(families)]


def test_plan_has_everything_a_launch_needs():
    src, dst = _views(), _views()
    pages = torch.tensor([3, 1, 4])
    plan = plan_group_launch(src, dst, pages, torch.tensor([0, 2, 1]), tail_tokens=3)
    bound = bind_like_triton(plan.args, plan.options)
    assert bound.arguments["BLOCK"] == plan.block and bound.arguments["MODE"] == plan.mode == 0
    assert plan.options["num_warps"] == plan.num_warps
    page_elems = 4 * 2 * 8
    assert plan.grid == (3, 2 * 2, -(-page_elems // plan.block))
    assert bound.arguments["tail_elems"] == 3 * 2 * 8
    assert bound.arguments["src_family_stride"] == src[1].data_ptr() // 8 - src[0].data_ptr() // 8


@pytest.mark.parametrize("interpret", [True, False])
def test_cuda_pool_launch_passes_block(monkeypatch, big_host, interpret):
    """A transfer for a CUDA pool, compiled or under TRITON_INTERPRET=1, launches with
    BLOCK/MODE/num_warps; the kernel is a recorder, so nothing runs and no GPU is needed."""
    monkeypatch.setenv("TRITON_INTERPRET", "1" if interpret else "0")
    kernel = RecordingKernel()
    monkeypatch.setattr(transfer_triton, "_kernel", lambda: kernel)
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout="page_first", hicache_io_backend="kernel")
    with build_memory(rec, host_memory=big_host, strict_io=False) as m:
        x = make_transfer(m.device_pool, m.host_pool, "kernel")
        cpu_pool = x.device_pool
        x.device_pool = SimpleNamespace(device=torch.device("cuda"))   # what a GPU pool reports
        x._page_index = lambda pages: pages                            # keep the ids on the host
        pairs = list(x._views(None))
        launches = x._copy(pairs, torch.tensor([1, 2]), torch.tensor([3, 5]), 4, to_host=True)
        x.device_pool = cpu_pool
    assert launches == len(kernel.launches) >= 1
    for grid, kwargs in kernel.launches:
        assert {"BLOCK", "MODE", "num_warps"} <= set(kwargs)
        assert grid[0] == 2


def test_no_autotuning(monkeypatch):
    """The kernel is a plain jit function: no trial copies on the live pools."""
    monkeypatch.setattr(transfer_triton, "_KERNELS", {})
    for interpret in ("1", "0"):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        kernel = transfer_triton._kernel()
        assert "Autotuner" not in type(kernel).__name__


# ------------------------------------------------------- many blocks per page, interpreter
@pytest.fixture
def tiny_blocks(monkeypatch):
    """Blocks of 4 int64 (32 bytes): a 4-token page of 2x8 bf16 rows takes 4 programs, and a
    partial last page leaves whole blocks and half blocks masked."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(transfer_triton, "MAX_BYTES_PER_PROGRAM", 32)
    monkeypatch.setattr(transfer_triton, "MIN_BLOCK_BYTES", 32)
    assert block_for_page(16, 8)[0] == 4


@pytest.mark.parametrize("layout", MHA)
def test_many_blocks_per_page_mha(layout, big_host, tiny_blocks):
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend="kernel")
    _run_matrix(rec, big_host, "kernel")


@pytest.mark.parametrize("layout", MLA[:2])
def test_many_blocks_per_page_mla(layout, big_host, tiny_blocks):
    rec = small_record(enable_hierarchical_cache=True, hicache_mem_layout=layout, hicache_io_backend="kernel",
                       attention_arch="mla", kv_lora_rank=8, qk_rope_head_dim=4)
    _run_matrix(rec, big_host, "kernel")


# ------------------------------------------------------------------------------- timing
def test_clock_choice_by_device():
    assert isinstance(clock_for(torch.device("cpu")), WallClock)
    cuda_clock = clock_for(torch.device("cuda", 1))        # no CUDA call is made to choose
    assert isinstance(cuda_clock, CudaEventClock) and cuda_clock.method == "cuda-events"
    assert cuda_clock.device == torch.device("cuda", 1)


class FakeEvent:
    """A CUDA event on a fake clock: records the stream's time; completes when told."""

    def __init__(self, now):
        self.now = now
        self.time_ms = None
        self.done = False
        self.waited = False

    def record(self, stream):
        assert stream == "stream-of-cuda:0"
        self.time_ms = self.now[0]

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True
        self.done = True

    def elapsed_time(self, end):
        assert end.done, "elapsed_time before the end event completed"
        return end.time_ms - self.time_ms


def test_cuda_event_timing_counts_device_time_not_queueing():
    now = [0.0]
    events = []

    def new_event():
        events.append(FakeEvent(now))
        return events[-1]

    clock = CudaEventClock(torch.device("cuda", 0), new_event=new_event,
                           current_stream=lambda: "stream-of-cuda:0")
    stats = TransferStats()
    started = clock.start()
    now[0] = 250.0                      # the GPU finishes the copy 250 ms later
    clock.stop(started, stats)
    assert stats.seconds == 0.0         # still in flight: nothing counted yet
    stats.settle(wait=False)
    assert stats.seconds == 0.0
    d = stats.to_dict()                 # waits for the end event
    assert events[1].waited and d["seconds"] == pytest.approx(0.25) and stats.seconds == pytest.approx(0.25)
    stats.settle()
    assert stats.seconds == pytest.approx(0.25)      # counted once


def test_pending_timings_fold_in_without_waiting():
    now = [0.0]
    clock = CudaEventClock(torch.device("cuda", 0), new_event=lambda: FakeEvent(now),
                           current_stream=lambda: "stream-of-cuda:0")
    stats = TransferStats()
    for i in range(3):
        started = clock.start()
        now[0] += 10.0
        clock.stop(started, stats)
    stats._pending[0][1].done = True
    stats._pending[2][1].done = True        # finished, but after an unfinished one: keep order
    stats.settle(wait=False)
    assert stats.seconds == pytest.approx(0.01) and len(stats._pending) == 2


def test_cpu_transfers_keep_wall_time(big_host):
    rec = small_record(enable_hierarchical_cache=True, hicache_io_backend="direct")
    with build_memory(rec, host_memory=big_host, strict_io=False) as m:
        x = make_transfer(m.device_pool, m.host_pool, "direct")
        assert isinstance(x.clock, WallClock)
        x.backup(torch.tensor([1, 2]), torch.tensor([3, 4]))
        x.synchronize()
        st = x.stats["backup"]
        assert st.calls == 1 and st.seconds > 0 and not st._pending
        assert st.to_dict()["bytes"] == st.bytes > 0
