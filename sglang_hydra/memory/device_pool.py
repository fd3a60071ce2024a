"""Device KV pool (MHA and MLA) and its page allocator.

Storage model.  Every buffer family ("k"/"v" for MHA, "kv" for MLA) is one tensor of shape
``(L, rows, H, D)`` with ``rows = size + page_size``: the first page is the padding page
that absorbs writes of padded tokens and is never handed out.  ``buffer[l]`` is layer
``l``'s buffer, contiguous, with page ``p`` at rows ``[p*page_size, (p+1)*page_size)``.
When K and V have the same shape both live in one ``(2, L, rows, H, D)`` allocation so a
copy kernel can reach V from K's base with one stride.  fp8 caches are stored as bytes
(indexed writes do not support fp8) and viewed back as fp8 on read.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .errors import setup_error
from .geometry import KVGeometry

TORCH_DTYPES = {
    "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
    "uint8": torch.uint8,
    "float8_e4m3fn": getattr(torch, "float8_e4m3fn", None),
    "float8_e5m2": getattr(torch, "float8_e5m2", None),
}

_ZERO_CHUNK = 256 << 20  # zero big buffers in slices so a progress bar can move


def torch_dtype(name: str) -> torch.dtype:
    dt = TORCH_DTYPES.get(name)
    if dt is None:
        raise setup_error("kv_cache_dtype", f"this torch build has no {name} type")
    return dt


def allocate_zeroed(shape: Sequence[int], dtype: torch.dtype, device, *, pin_memory: bool = False,
                    bar=None) -> torch.Tensor:
    """``torch.zeros`` that touches memory slice by slice and advances ``bar`` by bytes."""
    t = torch.empty(tuple(shape), dtype=dtype, device=device, pin_memory=pin_memory)
    flat = t.view(-1).view(torch.uint8) if t.numel() else t.view(-1)
    n = flat.numel()
    step = _ZERO_CHUNK
    for start in range(0, n, step):
        flat[start:start + step].zero_()
        if bar is not None:
            bar.update(min(step, n - start))
    return t


class DeviceKVPool:
    """Per-layer K/V (MHA) or latent (MLA) buffers for ``size`` tokens plus a padding page."""

    def __init__(self, geometry: KVGeometry, size: int, device="cpu", *, bar=None):
        ps = geometry.page_size
        if size <= 0 or size % ps:
            raise setup_error("max_total_tokens",
                              f"device pool size {size} must be a positive multiple of page_size {ps}")
        self.geometry = geometry
        self.size = int(size)
        self.page_size = ps
        self.device = torch.device(device)
        self.dtype = torch_dtype(geometry.dtype)
        self.store_dtype = torch_dtype(geometry.store_dtype)
        self.layer_num = geometry.layers
        self.rows = self.size + ps
        self.num_pages = self.size // ps          # pages the allocator hands out: 1..num_pages
        self.total_pages = self.rows // ps        # including the padding page 0
        L = geometry.layers
        self._storage: Optional[torch.Tensor] = None
        self.buffers: Dict[str, torch.Tensor] = {}
        if geometry.symmetric:
            _, H, D = geometry.components[0]
            self._storage = allocate_zeroed((2, L, self.rows, H, D), self.store_dtype, self.device, bar=bar)
            self.buffers = {"k": self._storage[0], "v": self._storage[1]}
        else:
            for name, H, D in geometry.components:
                self.buffers[name] = allocate_zeroed((L, self.rows, H, D), self.store_dtype, self.device, bar=bar)
        self.closed = False

    # ---- reference-style accessors ----------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.geometry.is_mla

    @property
    def k_buffer(self) -> List[torch.Tensor]:
        return list(self.buffers["kv" if self.is_mla else "k"].unbind(0))

    @property
    def v_buffer(self) -> List[torch.Tensor]:
        if self.is_mla:
            return [b[..., :self.geometry.kv_lora_rank] for b in self.buffers["kv"].unbind(0)]
        return list(self.buffers["v"].unbind(0))

    @property
    def kv_buffer(self) -> List[torch.Tensor]:
        return list(self.buffers["kv"].unbind(0)) if self.is_mla else self.k_buffer

    def _typed(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.dtype) if self.store_dtype != self.dtype else t

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self._typed(self.buffers["kv" if self.is_mla else "k"][layer_id])

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        if self.is_mla:
            return self._typed(self.buffers["kv"][layer_id][..., :self.geometry.kv_lora_rank])
        return self._typed(self.buffers["v"][layer_id])

    def get_kv_buffer(self, layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor,
                      cache_v: Optional[torch.Tensor] = None) -> None:
        """Write token rows ``loc`` of one layer (values cast to the cache dtype)."""
        def put(buf, val):
            if val.dtype != self.dtype:
                val = val.to(self.dtype)
            if self.store_dtype != self.dtype:
                val = val.view(self.store_dtype)
            buf[loc] = val
        if self.is_mla:
            put(self.buffers["kv"][layer_id], cache_k)
        else:
            put(self.buffers["k"][layer_id], cache_k)
            put(self.buffers["v"][layer_id], cache_v)

    # ---- for transfer engines ---------------------------------------------------------
    def contiguous_buffers(self) -> List[Tuple[str, torch.Tensor]]:
        """``(name, tensor)`` per layer and family, e.g. ``("k.0", (rows, H, D))``.

        Each tensor is contiguous; page ``p`` is rows ``[p*page_size, (p+1)*page_size)``.
        """
        out = []
        for name, buf in self.buffers.items():
            for l in range(buf.shape[0]):
                t = buf[l]
                assert t.is_contiguous()
                out.append((f"{name}.{l}", t))
        return out

    @property
    def page_bytes_per_buffer(self) -> List[int]:
        """Bytes of one page in each tensor of :meth:`contiguous_buffers`, same order."""
        return [t[:self.page_size].numel() * t.element_size() for _, t in self.contiguous_buffers()]

    def get_kv_size_bytes(self):
        """(K bytes, V bytes) for MHA, total bytes for MLA (padding page included)."""
        sizes = {n: b.numel() * b.element_size() for n, b in self.buffers.items()}
        return sizes["kv"] if self.is_mla else (sizes["k"], sizes["v"])

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())

    def canonical(self, name: str) -> torch.Tensor:
        """Family ``name`` as ``(L, total_pages, page_size, H, D)`` (a view)."""
        b = self.buffers[name]
        L, _, H, D = b.shape
        return b.view(L, self.total_pages, self.page_size, H, D)

    def close(self) -> None:
        self.buffers = {}
        self._storage = None
        self.closed = True


class AllocatorError(RuntimeError):
    """Misuse of an allocator: double free, foreign page, unaligned request."""


def page_token_slots(pages: torch.Tensor, page_size: int) -> torch.Tensor:
    """The token slots of whole pages, page after page: page ``p`` holds slots
    ``p*page_size`` to ``p*page_size + page_size - 1`` (the same in device and host pools)."""
    return (pages.view(-1, 1) * page_size + torch.arange(page_size, dtype=torch.int64)).reshape(-1)


def whole_pages_alloc(alloc_pages: Callable[[int], Optional[torch.Tensor]], need_size: int, page_size: int,
                      pool: str = "") -> Optional[torch.Tensor]:
    """The token slots of ``need_size // page_size`` pages from ``alloc_pages``, or None when
    they do not fit; ``need_size`` must be a whole number of pages (device and host pools)."""
    if need_size % page_size:
        raise AllocatorError(f"{pool}alloc({need_size}) is not a multiple of page_size {page_size}")
    pages = alloc_pages(need_size // page_size)
    return None if pages is None else page_token_slots(pages, page_size)


class PageAllocator:
    """Page-granular slot allocator with the reference's semantics.

    * page 0 is the padding page and is never handed out; pages ``1..num_pages`` are;
    * ``alloc(n)`` takes ``n`` tokens (a whole number of pages) from the front of the free
      list and returns their token indices, or ``None`` when there are not enough pages
      (never a partial allocation);
    * ``free`` returns pages; with ``page_size > 1`` they go to the *front* (recently freed
      pages are reused first), with ``page_size == 1`` to the back, like the reference's
      token allocator; with ``need_sort`` they are parked and merged in ascending order
      only when the free list runs short;
    * freeing a page that is not allocated (double free, padding page, out of range)
      raises :class:`AllocatorError` and changes nothing.
    """

    def __init__(self, size: int, page_size: int = 1, device="cpu", need_sort: bool = False):
        self.size = int(size)
        self.page_size = int(page_size)
        self.device = torch.device(device)
        self.need_sort = need_sort
        self.num_pages = self.size // self.page_size
        self._free_group: Optional[List[torch.Tensor]] = None
        self.clear()

    def clear(self) -> None:
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)
        self.release_pages = torch.empty(0, dtype=torch.int64)
        self._allocated = torch.zeros(self.num_pages + 1, dtype=torch.bool)
        self._free_group = None

    def available_size(self) -> int:
        """Free tokens (parked pages included)."""
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size

    def _merge_and_sort(self) -> None:
        if len(self.release_pages):
            self.free_pages = torch.cat((self.free_pages, self.release_pages)).sort().values
            self.release_pages = torch.empty(0, dtype=torch.int64)

    def alloc_pages(self, num_pages: int) -> Optional[torch.Tensor]:
        """``num_pages`` page ids, or None if the pool is short."""
        if num_pages < 0:
            raise AllocatorError(f"cannot allocate {num_pages} pages")
        if self.need_sort and num_pages > len(self.free_pages):
            self._merge_and_sort()
        if num_pages > len(self.free_pages):
            return None
        out = self.free_pages[:num_pages].clone()
        self.free_pages = self.free_pages[num_pages:]
        if bool(self._allocated[out].any()):  # would mean the free list is corrupt
            raise AllocatorError(f"double allocation of pages {out[self._allocated[out]].tolist()}")
        self._allocated[out] = True
        return out

    def alloc(self, need_size: int) -> Optional[torch.Tensor]:
        """Token indices of ``need_size // page_size`` fresh pages, or None."""
        slots = whole_pages_alloc(self.alloc_pages, need_size, self.page_size)
        return None if slots is None else slots.to(self.device)

    def pages_to_tokens(self, pages: torch.Tensor) -> torch.Tensor:
        return page_token_slots(pages, self.page_size)

    def free(self, indices: torch.Tensor) -> None:
        """Free the pages that contain token ``indices``."""
        if indices is None or indices.numel() == 0:
            return
        idx = indices.detach().to("cpu", torch.int64).view(-1)
        self.free_page_ids(torch.unique(idx // self.page_size))

    def free_page_ids(self, pages: torch.Tensor) -> None:
        pages = torch.as_tensor(pages, dtype=torch.int64).to("cpu").view(-1)
        if pages.numel() == 0:
            return
        bad = pages[(pages < 1) | (pages > self.num_pages)]
        if bad.numel():
            raise AllocatorError(f"pages {bad.tolist()[:8]} are outside 1..{self.num_pages} "
                                 "(page 0 is the reserved padding page)")
        if torch.unique(pages).numel() != pages.numel():
            raise AllocatorError(f"double free: a page appears twice in {pages.tolist()[:16]}")
        not_alloc = pages[~self._allocated[pages]]
        if not_alloc.numel():
            raise AllocatorError(f"double free: pages {not_alloc.tolist()[:8]} are not allocated")
        self._allocated[pages] = False
        if self._free_group is not None:
            self._free_group.append(pages)
            return
        self._return(pages)

    def _return(self, pages: torch.Tensor) -> None:
        if self.need_sort:
            self.release_pages = torch.cat((self.release_pages, pages))
        elif self.page_size > 1:
            self.free_pages = torch.cat((pages, self.free_pages))
        else:
            self.free_pages = torch.cat((self.free_pages, pages))

    def free_group_begin(self) -> None:
        if self._free_group is not None:
            raise AllocatorError("free groups do not nest")
        self._free_group = []

    def free_group_end(self) -> None:
        group, self._free_group = self._free_group, None
        if group:
            self._return(torch.cat(group))

    def allocated_pages(self) -> torch.Tensor:
        return torch.nonzero(self._allocated).view(-1)


__all__ = ["DeviceKVPool", "PageAllocator", "AllocatorError", "torch_dtype", "TORCH_DTYPES",
           "allocate_zeroed"]
