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
``tail`` tokens.  Block size and warps are autotuned on GPUs; under the interpreter
(``TRITON_INTERPRET=1``) a fixed block is used.

Kernels are created lazily, because Triton decides at decoration time whether a function
is compiled or interpreted.
"""
import os
from typing import Dict, List, Optional, Tuple

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


def _page_copy(src, dst, src_pages, dst_pages, n_pages, tail_elems, LSEL,
               s_c, s_l, s_p, s_t, s_h,
               d_c, d_l, d_p, d_t, d_h,
               HD, D, page_elems, MODE: tl.constexpr, BLOCK: tl.constexpr):
    pid_p = tl.program_id(0)
    pid_cl = tl.program_id(1)
    pid_b = tl.program_id(2)
    c = (pid_cl // LSEL).to(tl.int64)
    l = (pid_cl % LSEL).to(tl.int64)
    sp = tl.load(src_pages + pid_p).to(tl.int64)
    dp = tl.load(dst_pages + pid_p).to(tl.int64)
    lim = tl.where(pid_p == n_pages - 1, tail_elems, page_elems)
    e = (pid_b * BLOCK + tl.arange(0, BLOCK)).to(tl.int64)
    mask = e < lim
    src_base = c * s_c + l * s_l + sp * s_p
    dst_base = c * d_c + l * d_l + dp * d_p
    if MODE == 0:      # whole page contiguous on both sides
        so = e
        do = e
    elif MODE == 1:    # each token row (H*D) contiguous on both sides
        t = e // HD
        r = e - t * HD
        so = t * s_t + r
        do = t * d_t + r
    else:              # only the innermost dim is contiguous
        t = e // HD
        r = e - t * HD
        h = r // D
        d = r - h * D
        so = t * s_t + h * s_h + d
        do = t * d_t + h * d_h + d
    x = tl.load(src + src_base + so, mask=mask)
    tl.store(dst + dst_base + do, x, mask=mask)


_KERNELS: Dict[bool, object] = {}


def _kernel():
    """The page-copy kernel for the current mode (autotuned when compiled)."""
    interp = interpreter_on()
    k = _KERNELS.get(interp)
    if k is None:
        jitted = triton.jit(_page_copy)
        if interp:
            k = jitted
        else:
            configs = [triton.Config({"BLOCK": b}, num_warps=w)
                       for b in (512, 1024, 2048, 4096) for w in (4, 8)]
            k = triton.autotune(configs=configs, key=["page_elems", "MODE", "LSEL"])(jitted)
        _KERNELS[interp] = k
    return k


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
            (_, h0, d0), (_, h1, d1) = pairs
            same = (h0.shape == h1.shape and h0.stride() == h1.stride() and d0.stride() == d1.stride()
                    and h0.untyped_storage().data_ptr() == h1.untyped_storage().data_ptr()
                    and d0.untyped_storage().data_ptr() == d1.untyped_storage().data_ptr())
            if same:
                return [[0, 1]]
        return [[i] for i in range(len(pairs))]

    def _copy(self, pairs, src_pages, dst_pages, tail, to_host) -> int:
        kernel = _kernel()
        dev = self.device_pool.device
        idx_dev = dev if dev.type == "cuda" else torch.device("cpu")
        n = src_pages.numel()
        sp = src_pages.to(idx_dev, non_blocking=True)
        dp = dst_pages.to(idx_dev, non_blocking=True)
        launches = 0
        for group in self._groups:
            members = [pairs[i] for i in group]
            hv = [m[1] for m in members]
            dv = [m[2] for m in members]
            src_v, dst_v = (dv, hv) if to_host else (hv, dv)
            ints = _as_ints(src_v + dst_v)
            if ints is None:  # cannot happen for canonical views; keep a clear message
                raise RuntimeError("Triton transfer: innermost axis is not contiguous")
            k = len(members)
            s_views, d_views = ints[:k], ints[k:]
            s0, d0 = s_views[0], d_views[0]
            es = s0.element_size()
            s_c = (s_views[1].data_ptr() - s0.data_ptr()) // es if k > 1 else 0
            d_c = (d_views[1].data_ptr() - d0.data_ptr()) // es if k > 1 else 0
            LSEL, _, ps, H, D = s0.shape
            HD = H * D
            page_elems = ps * HD
            ss, ds = s0.stride(), d0.stride()
            if ss[2:] == (HD, D, 1) and ds[2:] == (HD, D, 1):
                mode = 0
            elif ss[3:] == (D, 1) and ds[3:] == (D, 1):
                mode = 1
            else:
                mode = 2
            args = (s0, d0, sp, dp, n, tail * HD, LSEL,
                    s_c, ss[0], ss[1], ss[2], ss[3],
                    d_c, ds[0], ds[1], ds[2], ds[3],
                    HD, D, page_elems)
            if interpreter_on() and dev.type != "cuda":
                block = min(1024, triton.next_power_of_2(page_elems))
                grid = (n, k * LSEL, triton.cdiv(page_elems, block))
                kernel[grid](*args, MODE=mode, BLOCK=block)
            else:
                grid = lambda meta: (n, k * LSEL, triton.cdiv(page_elems, meta["BLOCK"]))  # noqa: E731
                kernel[grid](*args, MODE=mode)
            launches += 1
        return launches


__all__ = ["TritonTransfer", "kernel_available", "interpreter_on"]
