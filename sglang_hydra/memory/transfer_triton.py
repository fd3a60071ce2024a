"""``kernel`` io backend: one Triton gather/scatter launch per transfer call.

Both pools are seen through canonical views ``(L, P, ps, H, D)``; a layout only changes
strides.  One program copies one block of one page of one layer of one buffer family:

* grid axis 0: the page pair ``i`` (source page ``src_pages[i]``, destination
  ``dst_pages[i]``),
* grid axis 1: ``family * layers + layer`` (K and V of a symmetric pool share one
  allocation on each side, so they are reached from one base pointer with a stride),
* grid axis 2: blocks of ``BLOCK`` elements inside the page (``ps * H * D`` elements).

Elements are walked in (token, head, dim) order so consecutive lanes touch consecutive
addresses along the innermost contiguous axis; when a whole page (or a whole token row)
is contiguous on both sides the index arithmetic is skipped (``MODE`` 0 / 1).  Data is
moved as raw integers of the widest width the strides allow, so every dtype (fp8 stored
as bytes, bf16, fp16, fp32) is copied bit for bit.  The last page may stop after
``tail`` tokens.

Block size and warps follow from the page size (:func:`block_for_page`), the same on a
GPU and under the interpreter (``TRITON_INTERPRET=1``), so every launch goes through one
path (:func:`plan_group_launch`, then :func:`launch`).  There is no autotuning: Triton's
autotuner would run its trial configurations as real copies on the live pools the first
time each shape is seen, and a copy is memory-bound, so the block only has to be large
enough to keep every lane busy with wide loads.

Kernels are created lazily, because Triton decides at decoration time whether a function
is compiled or interpreted.
"""
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from .transfer_direct import TransferBackend

try:  # Triton is optional at import time; availability is checked by ``kernel_available``
    import triton
    import triton.language as tl
except Exception:  # pragma: no cover
    triton = None

    class tl:  # noqa: N801 - stand-in so the kernel signature below still parses
        constexpr = object


def interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def kernel_available(device: torch.device) -> Tuple[bool, str]:
    """Can the Triton backend run for pools on ``device``? (ok, reason when not)."""
    if triton is None:
        return False, "triton is not installed"
    if device.type == "cuda":
        return True, ""
    if interpreter_on():
        return True, "Triton interpreter (TRITON_INTERPRET=1)"
    return False, (f"no GPU for the Triton kernels (device {device.type}) and TRITON_INTERPRET is not set")


