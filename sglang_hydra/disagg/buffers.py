"""Where the KV bytes live: a small buffer protocol, a torch implementation and a page allocator.

The transfer code only needs, per KV buffer, one contiguous tensor in which page ``p`` is the
rows ``[p * page_size, (p + 1) * page_size)``. :class:`KVBufferSource` is that protocol;
:func:`buffers_from_memory` adapts the pools built by ``sglang_hydra.memory`` to it.

KV in GPU memory. A backend that registers device memory itself (``device_memory = True`` on
its manager: NIXL's VRAM segments) gets the device buffers registered as they are. For the
others (zmq, Mooncake's non-CUDA build) :func:`kv_args_from_source` registers pinned host
mirrors instead (:class:`HostStaging`): prefill copies a request's pages device -> host before
the transfer, decode host -> device after it. ``staging=False`` refuses with an error naming
the backend that can move GPU memory. Which tensors count as "device" is a predicate the
caller may replace, so the staging path also runs (and is tested) on a CPU-only machine.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple, runtime_checkable

import torch


@runtime_checkable
class KVBufferSource(Protocol):
    page_size: int

    def contiguous_buffers(self) -> List[Tuple[str, torch.Tensor]]:
        ...


class TensorKVBuffers:
    """K buffers for every layer then V buffers for every layer, each ``(rows, heads, dim)``.

    ``rows = (num_pages + reserved) * page_size``; with ``reserve_page0`` (the default, as in
    the reference pools) page 0 is a padding page the allocator never hands out.
    """

    def __init__(self, *, num_layers: int, num_pages: int, page_size: int, head_num: int,
                 head_dim: int, dtype: torch.dtype = torch.bfloat16, reserve_page0: bool = True,
                 kinds: Sequence[str] = ("k", "v")):
        if min(num_layers, num_pages, page_size, head_num, head_dim) <= 0:
            raise ValueError("TensorKVBuffers: all sizes must be positive")
        self.page_size = page_size
        self.num_pages = num_pages
        self.first_page = 1 if reserve_page0 else 0
        rows = (num_pages + self.first_page) * page_size
        self._bufs: List[Tuple[str, torch.Tensor]] = []
        for kind in kinds:
            for layer in range(num_layers):
                self._bufs.append((f"{kind}_buffer[{layer}]",
                                   torch.zeros((rows, head_num, head_dim), dtype=dtype)))

    def contiguous_buffers(self) -> List[Tuple[str, torch.Tensor]]:
        return list(self._bufs)

    def make_allocator(self) -> "PageAllocator":
        return PageAllocator(self.num_pages, first_page=self.first_page)


class PageAllocator:
    """A minimal page allocator with a checkable invariant (used until the memory pools land).

    Pages ``first_page .. first_page + num_pages - 1`` are either free or handed out, never
    both, never twice.
    """

    def __init__(self, num_pages: int, first_page: int = 1):
        self.num_pages = num_pages
        self.first_page = first_page
        self._free: List[int] = list(range(first_page, first_page + num_pages))
        self._used: set = set()
        self._lock = threading.Lock()

    def available(self) -> int:
        with self._lock:
            return len(self._free)

    def alloc(self, n: int) -> Optional[List[int]]:
        with self._lock:
            if n > len(self._free):
                return None
            pages, self._free = self._free[:n], self._free[n:]
            self._used.update(pages)
            return pages

    def free(self, pages: Sequence[int]) -> None:
        with self._lock:
            for p in pages:
                p = int(p)
                if p not in self._used:
                    raise RuntimeError(f"page {p} freed but not allocated")
                self._used.discard(p)
            self._free = [int(p) for p in pages] + self._free

    def check_invariants(self) -> None:
        with self._lock:
            free = set(self._free)
            if len(free) != len(self._free):
                raise AssertionError("a page is on the free list twice")
            if free & self._used:
                raise AssertionError(f"pages both free and in use: {sorted(free & self._used)[:8]}")
            expected = set(range(self.first_page, self.first_page + self.num_pages))
            if free | self._used != expected:
                raise AssertionError("free + used pages do not cover the pool exactly")

    @property
    def used(self) -> int:
        with self._lock:
            return len(self._used)


def on_device(t: torch.Tensor) -> bool:
    """The default device predicate: anything not in host memory."""
    return t.device.type != "cpu"


def _rows(t: torch.Tensor, item_len: int) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8).view(-1, item_len)


class HostStaging:
    """Pinned host mirrors of device KV buffers, for backends that move host memory only.

    ``to_host(pages)`` copies those pages of every buffer device -> mirror (prefill, before the
    transfer); ``to_device(pages)`` copies them mirror -> device (decode, after Success).
    """

    def __init__(self, device_tensors: Sequence[torch.Tensor], item_lens: Sequence[int]):
        pin = torch.cuda.is_available()
        self.device_tensors = list(device_tensors)
        self.item_lens = list(item_lens)
        self.host_tensors = [torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
                             for t in self.device_tensors]
        self.pinned = pin

    def _copy(self, pages: Sequence[int], to_host: bool) -> None:
        if not len(pages):
            return
        for dev, host, il in zip(self.device_tensors, self.host_tensors, self.item_lens):
            d_rows, h_rows = _rows(dev, il), _rows(host, il)
            h_idx = torch.as_tensor(list(pages), dtype=torch.long)
            d_idx = h_idx.to(dev.device)
            if to_host:
                h_rows[h_idx] = d_rows[d_idx].to("cpu")
            else:
                d_rows[d_idx] = h_rows[h_idx].to(dev.device, non_blocking=False)
        if any(t.is_cuda for t in self.device_tensors):
            torch.cuda.synchronize()

    def to_host(self, pages: Sequence[int]) -> None:
        self._copy(pages, to_host=True)

    def to_device(self, pages: Sequence[int]) -> None:
        self._copy(pages, to_host=False)


@dataclass
class KVArgs:
    """What a backend needs to know about one side's KV buffers (shared by every backend).

    ``tensors`` are the registered buffers (what the backend reads or writes); ``source_tensors``
    are where the KV really lives (the same tensors, or the device buffers behind a
    :class:`HostStaging`). ``memory_kind`` is ``"host"`` or ``"device"`` (of the registered ones).
    """

    engine_rank: int = 0
    page_size: int = 1
    kv_cache_dtype: str = "auto"
    buffer_names: List[str] = field(default_factory=list)
    kv_data_ptrs: List[int] = field(default_factory=list)
    kv_data_lens: List[int] = field(default_factory=list)
    kv_item_lens: List[int] = field(default_factory=list)
    ib_device: Optional[str] = None
    tensors: List[torch.Tensor] = field(default_factory=list, repr=False)
    source_tensors: List[torch.Tensor] = field(default_factory=list, repr=False)
    memory_kind: str = "host"
    device_index: Optional[int] = None
    staging: Optional[HostStaging] = field(default=None, repr=False)

    def regions(self) -> List[Tuple[int, int]]:
        return list(zip(self.kv_data_ptrs, self.kv_data_lens))

    def layout(self) -> dict:
        return {"page_size": self.page_size, "kv_cache_dtype": self.kv_cache_dtype,
                "kv_item_lens": list(self.kv_item_lens), "num_buffers": len(self.kv_item_lens)}


def kv_args_from_source(source: KVBufferSource, *, kv_cache_dtype: str = "auto",
                        engine_rank: int = 0, ib_device: Optional[str] = None, device_memory: bool = False,
                        backend: str = "this backend", staging: bool = True,
                        is_device: Callable[[torch.Tensor], bool] = on_device) -> KVArgs:
    """Pointers, byte lengths and per-page byte sizes of every buffer of ``source``.

    Device buffers are registered as they are when the backend can (``device_memory``), else
    through pinned host mirrors (``staging``), else refused (module docstring).
    """
    ps = int(source.page_size)
    args = KVArgs(engine_rank=engine_rank, page_size=ps, kv_cache_dtype=kv_cache_dtype,
                  ib_device=ib_device)
    named = list(source.contiguous_buffers())
    devices = [is_device(t) for _, t in named]
    if any(devices) and not all(devices):
        raise ValueError("KV buffers are split between host and device memory; a side must keep all of them "
                         "in one place")
    on_dev = bool(named) and all(devices)
    for name, t in named:
        if not t.is_contiguous():
            raise ValueError(f"KV buffer {name} is not contiguous; it cannot be registered")
    if on_dev:
        args.source_tensors = [t for _, t in named]
        args.device_index = named[0][1].device.index if named[0][1].device.type == "cuda" else 0
        if device_memory:
            args.memory_kind = "device"
        elif staging:
            staged = HostStaging(args.source_tensors, [_row_bytes(n, t, ps) * ps for n, t in named])
            args.staging = staged
            named = [(n, h) for (n, _), h in zip(named, staged.host_tensors)]
        else:
            raise ValueError(f"the KV buffers live in device memory ({named[0][1].device}), which the "
                             f"{backend!r} transfer backend cannot register; use "
                             "disagg.disaggregation_transfer_backend=nixl (NIXL registers GPU memory) or allow "
                             "staging through pinned host buffers")
    for name, t in named:
        rows = t.shape[0]
        nbytes = t.numel() * t.element_size()
        if rows % ps:
            raise ValueError(f"KV buffer {name}: {rows} rows is not a multiple of page_size {ps}")
        row_bytes = nbytes // rows
        args.buffer_names.append(name)
        args.kv_data_ptrs.append(t.data_ptr())
        args.kv_data_lens.append(nbytes)
        args.kv_item_lens.append(row_bytes * ps)
        args.tensors.append(t)
    if not args.kv_data_ptrs:
        raise ValueError("the KV buffer source has no buffers")
    if not args.source_tensors:
        args.source_tensors = list(args.tensors)
    return args


def _row_bytes(name: str, t: torch.Tensor, page_size: int) -> int:
    rows = t.shape[0]
    if rows == 0 or rows % page_size:
        raise ValueError(f"KV buffer {name}: {rows} rows is not a multiple of page_size {page_size}")
    return t.numel() * t.element_size() // rows


class _MemoryAdapter:
    def __init__(self, pool: Any, page_size: int):
        self._pool = pool
        self.page_size = page_size

    def contiguous_buffers(self):
        return list(self._pool.contiguous_buffers())


def buffers_from_memory(memory: Any) -> KVBufferSource:
    """Adapt the object returned by ``sglang_hydra.memory.build_memory(record)``."""
    pool = getattr(memory, "device_pool", memory)
    if not hasattr(pool, "contiguous_buffers"):
        raise TypeError(f"{type(memory).__name__} has no device_pool.contiguous_buffers()")
    ps = getattr(pool, "page_size", None) or getattr(memory, "page_size", None)
    if ps is None:
        raise TypeError("cannot find page_size on the memory object or its device pool")
    return _MemoryAdapter(pool, int(ps))


class PoolAllocatorAdapter:
    """Page-id interface (``alloc(n)`` / ``free(pages)``) over ``sglang_hydra.memory.PageAllocator``.

    The memory package's allocator hands out token indices from ``alloc``; transfers work in
    page ids, so this goes through ``alloc_pages`` / ``free_page_ids`` and adds an invariant
    check (free and allocated pages are disjoint, unique and cover ``1..num_pages``).
    """

    def __init__(self, allocator: Any):
        self._a = allocator
        self._lock = threading.Lock()

    def alloc(self, n: int) -> Optional[List[int]]:
        with self._lock:
            pages = self._a.alloc_pages(n)
        return None if pages is None else [int(p) for p in pages.tolist()]

    def free(self, pages: Sequence[int]) -> None:
        with self._lock:
            self._a.free_page_ids(torch.as_tensor(list(pages), dtype=torch.int64))

    def available(self) -> int:
        return self._a.available_size() // self._a.page_size

    @property
    def used(self) -> int:
        return int(self._a.allocated_pages().numel())

    def check_invariants(self) -> None:
        with self._lock:
            a = self._a
            free = torch.cat((a.free_pages, a.release_pages)).tolist()
            used = a.allocated_pages().tolist()
        fs, us = set(free), set(used)
        if len(fs) != len(free):
            raise AssertionError("a page is on the free list twice")
        if fs & us:
            raise AssertionError(f"pages both free and allocated: {sorted(fs & us)[:8]}")
        if fs | us != set(range(1, a.num_pages + 1)):
            raise AssertionError("free + allocated pages do not cover 1..num_pages exactly")


def allocator_for(memory_or_allocator: Any):
    """Wrap the memory package's allocator if needed (anything with alloc_pages/free_page_ids)."""
    a = getattr(memory_or_allocator, "allocator", memory_or_allocator)
    if hasattr(a, "alloc_pages") and hasattr(a, "free_page_ids"):
        return PoolAllocatorAdapter(a)
    return a
