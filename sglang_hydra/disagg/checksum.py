"""Adler-32 over the bytes of a set of pages, the same digest on both sides of a transfer.

The digested byte string is, for every buffer in order and for every page index in the
given order, the page's bytes ``[base + idx * item_len, + item_len)``. Consecutive pages are
fed to ``zlib.adler32`` as one slice; chaining the running value makes the result equal to the
Adler-32 of the full concatenation. An empty selection gives 1 (Adler-32 of no bytes).
"""
from __future__ import annotations

import ctypes
import hashlib
import zlib
from typing import Sequence

import torch

from .addressing import group_contiguous_runs

NO_DIGEST = 0


def _bytes_at(addr: int, nbytes: int) -> memoryview:
    return memoryview((ctypes.c_char * nbytes).from_address(addr))


def adler32_pages(tensors: Sequence[torch.Tensor], item_lens: Sequence[int],
                  pages: Sequence[int]) -> int:
    runs = group_contiguous_runs(pages, pages)
    value = 1
    for t, il in zip(tensors, item_lens):
        if not t.is_contiguous():
            raise ValueError("checksums need contiguous tensors")
        if t.device.type != "cpu":   # KV registered in device memory: digest a host copy of the pages
            rows = t.reshape(-1).view(torch.uint8).view(-1, il)
            if pages and (min(pages) < 0 or max(pages) >= rows.shape[0]):
                raise IndexError(f"pages {min(pages)}..{max(pages)} lie outside the buffer")
            if pages:
                idx = torch.as_tensor(list(pages), dtype=torch.long, device=t.device)
                value = zlib.adler32(rows[idx].cpu().numpy().tobytes(), value)
            continue
        base = t.data_ptr()
        limit = t.numel() * t.element_size()
        for first, _, n in runs:
            start = first * il
            if start < 0 or start + n * il > limit:
                raise IndexError(f"pages {first}..{first + n - 1} lie outside the buffer")
            if n:
                value = zlib.adler32(_bytes_at(base + start, n * il), value)
    return value & 0xFFFFFFFF


def layout_signature(page_size: int, kv_cache_dtype: str, item_lens: Sequence[int]) -> int:
    """Non-zero 63-bit id of the page layout; digests are only compared when both sides agree."""
    blob = repr((int(page_size), str(kv_cache_dtype), tuple(int(x) for x in item_lens))).encode()
    h = int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little")
    return (h >> 1) | 1
