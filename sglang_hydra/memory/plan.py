"""The memory plan: every size decided from the record *before* anything is allocated.

:func:`make_plan` reads a resolved record (and, on CPU or with HiCache, a host memory
snapshot) and returns a :class:`MemoryPlan` saying how big each buffer will be and why.
All checks that can fail (dtype, layout, layout × io backend, budgets) happen here, so a
failing configuration never allocates.  Only CUDA device queries import torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .. import hostmem
from .errors import setup_error
from .geometry import KVGeometry, kv_geometry
from .retraction import choose_backup, decode_host_ratio

GiB = 1024 ** 3
#: a CPU "device" pool sized from mem_fraction_static never exceeds this
CPU_DEVICE_POOL_CAP_BYTES = 4 * GiB
#: mem_fraction_static when the record leaves it unset
DEFAULT_MEM_FRACTION = 0.88

IO_BACKENDS = ("direct", "kernel", "kernel_ascend")


@dataclass
class BufferInfo:
    name: str
    where: str             # 'device' | 'host'
    shape: List[int]
    dtype: str             # stored element type
    bytes: int


@dataclass
class MemoryPlan:
    """What will be allocated, and why. ``to_dict()`` is JSON-serialisable."""

    device: str
    geometry: Dict[str, Any]
    bytes_per_token: int
    bytes_per_page: int
    page_size: int
    device_tokens: int
    device_pages: int               # allocatable pages (the padding page excluded)
    device_bytes: int
    device_budget_bytes: Optional[int]
    device_budget_reason: str
    hicache: bool = False
    # RT-1: where a PD decode server backs up retracted requests (None off decode servers)
    retraction_backup: Optional[str] = None
    retraction_reason: str = ""
    host_layout: Optional[str] = None
    host_tokens: int = 0
    host_pages: int = 0
    host_bytes: int = 0
    host_ratio: Optional[float] = None
    host_budget_bytes: Optional[int] = None
    host_budget_reason: str = ""
    host_memory: Optional[Dict[str, Any]] = None
    pin_memory: bool = False
    io_backend: Optional[str] = None            # as resolved in the record
    io_backend_effective: Optional[str] = None  # what actually runs
    io_note: str = ""
    buffers: List[BufferInfo] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def total_bytes(self) -> int:
        return self.device_bytes + self.host_bytes

    def render(self) -> str:
        """A human-readable summary (what ``job=setup`` prints)."""
        g = self.geometry
        lines = [
            f"KV memory plan ({g['arch']}, {g['layers']} layers, {g['heads']} kv heads/rank, "
            f"dtype {g['dtype']}, page {self.page_size})",
            f"  bytes per token {self.bytes_per_token:,}  bytes per page {self.bytes_per_page:,}",
            f"  device [{self.device}] {self.device_tokens:,} tokens = {self.device_pages:,} pages "
            f"(+1 padding page), {self.device_bytes / GiB:.3f} GiB; sized by {self.device_budget_reason}",
        ]
        if self.host_tokens:
            purpose = "" if self.hicache else " (decode retraction backup only)"
            lines.append(
                f"  host{purpose} [{self.host_layout}] {self.host_tokens:,} tokens = {self.host_pages:,} pages, "
                f"{self.host_bytes / GiB:.3f} GiB{' pinned' if self.pin_memory else ''}; "
                f"sized by {self.host_budget_reason}")
            io = self.io_backend_effective
            if io != self.io_backend:
                io = f"{self.io_backend} -> {io}"
            lines.append(f"  io backend {io}" + (f" ({self.io_note})" if self.io_note else ""))
        for b in self.buffers:
            lines.append(f"    {b.where:6s} {b.name:8s} {str(tuple(b.shape)):28s} {b.dtype:14s} {b.bytes:>16,} B")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


def resolve_device(record: Any, device: Optional[str] = None) -> str:
    dev = str(device or getattr(record, "device", None) or "cpu")
    kind = dev.split(":")[0]
    if kind == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise setup_error("device", "device 'cuda' was requested but no CUDA device is visible")
        return dev
    if kind != "cpu":
        raise setup_error("device", f"KV pools can be built on cuda or cpu, not {dev!r}")
    return dev


def check_layout_io(geometry: KVGeometry, layout: str, io: str, strict: bool = True) -> None:
    """Reject the layout × io backend pairs the reference rejects (``strict``)."""
    geometry.host_shapes(layout, geometry.page_size)  # architecture × layout
    if io not in IO_BACKENDS:
        raise setup_error("hicache_io_backend", f"unknown io backend {io!r}")
    if io == "kernel_ascend":
        raise setup_error("hicache_io_backend", "kernel_ascend needs an Ascend NPU; use kernel or direct")
    if not strict or layout == "page_first_kv_split":
        return
    if io == "direct" and layout not in ("layer_first", "page_first_direct"):
        hint = " (page_first_direct is its direct-io twin)" if layout == "page_first" else ""
        raise setup_error("hicache_mem_layout",
                          f"layout {layout!r} cannot be used with the direct io backend; direct supports "
                          f"layer_first and page_first_direct{hint}")
    if io == "kernel" and layout == "page_first_direct":
        raise setup_error("hicache_io_backend",
                          "the kernel io backend does not serve page_first_direct; use direct with it "
                          "(or the page_first layout with kernel)")


def effective_io(io: str, device: str):
    """(effective backend, note) — kernel falls back to direct when Triton cannot run."""
    if io != "kernel":
        return io, ""
    from .transfer_triton import kernel_available
    import torch

    ok, why = kernel_available(torch.device(device))
    if ok:
        return "kernel", why
    return "direct", f"kernel io backend requested but {why}; transfers run with the direct backend"


def _cuda_free_bytes(device: str) -> int:
    import torch
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def make_plan(record: Any, device: Optional[str] = None, *,
              host_memory: Optional[hostmem.HostMemoryInfo] = None,
              strict_io: bool = True, proc_root: str = "/proc", cgroup_root: str = "") -> MemoryPlan:
    """Decide every size for ``record`` without allocating.

    ``host_memory`` replaces the live probe (tests, dry runs); ``strict_io=False`` lets
    any layout run with any of our io backends (benchmarks), beyond the reference's matrix.
    """
    geo = kv_geometry(record)
    dev = resolve_device(record, device)
    on_cuda = dev.startswith("cuda")
    ps = geo.page_size
    bpt = geo.bytes_per_token
    notes: List[str] = []
    hicache = bool(getattr(record, "enable_hierarchical_cache", False))
    backup = choose_backup(record, geo)
    # A host pool exists for HiCache, or alone to back up a decode server's retracted requests.
    host_tier = hicache or backup.backend == "host_pool"
    layout = getattr(record, "hicache_mem_layout", "page_first")
    io = getattr(record, "hicache_io_backend", "kernel")
    if host_tier:
        check_layout_io(geo, layout, io, strict_io)

    def live_host(auto: bool = False) -> hostmem.HostMemoryInfo:
        nonlocal host_memory
        if host_memory is None:
            host_memory = hostmem.probe_host_memory(proc_root, cgroup_root, allow_cgroup_fallback=not auto)
        return host_memory

    # ---- device pool -------------------------------------------------------------------
    mtt = getattr(record, "max_total_tokens", None)
    if on_cuda:
        avail_dev = _cuda_free_bytes(dev)
        avail_desc = f"{avail_dev / GiB:.1f} GiB free GPU memory"
    else:
        avail_dev = live_host().available
        avail_desc = f"{avail_dev / GiB:.1f} GiB available host memory ({live_host().describe()})"
    if mtt:
        tokens = int(mtt) // ps * ps
        if tokens <= 0:
            raise setup_error("max_total_tokens", f"max_total_tokens={mtt} is smaller than one page ({ps} tokens)")
        budget, reason = None, "max_total_tokens"
        if geo.device_bytes(tokens) > avail_dev:
            raise setup_error("max_total_tokens",
                              f"max_total_tokens={mtt} needs {geo.device_bytes(tokens) / GiB:.2f} GiB for the KV "
                              f"pool but only {avail_desc}")
    else:
        frac = getattr(record, "mem_fraction_static", None)
        if frac is None:
            frac = DEFAULT_MEM_FRACTION
            notes.append(f"mem_fraction_static unset; using {frac}")
        budget = int(avail_dev * float(frac))
        reason = f"mem_fraction_static {frac} of {avail_desc}"
        if not on_cuda and budget > CPU_DEVICE_POOL_CAP_BYTES:
            budget = CPU_DEVICE_POOL_CAP_BYTES
            reason += f", capped at {CPU_DEVICE_POOL_CAP_BYTES / GiB:.0f} GiB on CPU"
        tokens = (budget // bpt) // ps * ps
        if tokens <= 0:
            raise setup_error("mem_fraction_static",
                              f"not enough memory for even one KV page ({geo.bytes_per_page:,} bytes) in "
                              f"{budget:,} bytes ({reason}); raise --mem-fraction-static or set --max-total-tokens")
    dev_bytes = geo.device_bytes(tokens)
    plan = MemoryPlan(
        device=dev, geometry=geo.to_dict(), bytes_per_token=bpt, bytes_per_page=geo.bytes_per_page,
        page_size=ps, device_tokens=tokens, device_pages=tokens // ps, device_bytes=dev_bytes,
        device_budget_bytes=budget, device_budget_reason=reason, notes=notes,
        retraction_backup=backup.backend, retraction_reason=backup.reason)
    rows = tokens + ps
    for name, H, D in geo.components:
        shape = [geo.layers, rows, H, D]
        plan.buffers.append(BufferInfo(f"{name}", "device", shape, geo.store_dtype,
                                       geo.layers * rows * H * D * geo.itemsize))
    if geo.symmetric:
        notes.append("device K and V share one allocation of shape (2, L, rows, H, D)")

    # ---- host pool ---------------------------------------------------------------------
    if backup.backend is not None:
        notes.append(f"decode retraction backup: {backup.backend} ({backup.reason})")
    if not host_tier:
        return plan
    plan.hicache = hicache
    plan.host_layout = layout
    plan.io_backend = io
    plan.io_backend_effective, plan.io_note = effective_io(io, dev)
    plan.pin_memory = on_cuda
    ranks = hostmem.ranks_per_host(getattr(record, "tp_size", 1), getattr(record, "pp_size", 1),
                                   getattr(record, "nnodes", 1))
    size_gb = getattr(record, "hicache_size", 0) or 0
    fraction = getattr(record, "hicache_host_memory_fraction", None)
    ratio = getattr(record, "hicache_ratio", None)
    ratio_why = ""
    if ratio is None:  # only decode servers reach here unresolved (M-HR2); RT-1 settles it
        max_context = getattr(record, "context_length", None) or getattr(record, "max_position_embeddings", None) or tokens
        ratio, ratio_why = decode_host_ratio(record, backup.backend, tokens, ps, int(max_context))
    ratio = float(ratio)
    auto = not size_gb and fraction is not None
    info = live_host(auto=auto)
    if not on_cuda:
        # the "device" pool lives in host memory too: book it before sizing the host pool
        info = dataclasses.replace(info, available=max(0, info.available - dev_bytes),
                                   note=(info.note + "; " if info.note else "") +
                                   f"{dev_bytes / GiB:.2f} GiB booked by the CPU device pool")
    plan.host_memory = info.to_dict()
    if size_gb and size_gb > 0:
        field_name = "hicache_size"
        budget = hostmem.host_memory_budget_bytes(info, ranks=ranks)
        host_tokens, host_pages = hostmem.host_pool_tokens(
            page_size=ps, size_per_token=bpt, device_tokens=tokens, ratio=None, hicache_size_gb=size_gb)
        why = f"hicache_size {size_gb} GB"
        plan.host_ratio = host_tokens / tokens
    elif auto:
        field_name = "hicache_host_memory_fraction"
        if not (0 < float(fraction) <= 1):
            raise setup_error("hicache_host_memory_fraction",
                              f"hicache_host_memory_fraction={fraction} must be in (0, 1]")
        budget = int(hostmem.host_memory_budget_bytes(info, ranks=ranks, auto_size=True) * float(fraction))
        eff = hostmem.auto_size_ratio(ratio, budget, dev_bytes)
        host_tokens, host_pages = hostmem.host_pool_tokens(
            page_size=ps, size_per_token=bpt, device_tokens=tokens, ratio=eff)
        why = (f"auto-size ({info.describe()}): ratio {ratio:g} -> {eff:.3f}, "
               f"fraction {float(fraction):g} of the budget after the 10 GiB reserve, {ranks} rank(s)/host")
        plan.host_ratio = eff
    else:
        field_name = "hicache_ratio"
        budget = hostmem.host_memory_budget_bytes(info, ranks=ranks)
        host_tokens, host_pages = hostmem.host_pool_tokens(
            page_size=ps, size_per_token=bpt, device_tokens=tokens, ratio=ratio)
        why = f"hicache_ratio {ratio:g} x {tokens:,} device tokens" + (f" ({ratio_why})" if ratio_why else "")
        plan.host_ratio = ratio
    requested = host_tokens * bpt
    hostmem.check_host_request(requested, budget, field_name)
    if host_tokens <= tokens:
        notes.append("host pool is not larger than the device pool; the host tier adds little")
    plan.host_tokens, plan.host_pages, plan.host_bytes = host_tokens, host_pages, requested
    plan.host_budget_bytes, plan.host_budget_reason = budget, why
    for name, shape in geo.host_shapes(layout, host_tokens).items():
        n = 1
        for s in shape:
            n *= s
        plan.buffers.append(BufferInfo(name, "host", list(shape), geo.store_dtype, n * geo.itemsize))
    if geo.symmetric:
        notes.append("host K and V share one kv_buffer of shape (2, ...)")
    if plan.io_note and plan.io_backend_effective != io:
        notes.append(plan.io_note)
    return plan


__all__ = ["MemoryPlan", "BufferInfo", "make_plan", "check_layout_io", "effective_io", "resolve_device",
           "CPU_DEVICE_POOL_CAP_BYTES", "DEFAULT_MEM_FRACTION"]
