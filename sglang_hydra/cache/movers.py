"""Movers: what carries out the page moves :class:`~sglang_hydra.cache.tiered.TieredCache`
decides.  This module holds the counting mover (no bytes, no torch); the real-bytes mover is
:class:`sglang_hydra.cache.bytes_mover.BytesMover`.

The protocol (a *handle* is whatever a mover uses to find a node's pages on one tier):

* ``device_pages``, ``host_pages``, ``has_storage``, ``page_bytes``: tier sizes and page size.
Nodes are passed as they are; a mover reads ``key``, ``lo`` (first page offset in the
unit), ``weight`` (pages), ``device`` and ``host`` and never changes them.

* ``allocate_device(nodes)`` -> device handles for new (or recomputed) nodes.
* ``backup(nodes)`` -> host handles (device -> host copies).
* ``load_back(nodes)`` -> device handles (host -> device copies).
* ``free_device(h)``, ``free_host(h)``, ``split_handle(h, m)`` -> (first m pages, rest).
* ``storage_leading(runs)`` -> how many leading pages of ``runs`` storage holds.
* ``write_storage(nodes)`` -> pages newly written (pages storage holds are skipped).
* ``reserve_host(n)`` -> reservation for a prefetch; ``read_storage(res, runs)`` -> pages
  read into it; ``take_host(res, offset, n)`` -> a node's host handle out of it;
  ``release_host(res)`` frees what was not taken.

A storage page is named by its unit key and offset (:func:`storage_page_key` gives the
string key a real backend sees).  Keys name whole prefixes (trace hash ids, chained page
keys), so a page key does too.
"""
from __future__ import annotations

import hashlib
from typing import Hashable, List, Sequence, Tuple

__all__ = ["CountingMover", "storage_page_key"]

Spec = Tuple[Hashable, int, int]


_HEX = frozenset("0123456789abcdef")


def storage_page_key(unit_key: Hashable, offset: int) -> str:
    """64 lowercase hex characters naming page ``offset`` of unit ``unit_key``; stable across
    processes (BLAKE2b of a fixed text form), and within the file backend's key alphabet.
    A unit key that already is a 64-hex page hash (one page per unit) is its own key."""
    if offset == 0 and isinstance(unit_key, str) and len(unit_key) == 64 and _HEX.issuperset(unit_key):
        return unit_key
    return hashlib.blake2b(f"{unit_key!r}/{int(offset)}".encode(), digest_size=32).hexdigest()


def _leading_ones(mask: int, n: int) -> int:
    """How many of the low ``n`` bits of ``mask`` are set before the first clear one."""
    missing = ~mask & ((1 << n) - 1)
    if not missing:
        return n
    return (missing & -missing).bit_length() - 1


class CountingMover:
    """Moves nothing; storage is a set of pages (one bit mask per unit).

    Used by ``job.mode=sim``: every decision is the tiered cache's, so the counts are the
    real-bytes mover's without allocating a byte.
    """

    def __init__(self, device_pages: int, host_pages: int = 0, *, has_storage: bool = False,
                 page_bytes: int = 0):
        if device_pages < 0 or host_pages < 0:
            raise ValueError(f"tier sizes must be >= 0 pages, got device {device_pages}, host {host_pages}")
        self.device_pages = int(device_pages)
        self.host_pages = int(host_pages)
        self.has_storage = bool(has_storage)
        self.page_bytes = int(page_bytes)
        self._stored = {}          # unit key -> bit mask of the offsets storage holds

    # tiers ---------------------------------------------------------------------------
    @staticmethod
    def split_handle(handle, m):
        return handle, handle

    def allocate_device(self, nodes) -> List[bool]:
        return [True] * len(nodes)

    def backup(self, nodes) -> List[bool]:
        return [True] * len(nodes)

    def load_back(self, nodes) -> List[bool]:
        return [True] * len(nodes)

    def free_device(self, handle) -> None:
        pass

    def free_host(self, handle) -> None:
        pass

    # storage -------------------------------------------------------------------------
    def storage_leading(self, runs: Sequence[Spec]) -> int:
        stored = self._stored
        total = 0
        for key, offset, n in runs:
            got = _leading_ones(stored.get(key, 0) >> offset, n)
            total += got
            if got < n:
                break
        return total

    def write_storage(self, nodes) -> int:
        stored = self._stored
        written = 0
        for node in nodes:
            key = node.key
            bits = ((1 << node.weight) - 1) << node.lo
            old = stored.get(key, 0)
            written += (bits & ~old).bit_count()
            stored[key] = old | bits
        return written

    def stored_pages(self) -> int:
        return sum(m.bit_count() for m in self._stored.values())

    def reserve_host(self, n: int):
        return n

    def read_storage(self, reservation, runs: Sequence[Spec]) -> int:
        return sum(n for _, _, n in runs)

    def take_host(self, reservation, offset: int, n: int):
        return True

    def release_host(self, reservation) -> None:
        pass

    def close(self) -> None:
        pass