def _page_copy(src, dst, src_pages, dst_pages, n_pages, tail_elems, n_layers,
               src_family_stride, src_layer_stride, src_page_stride, src_token_stride, src_head_stride,
               dst_family_stride, dst_layer_stride, dst_page_stride, dst_token_stride, dst_head_stride,
               row_elems, head_dim, page_elems, MODE: tl.constexpr, BLOCK: tl.constexpr):
    pair = tl.program_id(0)
    family_layer = tl.program_id(1)
    block = tl.program_id(2)
    family = (family_layer // n_layers).to(tl.int64)
    layer = (family_layer % n_layers).to(tl.int64)
    src_page = tl.load(src_pages + pair).to(tl.int64)
    dst_page = tl.load(dst_pages + pair).to(tl.int64)
    limit = tl.where(pair == n_pages - 1, tail_elems, page_elems)
    elem = (block * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = elem < limit
    src_base = family * src_family_stride + layer * src_layer_stride + src_page * src_page_stride
    dst_base = family * dst_family_stride + layer * dst_layer_stride + dst_page * dst_page_stride
    if MODE == 0:      # whole page contiguous on both sides
        src_offset = elem
        dst_offset = elem
    elif MODE == 1:    # each token row (H*D) contiguous on both sides
        token = elem // row_elems
        in_row = elem - token * row_elems
        src_offset = token * src_token_stride + in_row
        dst_offset = token * dst_token_stride + in_row
    else:              # only the innermost dim is contiguous
        token = elem // row_elems
        in_row = elem - token * row_elems
        head = in_row // head_dim
        dim = in_row - head * head_dim
        src_offset = token * src_token_stride + head * src_head_stride + dim
        dst_offset = token * dst_token_stride + head * dst_head_stride + dim
    x = tl.load(src + src_base + src_offset, mask=mask)
    tl.store(dst + dst_base + dst_offset, x, mask=mask)


_KERNELS: Dict[bool, object] = {}


def _kernel():
    """The page-copy kernel, compiled or interpreted as ``TRITON_INTERPRET`` says now."""
    interpreted = interpreter_on()
    kernel = _KERNELS.get(interpreted)
    if kernel is None:
        kernel = _KERNELS[interpreted] = triton.jit(_page_copy)
    return kernel


# ---------------------------------------------------------------------- launch configuration
#: at most this many bytes per program: 16 KiB keeps 8 warps busy with 16-byte accesses
#: (64 bytes per lane) while a page of a few KiB still spreads over several programs
MAX_BYTES_PER_PROGRAM = 16 << 10
#: smallest block (elements): one warp with four elements per lane
MIN_BLOCK = 128


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def block_for_page(page_elems: int, elem_bytes: int) -> Tuple[int, int]:
    """``(BLOCK, num_warps)`` for pages of ``page_elems`` integers of ``elem_bytes`` each.

    A block covers the whole page when the page is at most ``MAX_BYTES_PER_PROGRAM``
    (rounded up to a power of two, as ``tl.arange`` needs), else the largest power of two
    within it; warps grow with the bytes a program moves."""
    if page_elems < 1 or elem_bytes not in (1, 2, 4, 8):
        raise ValueError(f"no launch for pages of {page_elems} elements of {elem_bytes} bytes")
    cap = max(MIN_BLOCK, MAX_BYTES_PER_PROGRAM // elem_bytes)
    block = min(cap, max(MIN_BLOCK, _next_power_of_2(page_elems)))
    program_bytes = block * elem_bytes
    warps = 8 if program_bytes >= 16 << 10 else 4 if program_bytes >= 4 << 10 else 2
    return block, warps


@dataclass(frozen=True)
class GroupLaunch:
    """One kernel launch: grid, positional arguments and the compile-time/launch options."""

    grid: Tuple[int, int, int]
    args: Tuple[Any, ...]
    mode: int
    block: int
    num_warps: int

    @property
    def options(self) -> Dict[str, int]:
        return {"MODE": self.mode, "BLOCK": self.block, "num_warps": self.num_warps}


def copy_mode(src_strides, dst_strides, row_elems: int, head_dim: int) -> int:
    """0: whole pages contiguous on both sides, 1: token rows contiguous, 2: only head_dim."""
    if src_strides[2:] == (row_elems, head_dim, 1) and dst_strides[2:] == (row_elems, head_dim, 1):
        return 0
    if src_strides[3:] == (head_dim, 1) and dst_strides[3:] == (head_dim, 1):
        return 1
    return 2


def plan_group_launch(src_views: List[torch.Tensor], dst_views: List[torch.Tensor], src_pages: torch.Tensor,
                      dst_pages: torch.Tensor, tail_tokens: int) -> GroupLaunch:
    """The launch copying ``src_pages[i]`` -> ``dst_pages[i]`` for equally shaped families.

    ``src_views``/``dst_views`` are canonical ``(L, P, ps, H, D)`` integer views, one per
    family of the group; families after the first are reached from the first one's base
    pointer with a constant stride.  Builds the arguments only (nothing runs), the same
    way for every device."""
    families = len(src_views)
    src0, dst0 = src_views[0], dst_views[0]
    elem_bytes = src0.element_size()
    src_family_stride = (src_views[1].data_ptr() - src0.data_ptr()) // elem_bytes if families > 1 else 0
    dst_family_stride = (dst_views[1].data_ptr() - dst0.data_ptr()) // elem_bytes if families > 1 else 0
    n_layers, _, page_size, heads, head_dim = src0.shape
    row_elems = heads * head_dim
    page_elems = page_size * row_elems
    src_strides, dst_strides = src0.stride(), dst0.stride()
    n_pages = src_pages.numel()
    block, warps = block_for_page(page_elems, elem_bytes)
    args = (src0, dst0, src_pages, dst_pages, n_pages, tail_tokens * row_elems, n_layers,
            src_family_stride, *src_strides[:4],
            dst_family_stride, *dst_strides[:4],
            row_elems, head_dim, page_elems)
    grid = (n_pages, families * n_layers, -(-page_elems // block))
    return GroupLaunch(grid, args, copy_mode(src_strides, dst_strides, row_elems, head_dim), block, warps)


def launch(kernel, plan: GroupLaunch) -> None:
    kernel[plan.grid](*plan.args, **plan.options)


_WIDTHS = (torch.int64, torch.int32, torch.int16, torch.uint8)


def _as_ints(views: List[torch.Tensor]) -> Optional[List[torch.Tensor]]:
    """Reinterpret all views as the widest integer type every one of them allows."""
    itemsize = views[0].element_size()
    for dt in _WIDTHS:
        if dt.itemsize < itemsize:
            continue
        try:
            out = [v.view(dt) if v.dtype != dt else v for v in views]
        except RuntimeError:
            continue
        if all(o.stride(-1) == 1 for o in out):
            return out
    return None


class TritonTransfer(TransferBackend):
    """``kernel`` io backend."""

    name = "kernel"

    def __init__(self, device_pool, host_pool, requested=None, note=""):
        super().__init__(device_pool, host_pool, requested, note)
        # group host families that can share a launch (same shapes, one allocation per side)
        self._groups = self._plan_groups()

    def _plan_groups(self):
        pairs = self._pairs
        if len(pairs) == 2:
            (_, host0, dev0), (_, host1, dev1) = pairs
            same = (host0.shape == host1.shape and host0.stride() == host1.stride()
                    and dev0.stride() == dev1.stride()
                    and host0.untyped_storage().data_ptr() == host1.untyped_storage().data_ptr()
                    and dev0.untyped_storage().data_ptr() == dev1.untyped_storage().data_ptr())
            if same:
                return [[0, 1]]
        return [[i] for i in range(len(pairs))]

    def _page_index(self, pages: torch.Tensor) -> torch.Tensor:
        """Page ids where the kernel reads them: on the GPU for CUDA pools, else on the host."""
        device = self.device_pool.device
        return pages.to(device, non_blocking=True) if device.type == "cuda" else pages

    def plan_launches(self, pairs, src_index, dst_index, tail, to_host) -> List[GroupLaunch]:
        """Every launch one transfer call makes (arguments only, nothing runs)."""
        plans = []
        for group in self._groups:
            members = [pairs[i] for i in group]
            host_views = [m[1] for m in members]
            device_views = [m[2] for m in members]
            src_views, dst_views = (device_views, host_views) if to_host else (host_views, device_views)
            ints = _as_ints(src_views + dst_views)
            if ints is None:  # cannot happen for canonical views; keep a clear message
                raise RuntimeError("Triton transfer: innermost axis is not contiguous")
            k = len(members)
            plans.append(plan_group_launch(ints[:k], ints[k:], src_index, dst_index, tail))
        return plans

    def _copy(self, pairs, src_pages, dst_pages, tail, to_host) -> int:
        kernel = _kernel()
        plans = self.plan_launches(pairs, self._page_index(src_pages), self._page_index(dst_pages), tail, to_host)
        for plan in plans:
            launch(kernel, plan)
        return len(plans)


__all__ = ["TritonTransfer", "kernel_available", "interpreter_on", "block_for_page", "plan_group_launch",
           "GroupLaunch", "copy_mode", "launch"]
