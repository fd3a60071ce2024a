"""Build the planned pools, and check them with a device→host→device round trip."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from .device_pool import DeviceKVPool, PageAllocator
from .host_pool import HostKVPool
from .plan import MemoryPlan, make_plan
from .transfer_direct import DirectTransfer, TransferBackend


def _bar(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


class KVMemory:
    """Everything :func:`build_memory` made: plan, pools, allocators and the io backend."""

    def __init__(self, plan: MemoryPlan, device_pool: DeviceKVPool, allocator: PageAllocator,
                 host_pool: Optional[HostKVPool], transfer: Optional[TransferBackend]):
        self.plan = plan
        self.device_pool = device_pool
        self.allocator = allocator
        self.host_pool = host_pool
        self.transfer = transfer
        self.closed = False

    @property
    def host_allocator(self) -> Optional[HostKVPool]:
        """The host pool keeps its own page free list (``alloc``/``free``)."""
        return self.host_pool

    def close(self) -> None:
        """Drop every buffer (idempotent)."""
        if self.closed:
            return
        cuda = self.device_pool is not None and self.device_pool.device.type == "cuda"
        if self.transfer is not None:
            self.transfer._pairs = []
        for pool in (self.device_pool, self.host_pool):
            if pool is not None:
                pool.close()
        self.transfer = None
        self.host_pool = None
        self.device_pool = None
        self.allocator = None
        self.closed = True
        if cuda:
            torch.cuda.empty_cache()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_transfer(device_pool: DeviceKVPool, host_pool: HostKVPool, io: str,
                  effective: Optional[str] = None, note: str = "") -> TransferBackend:
    """The backend object for ``io`` ('direct' or 'kernel'); ``effective`` may demote it."""
    eff = effective or io
    if eff == "kernel":
        from .transfer_triton import TritonTransfer
        return TritonTransfer(device_pool, host_pool, requested=io, note=note)
    return DirectTransfer(device_pool, host_pool, requested=io, note=note)


def build_memory(record: Any, device: Optional[str] = None, *, progress: bool = False,
                 host_memory=None, strict_io: bool = True, plan: Optional[MemoryPlan] = None,
                 hardware: Any = None) -> KVMemory:
    """Plan from ``record`` (all checks first), then allocate the pools.

    ``device`` overrides ``record.device``; ``hardware`` must be ``local`` (None) because
    the pools are allocated on this machine, but its stated fields apply
    (``hardware.host_memory_gb=16``); ``host_memory`` (a
    :class:`sglang_hydra.memory.hostmem.HostMemoryInfo`) replaces any host reading;
    ``progress`` shows a bar while buffers are zeroed.
    """
    if hardware is None:
        from .target import default_hardware
        hardware = default_hardware()
    if hardware is not None and not hardware.is_local:
        from ..config.errors import ConfigError, Problem
        raise ConfigError([Problem("hardware", None,
                                   f"hardware={hardware.name} describes another machine, but this job allocates "
                                   "its KV pools here; use job=plan to size for it, or hardware=local", "setup")])
    if plan is None:
        plan = make_plan(record, device, hardware=hardware, host_memory=host_memory, strict_io=strict_io)
    from .geometry import kv_geometry
    geo = kv_geometry(record)
    bar = _bar(plan.total_bytes, "allocating KV pools", progress)
    device_pool = host_pool = None
    try:
        device_pool = DeviceKVPool(geo, plan.device_tokens, plan.device, bar=bar)
        need_sort = getattr(record, "disaggregation_mode", "null") in ("prefill", "decode")
        allocator = PageAllocator(plan.device_tokens, geo.page_size, device=plan.device, need_sort=need_sort)
        transfer = None
        if plan.host_tokens:
            host_pool = HostKVPool(geo, plan.host_layout, plan.host_tokens, pin_memory=plan.pin_memory, bar=bar)
            transfer = make_transfer(device_pool, host_pool, plan.io_backend, plan.io_backend_effective,
                                     plan.io_note)
    except BaseException:
        for p in (device_pool, host_pool):
            if p is not None:
                p.close()
        raise
    finally:
        if bar is not None:
            bar.close()
    return KVMemory(plan, device_pool, allocator, host_pool, transfer)


# ---------------------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------------------

@dataclass
class VerifyReport:
    ok: bool
    skipped: str = ""
    io_backend: Optional[str] = None
    io_backend_effective: Optional[str] = None
    io_note: str = ""
    rounds: int = 0
    pages_per_round: int = 0
    bytes_moved: int = 0
    mismatched_bytes: int = 0
    mismatches: List[Dict[str, Any]] = field(default_factory=list)
    gbps: Dict[str, float] = field(default_factory=dict)
    freed: bool = False

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        if self.skipped:
            return f"verify skipped: {self.skipped}"
        io = self.io_backend_effective
        if io != self.io_backend:
            io = f"{self.io_backend} -> {io}"
        head = (f"verify {'OK' if self.ok else 'FAILED'}: {self.rounds} rounds x {self.pages_per_round} pages, "
                f"{self.bytes_moved / 1e9:.3f} GB moved, io {io}")
        if self.io_note:
            head += f" ({self.io_note})"
        rates = ", ".join(f"{k} {v:.2f} GB/s" for k, v in self.gbps.items())
        out = [head, "  " + rates]
        if not self.ok:
            out.append(f"  {self.mismatched_bytes} mismatched bytes; pools freed")
        return "\n".join(out)


def _byte_views(pool: DeviceKVPool) -> Dict[str, torch.Tensor]:
    return {n: pool.canonical(n).view(torch.uint8) if pool.canonical(n).dtype != torch.uint8
            else pool.canonical(n) for n in pool.buffers}


def verify(memory: KVMemory, rounds: int = 4, pages: Optional[int] = None, progress: bool = True,
           seed: int = 0, corrupt: Optional[Callable[[KVMemory], None]] = None) -> VerifyReport:
    """Round-trip random pages device→host→device through the configured io backend.

    Each round does both granularities: all-layer backup then per-layer loads, and
    per-layer backups then one all-layer load; device pages are poisoned between the two
    legs so only the host copy can restore them.  ``corrupt(memory)`` runs between backup
    and load (tests inject faults there).  On any mismatch the pools are freed.
    """
    plan = memory.plan
    rep = VerifyReport(ok=True, io_backend=plan.io_backend, io_backend_effective=plan.io_backend_effective,
                       io_note=plan.io_note)
    if memory.host_pool is None or memory.transfer is None:
        rep.skipped = "HiCache is off: there is no host pool to round-trip through"
        return rep
    dpool, hpool, xfer = memory.device_pool, memory.host_pool, memory.transfer
    n = pages or min(64, dpool.num_pages, hpool.page_num)
    n = max(1, min(n, dpool.num_pages, hpool.page_num))
    rep.pages_per_round = n
    gen = torch.Generator().manual_seed(seed)
    views = _byte_views(dpool)
    times = {"backup_all": 0.0, "load_layer": 0.0, "backup_layer": 0.0, "load_all": 0.0}
    moved = {k: 0 for k in times}
    L = dpool.layer_num
    it = range(rounds)
    if progress:
        from tqdm import tqdm
        it = tqdm(it, desc="verify", unit="round", leave=False)

    def timed(key, fn):
        t0 = time.perf_counter()
        b = fn()
        xfer.synchronize()
        times[key] += time.perf_counter() - t0
        moved[key] += b

    try:
        _rounds(it, n, gen, views, xfer, dpool, hpool, L, timed, corrupt, memory, rep)
    except BaseException:
        memory.close()
        rep.freed = True
        raise
    rep.bytes_moved = sum(moved.values())
    rep.gbps = {k: moved[k] / times[k] / 1e9 for k in times if times[k] > 0}
    if rep.mismatched_bytes:
        rep.ok = False
        memory.close()
        rep.freed = True
    return rep


def _rounds(it, n, gen, views, xfer, dpool, hpool, L, timed, corrupt, memory, rep):
    for r in it:
        for mode in ("all->layer", "layer->all"):
            dp = (torch.randperm(dpool.num_pages, generator=gen)[:n] + 1)
            hp = torch.randperm(hpool.page_num, generator=gen)[:n]
            expect = {}
            for name, v in views.items():
                rnd = torch.randint(0, 256, (v.shape[0], n) + tuple(v.shape[2:]), dtype=torch.uint8, generator=gen)
                v[:, dp.to(v.device)] = rnd.to(v.device)
                expect[name] = rnd
            if mode == "all->layer":
                timed("backup_all", lambda: xfer.backup(hp, dp))
            else:
                for l in range(L):
                    timed("backup_layer", lambda: xfer.backup(hp, dp, layer=l))
            for v in views.values():
                v[:, dp.to(v.device)] = 0xA5
            if corrupt is not None:
                corrupt(memory)
            if mode == "all->layer":
                for l in range(L):
                    timed("load_layer", lambda: xfer.load(hp, dp, layer=l))
            else:
                timed("load_all", lambda: xfer.load(hp, dp))
            for name, v in views.items():
                got = v[:, dp.to(v.device)].cpu()
                bad = int((got != expect[name]).sum())
                if bad:
                    rep.mismatched_bytes += bad
                    rep.mismatches.append({"round": r, "mode": mode, "buffer": name, "bytes": bad})
        rep.rounds += 1


__all__ = ["KVMemory", "build_memory", "make_transfer", "verify", "VerifyReport"]
