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
consecutive on both sides become one slice copy each, K and V together when they share one
allocation per side; when pages are tiny and scattered it switches to one gather + one
scatter (``index_select`` / ``index_copy_``).  On CPU the per-run copy is the fast choice
for pages of a few KiB and up: ``index_select`` is a memcpy per page, but ``index_copy_``
and ``index_put_`` write element by element (measured 0.05-0.4x of a plain copy).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from .device_pool import DeviceKVPool
from .errors import TransferIndexError
from .host_pool import HostKVPool

# below this many bytes per run, per-run copies lose to one vectorised gather/scatter
_MIN_RUN_BYTES = 32 << 10


@dataclass
class TransferStats:
    """Running totals a backend keeps about itself (for metrics and verify).

    On a GPU the copies of a call are only queued when the call returns, so their time is
    measured with CUDA events (:class:`CudaEventClock`) and folded into ``seconds`` once
    they have finished: :meth:`to_dict` and ``TransferBackend.synchronize()`` wait for them;
    ``seconds`` read directly may not include the calls still in flight."""

    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0
    launches: int = 0
    _pending: List[Tuple[Any, Any]] = field(default_factory=list, repr=False, compare=False)

    def add_pending(self, start_event, end_event) -> None:
        """Time between two recorded CUDA events, counted once the end event has completed."""
        self._pending.append((start_event, end_event))
        if len(self._pending) >= _SETTLE_EVERY:
            self.settle(wait=False)

    def settle(self, wait: bool = True) -> None:
        """Fold finished event pairs into ``seconds``, oldest first; with ``wait`` wait for all."""
        done = 0
        for start_event, end_event in self._pending:
            if wait:
                end_event.synchronize()
            elif not end_event.query():
                break
            self.seconds += start_event.elapsed_time(end_event) / 1e3   # milliseconds -> s
            done += 1
        del self._pending[:done]

    def to_dict(self):
        self.settle()
        return {"calls": self.calls, "bytes": self.bytes, "seconds": self.seconds,
                "launches": self.launches,
                "gbps": (self.bytes / self.seconds / 1e9) if self.seconds > 0 else None}


#: pending GPU timings are folded in (without waiting) once this many have piled up
_SETTLE_EVERY = 64


class WallClock:
    """Host wall time: right where a copy returns only when it has finished (CPU pools)."""

    method = "wall"

    def start(self):
        return time.perf_counter()

    def stop(self, started, stats: TransferStats) -> None:
        stats.seconds += time.perf_counter() - started


class CudaEventClock:
    """CUDA events on the device's current stream: copies there are queued, not done, when
    the call returns (pinned non-blocking copies, Triton launches), so wall time would count
    only the queueing."""

    method = "cuda-events"

    def __init__(self, device: torch.device, new_event: Optional[Callable[[], Any]] = None,
                 current_stream: Optional[Callable[[], Any]] = None):
        self.device = device
        self._new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._current_stream = current_stream or (lambda: torch.cuda.current_stream(device))

    def start(self):
        event = self._new_event()
        event.record(self._current_stream())
        return event

    def stop(self, started, stats: TransferStats) -> None:
        end = self._new_event()
        end.record(self._current_stream())
        stats.add_pending(started, end)


