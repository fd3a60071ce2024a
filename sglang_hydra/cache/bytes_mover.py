"""The real-bytes mover: carries out :class:`~sglang_hydra.cache.tiered.TieredCache`'s moves
with the device pool, the host pool, the transfer backend and a storage backend.

A node's handle on a tier is the list of its page ids there.  Every page's bytes are derived
from its storage key (:meth:`BytesMover.expected_page`) and written when the page is first
computed, so each load from the host or from storage can be checked (``verify=True``;
mismatches are counted in ``stats``).  Bytes and busy time of each transfer direction are
booked in ``meter`` (:class:`~sglang_hydra.memory.transfer_accounting.TransferMeter`):
only bytes a tier really received count.
"""
from __future__ import annotations

import hashlib
from typing import Dict, List, Optional, Sequence

import torch

from ..memory.transfer_accounting import TransferMeter
from .movers import storage_page_key
from .storage import STORAGE_BATCH_SIZE

__all__ = ["BytesMover", "PrefetchReservation"]


class PrefetchReservation:
    """Host pages reserved for one prefetch; ``taken`` marks those handed to nodes."""

    __slots__ = ("pages", "taken")

    def __init__(self, pages: List[int]):
        self.pages = pages
        self.taken = [False] * len(pages)


class BytesMover:
    """Moves real KV bytes between the pools of a :class:`~sglang_hydra.memory.KVMemory` and
    an optional storage backend."""

    def __init__(self, memory, storage=None, *, verify: bool = True,
                 storage_batch_pages: int = STORAGE_BATCH_SIZE):
        self.mem = memory
        self.dpool, self.alloc, self.hpool, self.xfer = (memory.device_pool, memory.allocator,
                                                         memory.host_pool, memory.transfer)
        self.page_size = self.ps = self.dpool.page_size
        self.device_pages = self.alloc.available_size() // self.page_size
        self.host_pages = self.hpool.page_num if self.hpool is not None else 0
        self.storage = storage
        self.has_storage = storage is not None
        self.verify = verify
        self.batch = max(1, int(storage_batch_pages))
        self.meter = TransferMeter()
        self.stats: Dict[str, int] = {"verified_pages": 0, "verify_mismatch_pages": 0,
                                      "storage_read_short_pages": 0, "storage_write_failed_pages": 0}
        if self.hpool is not None:
            self.families = list(self.hpool.buffers)
            self._device_views = {n: self.dpool.canonical(self.hpool.device_source(n)[0]) for n in self.families}
            self._device_cols = {n: self.hpool.device_source(n)[1] for n in self.families}
            self._host_views = {n: self.hpool.canonical(n) for n in self.families}
            self._shapes = [(n, (self._host_views[n].shape[0],) + tuple(self._host_views[n].shape[2:]))
                            for n in self.families]
            self._dtype = self.hpool.store_dtype
            self._family_bytes = [int(torch.Size(s).numel()) * self._dtype.itemsize for _, s in self._shapes]
            self.page_bytes = sum(self._family_bytes)
        else:
            self.families = []
            self.page_bytes = 0

    # ------------------------------------------------------------------ page bytes
    def expected_page(self, key: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(hashlib.shake_128(key.encode()).digest(self.page_bytes)),
                                dtype=torch.uint8)

    def _split(self, flat: torch.Tensor):
        out, o = {}, 0
        for (n, shape), b in zip(self._shapes, self._family_bytes):
            out[n] = flat[o:o + b].view(self._dtype).view(shape)
            o += b
        return out

    def _device_view(self, family, page):
        v = self._device_views[family][:, page]
        c = self._device_cols[family]
        return v[..., c] if c is not None else v

    def write_device_page(self, page: int, flat: torch.Tensor) -> None:
        for n, t in self._split(flat).items():
            self._device_view(n, page).copy_(t)

    def read_device_page(self, page: int) -> torch.Tensor:
        return torch.cat([self._device_view(n, page).contiguous().cpu().view(torch.uint8).reshape(-1)
                          for n in self.families])

    def read_host_page(self, page: int) -> torch.Tensor:
        return torch.cat([self._host_views[n][:, page].contiguous().view(torch.uint8).reshape(-1)
                          for n in self.families])

    def write_host_page(self, page: int, flat: torch.Tensor) -> None:
        for n, t in self._split(flat).items():
            self._host_views[n][:, page].copy_(t)

    @staticmethod
    def page_keys(node) -> List[str]:
        return [storage_page_key(node.key, node.lo + i) for i in range(node.weight)]

    def _check(self, keys: Sequence[str], pages: Sequence[int], reader) -> None:
        if not self.verify:
            return
        for k, p in zip(keys, pages):
            self.stats["verified_pages"] += 1
            if not torch.equal(reader(int(p)), self.expected_page(k)):
                self.stats["verify_mismatch_pages"] += 1

    # ------------------------------------------------------------------ tiers
    @staticmethod
    def split_handle(handle, m):
        return handle[:m], handle[m:]

    def allocate_device(self, nodes) -> List[List[int]]:
        total = sum(n.weight for n in nodes)
        pages = self.alloc.alloc_pages(total) if total else torch.empty(0, dtype=torch.int64)
        if pages is None:
            raise RuntimeError(f"device pool short of {total} pages the tiered cache counted as free")
        out = self._per_node(nodes, pages.tolist())
        if self.hpool is not None:       # single tier: no bytes to check later, so none to write
            for n, mine in zip(nodes, out):
                for key, p in zip(self.page_keys(n), mine):
                    self.write_device_page(p, self.expected_page(key))
        return out

    def free_device(self, handle) -> None:
        self.alloc.free_page_ids(torch.tensor(handle, dtype=torch.int64))

    def free_host(self, handle) -> None:
        self.hpool.free_pages(torch.tensor(handle, dtype=torch.int64))

    def _paired(self, sources: List[int], targets: torch.Tensor):
        """Pair ascending source pages with ascending target pages, so that consecutive runs
        on both sides become single copies; returns (sorted sources, sorted targets, the
        target of each source position)."""
        order = sorted(range(len(sources)), key=sources.__getitem__)
        tgt = torch.sort(targets).values
        tl = tgt.tolist()
        mapped = [0] * len(sources)
        for i, j in enumerate(order):
            mapped[j] = tl[i]
        src = torch.tensor([sources[j] for j in order], dtype=torch.int64)
        return src, tgt, mapped

    @staticmethod
    def _per_node(nodes, pages: List[int]) -> List[List[int]]:
        """Cut a flat page list into one run per node, in order, each as long as the node's weight."""
        out, o = [], 0
        for n in nodes:
            out.append(pages[o:o + n.weight])
            o += n.weight
        return out

    def _copy_pages(self, nodes, sources: List[int], targets: Optional[torch.Tensor], target_tier: str,
                    direction: str, copy) -> List[List[int]]:
        """Copy ``sources`` into freshly allocated ``targets`` with one timed, synchronized
        ``copy(sorted sources, sorted targets)``; returns each node's target pages, in source order."""
        if targets is None:
            raise RuntimeError(f"{target_tier} pool short of {len(sources)} pages the tiered cache counted as free")
        src, tgt, mapped = self._paired(sources, targets)
        with self.meter.timing(direction) as moved:
            moved.append(copy(src, tgt))
            self.xfer.synchronize()
        return self._per_node(nodes, mapped)

    def backup(self, nodes) -> List[List[int]]:
        flat = [p for n in nodes for p in n.device]
        return self._copy_pages(nodes, flat, self.hpool.alloc_pages(len(flat)), "host", "d2h",
                                lambda dsrc, htgt: self.xfer.backup(htgt, dsrc))

    def load_back(self, nodes) -> List[List[int]]:
        flat = [p for n in nodes for p in n.host]
        out = self._copy_pages(nodes, flat, self.alloc.alloc_pages(len(flat)), "device", "h2d", self.xfer.load)
        for n, mine in zip(nodes, out):
            self._check(self.page_keys(n), mine, self.read_device_page)
        return out

    # ------------------------------------------------------------------ storage
    def storage_leading(self, runs) -> int:
        keys = [storage_page_key(key, a + i) for key, a, n in runs for i in range(n)]
        hit = 0
        for i in range(0, len(keys), self.batch):
            part = keys[i:i + self.batch]
            got = self.storage.batch_exists(part)
            hit += got
            if got < len(part):
                break
        return hit

    def write_storage(self, nodes) -> int:
        """H->storage in batches; pages storage already holds are skipped (not booked)."""
        todo = []
        for n in nodes:
            for key, hp in zip(self.page_keys(n), n.host):
                if not self.storage.exists(key):
                    todo.append((key, hp))
        written = 0
        for i in range(0, len(todo), self.batch):
            part = todo[i:i + self.batch]
            vals = [self.read_host_page(hp) for _, hp in part]
            with self.meter.timing("storage_write"):
                ok = self.storage.batch_set([k for k, _ in part], vals)
            good = len(part) if ok else sum(1 for k, _ in part if self.storage.exists(k))
            self.meter.add_bytes("storage_write", good * self.page_bytes)
            written += good
            if not ok:                 # batch_set stops at the first failure: so do we
                self.stats["storage_write_failed_pages"] += len(todo) - i - good
                break
        return written

    def reserve_host(self, n: int) -> PrefetchReservation:
        hp = self.hpool.alloc_pages(n)
        if hp is None:
            raise RuntimeError(f"host pool short of {n} pages the tiered cache counted as free")
        return PrefetchReservation(hp.tolist())

    def read_storage(self, res: PrefetchReservation, runs) -> int:
        keys = [storage_page_key(key, a + i) for key, a, n in runs for i in range(n)]
        good = 0
        try:
            for i in range(0, len(keys), self.batch):
                part = keys[i:i + self.batch]
                with self.meter.timing("storage_read") as moved:
                    vals = self.storage.batch_get(part)
                    ok = 0
                    for v in vals:
                        if v is None or v.numel() * v.element_size() != self.page_bytes:
                            break
                        ok += 1
                    moved.append(ok * self.page_bytes)
                for j in range(ok):
                    self.write_host_page(res.pages[i + j], vals[j].view(torch.uint8).view(-1))
                good += ok
                if ok < len(part):
                    break
        except Exception:             # a failing backend is a miss from here on
            pass
        self.stats["storage_read_short_pages"] += len(keys) - good
        self._check(keys[:good], res.pages[:good], self.read_host_page)
        return good

    def take_host(self, res: PrefetchReservation, offset: int, n: int) -> List[int]:
        for i in range(offset, offset + n):
            res.taken[i] = True
        return res.pages[offset:offset + n]

    def release_host(self, res: PrefetchReservation) -> None:
        rest = [p for p, t in zip(res.pages, res.taken) if not t]
        if rest:
            self.hpool.free_pages(torch.tensor(rest, dtype=torch.int64))
        res.taken = [True] * len(res.pages)

    def close(self) -> None:
        pass
