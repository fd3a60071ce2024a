"""Host <-> device page transfers: the shared front end and the ``direct`` backend.

Both directions take two equally long lists of page ids, host pages and device pages,
and copy page ``host_pages[i]`` <-> ``device_pages[i]`` for one layer (``layer=l``) or
all layers (``layer=None``).  ``num_tokens`` (optional) stops the copy early inside the
last page, for a sequence whose last page is only partly filled; the rest of that
destination page is left untouched.

Every index is validated before the first byte moves: ids must lie inside the pools
(device page 0, the padding page, is a valid target), the lists must have equal length,
and a destination page may appear only once (repeated *source* pages are fine).

The ``direct`` backend uses plain torch copies on views: runs of pages that are
consecutive on both sides become one slice copy each; when pages are tiny and scattered
it switches to one gather + one scatter (``index_select`` / ``index_copy_``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import torch

from .device_pool import DeviceKVPool
from .errors import TransferIndexError
from .host_pool import HostKVPool

# below this many bytes per run, per-run copies lose to one vectorised gather/scatter
_MIN_RUN_BYTES = 32 << 10


@dataclass
class TransferStats:
    """Running totals a backend keeps about itself (for metrics and verify)."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0
    launches: int = 0

    def to_dict(self):
        return {"calls": self.calls, "bytes": self.bytes, "seconds": self.seconds,
                "launches": self.launches,
                "gbps": (self.bytes / self.seconds / 1e9) if self.seconds > 0 else None}


def _as_index(pages, name: str) -> torch.Tensor:
    t = torch.as_tensor(pages)
    if t.numel() == 0:
        return torch.empty(0, dtype=torch.int64)
    if t.dtype == torch.bool or t.is_floating_point():
        raise TransferIndexError(f"{name} must be integer page ids, got {t.dtype}")
    return t.to("cpu", torch.int64).reshape(-1)


def consecutive_runs(src: torch.Tensor, dst: torch.Tensor) -> List[Tuple[int, int, int]]:
    """Maximal (src_start, dst_start, length) runs where both ids step by +1."""
    n = src.numel()
    if n == 0:
        return []
    if n == 1:
        return [(int(src[0]), int(dst[0]), 1)]
    brk = ((src[1:] - src[:-1]) != 1) | ((dst[1:] - dst[:-1]) != 1)
    starts = torch.cat((torch.zeros(1, dtype=torch.int64), torch.nonzero(brk).view(-1) + 1))
    ends = torch.cat((starts[1:], torch.tensor([n])))
    s, d, st, en = src.tolist(), dst.tolist(), starts.tolist(), ends.tolist()
    return [(s[a], d[a], b - a) for a, b in zip(st, en)]


