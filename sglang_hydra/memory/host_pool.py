"""Host (L2) KV pool in every layout, with its page-slot free list.

Layouts (``P`` host pages, ``S = P * page_size`` host tokens):

=====================  ===============================  ==================================
layout                 MHA buffer (per K / V)           MLA buffer
=====================  ===============================  ==================================
layer_first            ``(L, S, H, D)``                 ``(L, S, 1, Dk)``
page_first             ``(S, L, H, D)``                 ``(S, L, 1, Dk)``
page_first_direct      ``(P, L, ps, H, D)``             ``(P, L, ps, 1, Dk)``
page_head              ``(P, H, ps, L, D)``             rejected
page_first_kv_split    rejected                         k ``(P, L, ps, 1, R)``, v ``(P, L, ps, 1, rope)``
=====================  ===============================  ==================================

With equal K and V shapes both halves sit in one ``kv_buffer`` of shape ``(2, ...)``
(``k_buffer = kv_buffer[0]``).  Every buffer can be seen as a *canonical* view
``(L, P, ps, H, D)``; transfers only ever work on canonical views, so a layout is nothing
more than a permutation of strides.
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Tuple

import torch

from .device_pool import AllocatorError, allocate_zeroed, torch_dtype
from .geometry import KVGeometry

# canonical (L, P, ps, H, D) from each layout's buffer
_TO_CANONICAL = {
    "layer_first": lambda b, P, ps: b.view(b.shape[0], P, ps, b.shape[2], b.shape[3]),
    "page_first": lambda b, P, ps: b.view(P, ps, *b.shape[1:]).permute(2, 0, 1, 3, 4),
    "page_first_direct": lambda b, P, ps: b.permute(1, 0, 2, 3, 4),
    "page_first_kv_split": lambda b, P, ps: b.permute(1, 0, 2, 3, 4),
    "page_head": lambda b, P, ps: b.permute(3, 0, 2, 1, 4),
}


def _cudart():
    """The CUDA runtime bindings torch ships (a function so tests can stand one in)."""
    return torch.cuda.cudart()


class PinnedHostBuffer:
    """An exact-size host buffer page-locked with ``cudaHostRegister``.

    ``torch.empty(..., pin_memory=True)`` goes through torch's caching host allocator,
    which rounds every block up to a power of two: a 33 GiB host pool would lock 64 GiB.
    Like the reference (anonymous mmap, then ``cudaHostRegister``), this maps exactly
    ``nbytes`` and registers exactly that range, so what the plan says is what is pinned.
    """

    def __init__(self, shape, dtype: torch.dtype, *, bar=None):
        import mmap

        numel = 1
        for d in shape:
            numel *= int(d)
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.nbytes = numel * itemsize
        self._map = mmap.mmap(-1, max(self.nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        raw = torch.frombuffer(self._map, dtype=torch.uint8, count=self.nbytes) if self.nbytes else \
            torch.empty(0, dtype=torch.uint8)
        self.tensor = raw.view(dtype).view(tuple(shape))
        step = 256 << 20
        for start in range(0, self.nbytes, step):   # touch every page: the memory is really there
            raw[start:start + step].zero_()
            if bar is not None:
                bar.update(min(step, self.nbytes - start))
        self.ptr = raw.data_ptr()
        self.registered = False
        if self.nbytes:
            rc = _cudart().cudaHostRegister(self.ptr, self.nbytes, 0)
            code = int(getattr(rc, "value", rc))
            if code != 0:
                raise RuntimeError(f"cudaHostRegister of {self.nbytes:,} host bytes failed (CUDA error {code}); "
                                   "the host KV tier cannot be pinned, reduce --hicache-size / --hicache-ratio")
            self.registered = True

    def release(self) -> None:
        """Unregister (idempotent); the mapping goes when the last tensor view does."""
        if self.registered:
            _cudart().cudaHostUnregister(self.ptr)
            self.registered = False
        self.tensor = None


class HostKVPool:
    """Host copy of KV pages in ``layout``; ``size`` tokens = ``page_num`` whole pages."""

    def __init__(self, geometry: KVGeometry, layout: str, size: int, *, pin_memory: bool = False,
                 bar=None):
        ps = geometry.page_size
        if size <= 0 or size % ps:
            raise AllocatorError(f"host pool size {size} must be a positive multiple of page_size {ps}")
        self.geometry = geometry
        self.layout = layout
        self.page_size = ps
        self.size = int(size)
        self.page_num = self.size // ps
        self.layer_num = geometry.layers
        self.dtype = torch_dtype(geometry.dtype)
        self.store_dtype = torch_dtype(geometry.store_dtype)
        self.pin_memory = bool(pin_memory)
        self.shapes: Dict[str, Tuple[int, ...]] = geometry.host_shapes(layout, self.size)
        self.size_per_token = geometry.bytes_per_token
        self.kv_buffer: Optional[torch.Tensor] = None
        self.buffers: Dict[str, torch.Tensor] = {}
        self._pinned: List[PinnedHostBuffer] = []
        try:
            if geometry.symmetric:
                shape = self.shapes["k"]
                self.kv_buffer = self._allocate((2,) + tuple(shape), bar)
                self.buffers = {"k": self.kv_buffer[0], "v": self.kv_buffer[1]}
            else:
                for name, shape in self.shapes.items():
                    self.buffers[name] = self._allocate(shape, bar)
        except BaseException:
            self._release_pinned()
            raise
            if geometry.is_mla:
                self.kv_buffer = self.buffers.get("kv", self.buffers.get("k"))
        self._lock = threading.RLock()
        self.closed = False
        self.clear()

    def _allocate(self, shape, bar) -> torch.Tensor:
        if not self.pin_memory:
            return allocate_zeroed(shape, self.store_dtype, "cpu", bar=bar)
        buf = PinnedHostBuffer(shape, self.store_dtype, bar=bar)
        self._pinned.append(buf)
        return buf.tensor

    @property
    def pinned_bytes(self) -> int:
        """Bytes page-locked for this pool (exactly the buffers' bytes when pinned)."""
        return sum(b.nbytes for b in self._pinned if b.registered)

    def _release_pinned(self) -> None:
        for b in self._pinned:
            b.release()
        self._pinned = []

    # ---- shape helpers -----------------------------------------------------------------
    @property
    def k_buffer(self) -> torch.Tensor:
        return self.buffers["kv" if "kv" in self.buffers else "k"]

    @property
    def v_buffer(self) -> Optional[torch.Tensor]:
        return self.buffers.get("v")

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def canonical(self, name: str) -> torch.Tensor:
        """Buffer ``name`` as a ``(L, page_num, page_size, H, D)`` view."""
        return _TO_CANONICAL[self.layout](self.buffers[name], self.page_num, self.page_size)

    def device_source(self, name: str) -> Tuple[str, Optional[slice]]:
        """Which device family (and which columns of its rows) feed host buffer ``name``."""
        if self.layout == "page_first_kv_split":
            r = self.geometry.kv_lora_rank
            return "kv", (slice(0, r) if name == "k" else slice(r, None))
        return name, None

    def get_size_per_token(self) -> int:
        return self.size_per_token

    # ---- slot free list ----------------------------------------------------------------
    def clear(self) -> None:
        with self._lock:
            self.free_slots = torch.arange(self.page_num, dtype=torch.int64)  # page ids; none reserved
            self.release_slots: List[torch.Tensor] = []
            self._used = torch.zeros(self.page_num, dtype=torch.bool)

    def available_size(self) -> int:
        with self._lock:
            return (len(self.free_slots) + sum(len(r) for r in self.release_slots)) * self.page_size

    def alloc_pages(self, num_pages: int) -> Optional[torch.Tensor]:
        with self._lock:
            if num_pages * self.page_size > self.available_size():
                return None
            if num_pages > len(self.free_slots):
                self.free_slots = torch.cat([self.free_slots] + self.release_slots)
                self.release_slots = []
            out = self.free_slots[:num_pages].clone()
            self.free_slots = self.free_slots[num_pages:]
            if bool(self._used[out].any()):
                raise AllocatorError(f"double allocation of host pages {out[self._used[out]].tolist()[:8]}")
            self._used[out] = True
            return out

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        """Token slots of whole host pages (``need_size`` a page multiple), or None."""
        if need_size % self.page_size:
            raise AllocatorError(f"host alloc({need_size}) is not a multiple of page_size {self.page_size}")
        pages = self.alloc_pages(need_size // self.page_size)
        if pages is None:
            return None
        ps = self.page_size
        return (pages.view(-1, 1) * ps + torch.arange(ps)).reshape(-1)

    def free_pages(self, pages: torch.Tensor) -> int:
        pages = torch.as_tensor(pages, dtype=torch.int64).to("cpu").view(-1)
        with self._lock:
            bad = pages[(pages < 0) | (pages >= self.page_num)]
            if bad.numel():
                raise AllocatorError(f"host pages {bad.tolist()[:8]} are outside 0..{self.page_num - 1}")
            if torch.unique(pages).numel() != pages.numel():
                raise AllocatorError(f"double free: a host page appears twice in {pages.tolist()[:16]}")
            not_used = pages[~self._used[pages]]
            if not_used.numel():
                raise AllocatorError(f"double free: host pages {not_used.tolist()[:8]} are not allocated")
            self._used[pages] = False
            self.release_slots.append(pages.clone())
            return int(pages.numel()) * self.page_size

    def free(self, indices: torch.Tensor) -> int:
        """Free the host pages holding token slots ``indices``; returns tokens freed."""
        idx = torch.as_tensor(indices).to("cpu", torch.int64).view(-1)
        if idx.numel() == 0:
            return 0
        return self.free_pages(torch.unique(idx // self.page_size))

    def close(self) -> None:
        self.buffers = {}
        self.kv_buffer = None
        self._release_pinned()
        self.closed = True


__all__ = ["HostKVPool"]