def clock_for(device: torch.device, **cuda_options):
    """How copies to or from pools on ``device`` are timed: CUDA events on a CUDA device,
    wall time otherwise (CPU copies are synchronous).  Never touches the device itself."""
    if torch.device(device).type == "cuda":
        return CudaEventClock(torch.device(device), **cuda_options)
    return WallClock()


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
        self.clock = clock_for(device_pool.device)
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
        pairs = list(self._views(layer))
        started = self.clock.start()
        launches = self._copy(pairs, src_pages, dst_pages, tail, to_host)
        st = self.stats[kind]
        self.clock.stop(started, st)
        st.calls += 1
        st.bytes += nbytes
        st.launches += launches
        return nbytes

    def _copy(self, pairs, src_pages, dst_pages, tail, to_host) -> int:  # pragma: no cover
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for every queued copy; the stats then include their times."""
        if self.device_pool.device.type == "cuda":
            torch.cuda.synchronize(self.device_pool.device)
        for st in self.stats.values():
            st.settle()


def _copy_block(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool) -> None:
    """``dst.copy_(src)`` for equally shaped views: flat when both are contiguous, else
    with size-1 axes dropped first (torch's CPU copy was measured much slower on views that
    carry unit axes with large strides)."""
    if dst.is_contiguous() and src.is_contiguous():
        dst.view(-1).copy_(src.view(-1), non_blocking=non_blocking)
    elif 1 in dst.shape:
        dst.squeeze().copy_(src.squeeze(), non_blocking=non_blocking)
    else:
        dst.copy_(src, non_blocking=non_blocking)


def _sibling_stack(views: Sequence[torch.Tensor]) -> Optional[torch.Tensor]:
    """One view with a leading axis over ``views`` when they are equally shaped and
    strided views of one storage at a constant positive element distance (K and V of a
    symmetric pool), else None."""
    v0 = views[0]
    if len(views) == 1:
        return v0.unsqueeze(0)
    try:
        ptr = v0.untyped_storage().data_ptr()
    except RuntimeError:  # pragma: no cover - storages without a pointer
        return None
    step = views[1].storage_offset() - v0.storage_offset()
    if step <= 0:
        return None
    for i, v in enumerate(views):
        if (v.shape != v0.shape or v.stride() != v0.stride() or v.dtype != v0.dtype or v.device != v0.device
                or v.untyped_storage().data_ptr() != ptr or v.storage_offset() != v0.storage_offset() + i * step):
            return None
    return v0.as_strided((len(views),) + tuple(v0.shape), (step,) + tuple(v0.stride()), v0.storage_offset())


def _merge_families(pairs) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """(host view, device view) groups with a leading family axis, ``(F, L, P, ps, H, D)``.

    K and V of a symmetric pool share one allocation on each side, so one view reaches both
    and every page copy moves K and V at once (half the copy calls)."""
    if len(pairs) > 1:
        hs = _sibling_stack([hv for _, hv, _ in pairs])
        ds = _sibling_stack([dv for _, _, dv in pairs])
        if hs is not None and ds is not None:
            return [(hs, ds)]
    return [(hv.unsqueeze(0), dv.unsqueeze(0)) for _, hv, dv in pairs]


class DirectTransfer(TransferBackend):
    """``direct`` io backend: torch slice copies, one per run of consecutive pages.

    Every copy moves whole pages of K and V together (see :func:`_merge_families`) and, for
    one layer, selects that layer away so no unit axes are left.  Host layouts whose
    (head, dim) rows are not contiguous (``page_head``: only ``D`` elements are) go through a
    small token-major staging buffer when all layers move: the device side is then read in
    whole ``H*D`` rows and the strided regrouping happens in cache.
    """

    name = "direct"
    #: runs carrying fewer bytes than this (on average) use one gather + one scatter instead
    min_run_bytes = _MIN_RUN_BYTES
    #: bytes of the token-major staging buffer used for head-strided host layouts (0: off)
    stage_bytes = 1 << 20

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._local = threading.local()  # per-thread staging buffers

    def _stage(self, shape, dtype) -> torch.Tensor:
        cache = getattr(self._local, "stage", None)
        if cache is None:
            cache = self._local.stage = {}
        key = (tuple(shape), dtype)
        buf = cache.get(key)
        if buf is None:
            cache.clear()
            buf = cache[key] = torch.empty(shape, dtype=dtype)
        return buf

    def _copy(self, pairs, src_pages, dst_pages, tail, to_host) -> int:
        if self.device_pool.device.type != "cpu":
            return self._copy_to_accelerator(pairs, src_pages, dst_pages, tail, to_host)
        ps = self.page_size
        n = src_pages.numel()
        full = n if tail == ps else n - 1
        ops = 0
        runs = consecutive_runs(src_pages[:full], dst_pages[:full]) if full else []
        s_last, d_last = int(src_pages[-1]), int(dst_pages[-1])
        for hv, dv in _merge_families(pairs):
            tb = self._stage_tokens(hv)
            if hv.shape[1] == 1:            # one layer: drop the axis (and its big stride)
                hv, dv = hv.select(1, 0), dv.select(1, 0)
            if hv.shape[0] == 1:            # a single family
                hv, dv = hv.select(0, 0), dv.select(0, 0)
            pa = hv.dim() - 4               # page axis; then (ps, H, D)
            src, dst = (dv, hv) if to_host else (hv, dv)
            page_bytes = dv.select(pa, 0).numel() * dv.element_size()
            if runs and full / len(runs) * page_bytes < self.min_run_bytes:
                ops += self._gather_scatter(src, dst, pa, src_pages[:full], dst_pages[:full])
            elif tb:
                for s0, d0, ln in runs:
                    for i in range(ln):
                        ops += self._staged_page(dst.select(pa, d0 + i), src.select(pa, s0 + i), ps, tb)
            else:
                for s0, d0, ln in runs:
                    if ln == 1:
                        _copy_block(dst.select(pa, d0), src.select(pa, s0), False)
                    else:
                        _copy_block(dst.narrow(pa, d0, ln), src.narrow(pa, s0, ln), False)
                    ops += 1
            if full < n:
                d_pg, s_pg = dst.select(pa, d_last), src.select(pa, s_last)
                if tb:
                    ops += self._staged_page(d_pg, s_pg, tail, tb)
                else:
                    _copy_block(d_pg.narrow(-3, 0, tail), s_pg.narrow(-3, 0, tail), False)
                    ops += 1
        return ops

    def _copy_to_accelerator(self, pairs, src_pages, dst_pages, tail, to_host) -> int:
        """Device pool on an accelerator: one (non-blocking when pinned) copy per family and
        run of consecutive pages, all selected layers at once."""
        ps = self.page_size
        nb = self.device_pool.device.type == "cuda" and self.host_pool.pin_memory
        n = src_pages.numel()
        full = n if tail == ps else n - 1
        ops = 0
        runs = consecutive_runs(src_pages[:full], dst_pages[:full]) if full else []
        for _, hv, dv in pairs:
            src, dst = (dv, hv) if to_host else (hv, dv)
            for s0, d0, ln in runs:
                _copy_block(dst[:, d0:d0 + ln], src[:, s0:s0 + ln], nb)
                ops += 1
            if full < n:
                s, d = int(src_pages[-1]), int(dst_pages[-1])
                _copy_block(dst[:, d, :tail], src[:, s, :tail], nb)
                ops += 1
        return ops

    def _stage_tokens(self, hv: torch.Tensor) -> int:
        """Tokens per staging block for the ``(F, L, P, ps, H, D)`` host view ``hv`` (0: copy
        directly).

        Staging pays off when several layers move and the host keeps only ``D`` elements
        of a (token, layer) row together (``page_head``); otherwise direct copies already
        move whole ``H*D`` rows.  One layer of ``page_head`` is ``D``-element pieces on the
        host whatever the order, so it is copied directly."""
        F, L, _, _, H, D = hv.shape
        if not self.stage_bytes or L < 2 or H == 1 or hv.stride(-2) == D:
            return 0
        per_token = F * L * H * D * hv.element_size()
        return max(1, min(self.page_size, self.stage_bytes // per_token))

    def _staged_page(self, dst: torch.Tensor, src: torch.Tensor, ntok: int, tb: int) -> int:
        """Copy tokens ``[0, ntok)`` of one page, ``(..., L, ps, H, D)``, via a token-major
        ``(..., tb, L, H, D)`` buffer: whole ``H*D`` rows from/to the device side, the
        head-strided regrouping from/to cache."""
        lead = tuple(src.shape[:-4])
        L, H, D = src.shape[-4], src.shape[-2], src.shape[-1]
        k = len(lead)
        perm = tuple(range(k)) + (k + 1, k, k + 2, k + 3)
        buf = self._stage(lead + (tb, L, H, D), src.dtype).permute(perm)   # (..., L, tb, H, D)
        ops = 0
        for t0 in range(0, ntok, tb):
            m = min(tb, ntok - t0)
            b = buf if m == tb else buf.narrow(-3, 0, m)
            b.copy_(src.narrow(-3, t0, m))
            dst.narrow(-3, t0, m).copy_(b)
            ops += 2
        return ops

    @staticmethod
    def _gather_scatter(src, dst, pa, sp, dp) -> int:
        picked = src.index_select(pa, sp.to(src.device))
        dst.index_copy_(pa, dp.to(dst.device), picked)
        return 2


__all__ = ["TransferBackend", "DirectTransfer", "TransferStats", "WallClock", "CudaEventClock", "clock_for",
           "consecutive_runs"]