class TransferBackend:
    """Front end shared by the io backends; subclasses implement :meth:`_copy`."""

    name = "base"

    def __init__(self, device_pool: DeviceKVPool, host_pool: HostKVPool, requested: Optional[str] = None,
                 note: str = ""):
        self.device_pool = device_pool
        self.host_pool = host_pool
        self.requested = requested or self.name
        self.note = note
        self.stats = {"backup": TransferStats(), "load": TransferStats()}
        self.page_size = device_pool.page_size
        self.layer_num = device_pool.layer_num
        # (host canonical view, device canonical view) per host buffer family
        self._pairs = []
        for hname in host_pool.buffers:
            dname, cols = host_pool.device_source(hname)
            dview = device_pool.canonical(dname)
            if cols is not None:
                dview = dview[..., cols]
            self._pairs.append((hname, host_pool.canonical(hname), dview))

    @property
    def effective(self) -> str:
        return self.name

    def describe(self) -> str:
        s = self.effective
        if self.requested != self.effective:
            s = f"{self.requested} -> {self.effective}"
        return s + (f" ({self.note})" if self.note else "")

    # ---- validation --------------------------------------------------------------------
    def _check(self, host_pages, device_pages, layer, num_tokens, to_host: bool):
        hp, dp = _as_index(host_pages, "host_pages"), _as_index(device_pages, "device_pages")
        if hp.numel() != dp.numel():
            raise TransferIndexError(f"{hp.numel()} host pages but {dp.numel()} device pages")
        n = hp.numel()
        hmax, dmax = self.host_pool.page_num, self.device_pool.total_pages
        if n:
            bad = hp[(hp < 0) | (hp >= hmax)]
            if bad.numel():
                raise TransferIndexError(f"host page ids {bad.tolist()[:8]} are outside 0..{hmax - 1}; nothing copied")
            bad = dp[(dp < 0) | (dp >= dmax)]
            if bad.numel():
                raise TransferIndexError(f"device page ids {bad.tolist()[:8]} are outside 0..{dmax - 1}; nothing copied")
            dst = hp if to_host else dp
            if torch.unique(dst).numel() != n:
                raise TransferIndexError(f"{'host' if to_host else 'device'} destination pages repeat; "
                                         "a page can receive only one source; nothing copied")
        if layer is not None and not (0 <= int(layer) < self.layer_num):
            raise TransferIndexError(f"layer {layer} is outside 0..{self.layer_num - 1}")
        ps = self.page_size
        tail = ps
        if num_tokens is not None:
            num_tokens = int(num_tokens)
            if n == 0 or not ((n - 1) * ps < num_tokens <= n * ps):
                raise TransferIndexError(f"num_tokens={num_tokens} does not fit {n} pages of {ps} tokens "
                                         "(the last page must hold at least one token)")
            tail = num_tokens - (n - 1) * ps
        return hp, dp, tail

    def _views(self, layer):
        for hname, hv, dv in self._pairs:
            if layer is not None:
                l = int(layer)
                hv, dv = hv[l:l + 1], dv[l:l + 1]
            yield hname, hv, dv

    # ---- public API ----------------------------------------------------------------------
    def backup(self, host_pages, device_pages, layer: Optional[int] = None,
               num_tokens: Optional[int] = None) -> int:
        """Device pages -> host pages (all layers when ``layer`` is None). Returns bytes."""
        hp, dp, tail = self._check(host_pages, device_pages, layer, num_tokens, to_host=True)
        return self._run("backup", dp, hp, layer, tail, to_host=True)

    def load(self, host_pages, device_pages, layer: Optional[int] = None,
             num_tokens: Optional[int] = None) -> int:
        """Host pages -> device pages (all layers when ``layer`` is None). Returns bytes."""
        hp, dp, tail = self._check(host_pages, device_pages, layer, num_tokens, to_host=False)
        return self._run("load", hp, dp, layer, tail, to_host=False)

    # reference-flavoured names
    def backup_from_device_all_layer(self, host_pages, device_pages, num_tokens=None) -> int:
        return self.backup(host_pages, device_pages, None, num_tokens)

    def backup_from_device_per_layer(self, host_pages, device_pages, layer_id, num_tokens=None) -> int:
        return self.backup(host_pages, device_pages, layer_id, num_tokens)

    def load_to_device_per_layer(self, host_pages, device_pages, layer_id, num_tokens=None) -> int:
        return self.load(host_pages, device_pages, layer_id, num_tokens)

    def load_to_device_all_layer(self, host_pages, device_pages, num_tokens=None) -> int:
        return self.load(host_pages, device_pages, None, num_tokens)

    def _run(self, kind, src_pages, dst_pages, layer, tail, to_host) -> int:
        n = src_pages.numel()
        if n == 0:
            return 0
        nlayers = self.layer_num if layer is None else 1
        row = sum(self.device_pool.geometry.row_bytes.values())
        nbytes = ((n - 1) * self.page_size + tail) * row * nlayers
        t0 = time.perf_counter()
        launches = 0
        pairs = list(self._views(layer))
        launches += self._copy(pairs, src_pages, dst_pages, tail, to_host)
        st = self.stats[kind]
        st.calls += 1
        st.bytes += nbytes
        st.launches += launches
        st.seconds += time.perf_counter() - t0
        return nbytes

    def _copy(self, pairs, src_pages, dst_pages, tail, to_host) -> int:  # pragma: no cover
        raise NotImplementedError

    def synchronize(self) -> None:
        if self.device_pool.device.type == "cuda":
            torch.cuda.synchronize(self.device_pool.device)


def _copy_block(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
    """``dst.copy_(src)`` for equally shaped views, with size-1 axes dropped first.

    torch's CPU copy gets very slow (~100x measured) on views that carry several unit axes
    with large strides; contiguous blocks are copied flat.
    """
    if dst.is_contiguous() and src.is_contiguous():
        dst.view(-1).copy_(src.view(-1), non_blocking=non_blocking)
    else:
        dst.squeeze().copy_(src.squeeze(), non_blocking=non_blocking)


class DirectTransfer(TransferBackend):
    """``direct`` io backend: torch slice copies and index_select / index_copy_."""

    name = "direct"
    #: runs carrying fewer bytes than this (on average) use one gather + one scatter instead
    min_run_bytes = _MIN_RUN_BYTES

    def _copy(self, pairs, src_pages, dst_pages, tail, to_host) -> int:
        ps = self.page_size
        nb = self.device_pool.device.type == "cuda" and self.host_pool.pin_memory
        n = src_pages.numel()
        full = n if tail == ps else n - 1
        ops = 0
        runs = consecutive_runs(src_pages[:full], dst_pages[:full]) if full else []
        for _, hv, dv in pairs:
            src, dst = (dv, hv) if to_host else (hv, dv)
            page_bytes = dv[:, :1].numel() * dv.element_size()
            if runs and full / len(runs) * page_bytes < self.min_run_bytes and src.device == dst.device:
                ops += self._gather_scatter(src, dst, src_pages[:full], dst_pages[:full])
            else:
                for s0, d0, ln in runs:
                    _copy_block(dst[:, d0:d0 + ln], src[:, s0:s0 + ln], nb)
                    ops += 1
            if full < n:
                s, d = int(src_pages[-1]), int(dst_pages[-1])
                _copy_block(dst[:, d, :tail], src[:, s, :tail], nb)
                ops += 1
        return ops

    @staticmethod
    def _gather_scatter(src, dst, sp, dp) -> int:
        # pages first so index_select / index_copy_ work on the outermost dimension
        s = src.transpose(0, 1)
        d = dst.transpose(0, 1)
        picked = s.index_select(0, sp.to(s.device))
        d.index_copy_(0, dp.to(d.device), picked)
        return 2


__all__ = ["TransferBackend", "DirectTransfer", "TransferStats", "consecutive_runs"]
