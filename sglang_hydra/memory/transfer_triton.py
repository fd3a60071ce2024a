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

The widest access each lane may make (``VEC`` elements: what the base pointers, strides and
row length allow, at most 16 bytes) is computed at launch (:func:`vector_elems`) and reaches
the kernel as a constexpr that backs its ``tl.multiple_of``/``tl.max_contiguous`` hints;
block size and warps follow from the page size and ``VEC`` (:func:`block_for_page`).  All
of it is the same on a GPU and under the interpreter (``TRITON_INTERPRET=1``), so every
launch goes through one path (:func:`plan_group_launch`, then :func:`launch`), and the
compile key is ``(integer width, MODE, BLOCK, VEC, num_warps)``: no scalar argument is
specialised on its value.  ``scripts/compile_kernels.py`` compiles every such key the
launch path can produce for sm_80/sm_89/sm_90 without a GPU (``memory/kernel_compile.py``).  There is no autotuning: Triton's
autotuner would run its trial configurations as real copies on the live pools the first
time each shape is seen, and a copy is memory-bound, so the block only has to be large
enough to keep every lane busy with wide loads.

Kernels are created lazily, because Triton decides at decoration time whether a function
is compiled or interpreted.
"""
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

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


def _page_copy(src, dst, src_pages, dst_pages, n_pages: tl.int32, tail_elems: tl.int32, n_layers: tl.int32,
               src_family_stride: tl.int64, src_layer_stride: tl.int64, src_page_stride: tl.int64,
               src_token_stride: tl.int64, src_head_stride: tl.int64,
               dst_family_stride: tl.int64, dst_layer_stride: tl.int64, dst_page_stride: tl.int64,
               dst_token_stride: tl.int64, dst_head_stride: tl.int64,
               row_elems: tl.int32, head_dim: tl.int32, page_elems: tl.int32,
               MODE: tl.constexpr, BLOCK: tl.constexpr, VEC: tl.constexpr):
    pair = tl.program_id(0)
    family_layer = tl.program_id(1)
    block = tl.program_id(2)
    family = family_layer // n_layers
    layer = family_layer - family * n_layers
    src_page = tl.load(src_pages + pair).to(tl.int64)
    dst_page = tl.load(dst_pages + pair).to(tl.int64)
    # every limit is whole token rows, and VEC divides a row: masks come in groups of VEC
    limit = tl.multiple_of(tl.where(pair == n_pages - 1, tail_elems, page_elems), VEC)
    # offsets inside a page stay 32-bit (a page is far below 2**31 elements): the
    # divisions below are 32-bit; only the page bases need 64 bits
    elem = block * BLOCK + tl.arange(0, BLOCK)
    mask = elem < limit
    src_base = family.to(tl.int64) * src_family_stride + layer.to(tl.int64) * src_layer_stride \
        + src_page * src_page_stride
    dst_base = family.to(tl.int64) * dst_family_stride + layer.to(tl.int64) * dst_layer_stride \
        + dst_page * dst_page_stride
    if MODE == 0:      # whole page contiguous on both sides
        src_offset = elem
        dst_offset = elem
    elif MODE == 1:    # each token row (H*D) contiguous on both sides
        token = elem // row_elems
        in_row = elem - token * row_elems
        src_offset = token.to(tl.int64) * src_token_stride + in_row
        dst_offset = token.to(tl.int64) * dst_token_stride + in_row
    else:              # only the innermost dim is contiguous
        token = elem // row_elems
        in_row = elem - token * row_elems
        head = in_row // head_dim
        dim = in_row - head * head_dim
        src_offset = token.to(tl.int64) * src_token_stride + head.to(tl.int64) * src_head_stride + dim
        dst_offset = token.to(tl.int64) * dst_token_stride + head.to(tl.int64) * dst_head_stride + dim
    # VEC consecutive elements from a multiple of VEC are contiguous on both sides, and the
    # page bases sit on VEC-element boundaries (the launch checked pointers and strides),
    # so each lane can move VEC elements with one vector access
    src_offset = tl.max_contiguous(tl.multiple_of(src_offset, VEC), VEC)
    dst_offset = tl.max_contiguous(tl.multiple_of(dst_offset, VEC), VEC)
    src_row = tl.multiple_of(src + src_base, VEC * (src.dtype.element_ty.primitive_bitwidth // 8))  # bytes
    dst_row = tl.multiple_of(dst + dst_base, VEC * (dst.dtype.element_ty.primitive_bitwidth // 8))
    x = tl.load(src_row + src_offset, mask=mask)
    tl.store(dst_row + dst_offset, x, mask=mask)


#: the compile key is (integer width, MODE, BLOCK, VEC, num_warps) and nothing else: no
#: scalar is specialised on its value (Triton would otherwise compile a new variant when,
#: say, a call moves one page or its tail stops on a multiple of 16), and pointer alignment
#: reaches the kernel only through VEC
_UNSPECIALISED = ("n_pages", "tail_elems", "n_layers",
                  "src_family_stride", "src_layer_stride", "src_page_stride", "src_token_stride", "src_head_stride",
                  "dst_family_stride", "dst_layer_stride", "dst_page_stride", "dst_token_stride", "dst_head_stride",
                  "row_elems", "head_dim", "page_elems")
_ALIGNMENT_FREE = ("src", "dst", "src_pages", "dst_pages")


def jit_page_copy():
    """A new ``triton.jit`` of the page-copy kernel with the specialisation rules above."""
    return triton.jit(_page_copy, do_not_specialize=_UNSPECIALISED, do_not_specialize_on_alignment=_ALIGNMENT_FREE)


_KERNELS: Dict[bool, object] = {}


def _kernel():
    """The page-copy kernel, compiled or interpreted as ``TRITON_INTERPRET`` says now."""
    interpreted = interpreter_on()
    kernel = _KERNELS.get(interpreted)
    if kernel is None:
        kernel = _KERNELS[interpreted] = jit_page_copy()
    return kernel


# ---------------------------------------------------------------------- launch configuration
#: at most this many bytes per program with 16-byte accesses: 16 KiB keeps 8 warps busy
#: (four accesses, 64 bytes, per lane) while a page of a few KiB still spreads over
#: several programs
MAX_BYTES_PER_PROGRAM = 16 << 10
#: widest access of one lane (``ld.global.v4.b32``)
LANE_BYTES = 16
#: smallest block, in bytes of 16-byte accesses: one warp with one access per lane (a
#: smaller block would leave lanes idle or with narrower accesses)
MIN_BLOCK_BYTES = 32 * LANE_BYTES
#: element widths the kernel moves (raw integers of 1, 2, 4 or 8 bytes)
ELEMENT_BYTES = (1, 2, 4, 8)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def block_for_page(page_elems: int, elem_bytes: int, vec: Optional[int] = None) -> Tuple[int, int]:
    """``(BLOCK, num_warps)`` for pages of ``page_elems`` integers of ``elem_bytes`` each,
    moved ``vec`` elements per access (default: a full 16-byte access).

    Sizes are counted in accesses, so a lane always has between one and four of them: a
    block covers the whole page when the page is at most ``MAX_BYTES_PER_PROGRAM`` worth of
    16-byte accesses (rounded up to a power of two, as ``tl.arange`` needs, and to at
    least one warp of accesses), else the largest power of two within it; warps grow with
    the accesses a program makes.  Narrow accesses (rows whose length or alignment allows
    no 16-byte access) get proportionally smaller blocks: a lane with dozens of scalar
    accesses runs out of registers and spills."""
    full = LANE_BYTES // elem_bytes if elem_bytes in ELEMENT_BYTES else 0
    vec = full if vec is None else vec
    if page_elems < 1 or not full or vec < 1 or vec > full or vec & (vec - 1):
        raise ValueError(f"no launch for pages of {page_elems} elements of {elem_bytes} bytes, {vec} per access")
    cap = max(1, MAX_BYTES_PER_PROGRAM // LANE_BYTES) * vec
    smallest = max(1, MIN_BLOCK_BYTES // LANE_BYTES) * vec
    block = min(cap, max(smallest, _next_power_of_2(page_elems)))
    accesses = block // vec
    warps = 8 if accesses >= 1024 else 4 if accesses >= 256 else 2 if accesses >= 64 else 1
    return block, warps


def vector_elems(elem_bytes: int, pointers: Sequence[int], strides: Sequence[int], run: int) -> int:
    """Elements one lane may move with one access: the largest power of two ``v`` with
    ``v * elem_bytes <= LANE_BYTES`` that divides every stride, the contiguous ``run``
    (token row or head dim) and every base pointer (in bytes)."""
    v = max(1, LANE_BYTES // elem_bytes)
    while v > 1 and (any(p % (v * elem_bytes) for p in pointers) or any(s % v for s in strides) or run % v):
        v //= 2
    return v


@dataclass(frozen=True)
class GroupLaunch:
    """One kernel launch: grid, positional arguments and the compile-time/launch options."""

    grid: Tuple[int, int, int]
    args: Tuple[Any, ...]
    mode: int
    block: int
    num_warps: int
    vec: int = 1

    @property
    def options(self) -> Dict[str, int]:
        return {"MODE": self.mode, "BLOCK": self.block, "VEC": self.vec, "num_warps": self.num_warps}


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
    mode = copy_mode(src_strides, dst_strides, row_elems, head_dim)
    # strides the kernel multiplies by: family/layer/page always, token rows from MODE 1,
    # heads in MODE 2; the contiguous run a lane may not cross is a row, or a head in MODE 2
    used = 3 if mode == 0 else 4 if mode == 1 else 5
    strides = (src_family_stride, dst_family_stride) + tuple(src_strides[:used - 1]) + tuple(dst_strides[:used - 1])
    vec = vector_elems(elem_bytes, (src0.data_ptr(), dst0.data_ptr()), strides,
                       head_dim if mode == 2 else row_elems)
    block, warps = block_for_page(page_elems, elem_bytes, vec)
    args = (src0, dst0, src_pages, dst_pages, n_pages, tail_tokens * row_elems, n_layers,
            src_family_stride, *src_strides[:4],
            dst_family_stride, *dst_strides[:4],
            row_elems, head_dim, page_elems)
    grid = (n_pages, families * n_layers, -(-page_elems // block))
    return GroupLaunch(grid, args, mode, block, warps, vec)


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
           "GroupLaunch", "copy_mode", "launch", "vector_elems", "jit_page_copy"]
