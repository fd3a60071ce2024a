"""The memory plan: every size decided from the record *before* anything is allocated.

:func:`make_plan` reads a resolved record (and, on CPU or with HiCache, a host memory
snapshot) and returns a :class:`MemoryPlan` saying how big each buffer will be and why.
All checks that can fail (dtype, layout, layout × io backend, budgets) happen here, so a
failing configuration never allocates.  Only CUDA device queries import torch.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from . import hostmem
from .errors import setup_error
from .geometry import KVGeometry, kv_geometry
from .retraction import choose_backup, decode_host_ratio
from .weights import weights_per_rank

GiB = 1024 ** 3
MiB = 1024 ** 2
GB = 10 ** 9
#: a CPU "device" pool sized from mem_fraction_static never exceeds this: on CPU the pool is
#: a stand-in for tests and dry runs, so it gets what a run needs, not most of the RAM
CPU_DEVICE_POOL_CAP_BYTES = 256 * MiB
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
    #: ranks that share the node's host memory: this server's ranks, or every GPU of a target node
    host_budget_ranks: int = 1
    host_memory: Optional[Dict[str, Any]] = None
    pin_memory: bool = False
    io_backend: Optional[str] = None            # as resolved in the record
    io_backend_effective: Optional[str] = None  # what actually runs
    io_note: str = ""
    pin_method: str = ""
    # the machine the plan is for, and what the weights take before the KV pool
    target: str = "local"
    hardware: Optional[Dict[str, Any]] = None
    mem_fraction_static: Optional[float] = None
    weights_bytes: Optional[int] = None
    weights_reason: str = ""
    buffers: List[BufferInfo] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def total_bytes(self) -> int:
        return self.device_bytes + self.host_bytes

    def _budget_text(self) -> str:
        """How the per-rank host budget was divided: the node's RAM less the reserve, over the ranks
        that share it (every GPU of a target node runs one)."""
        ram = (self.host_memory or {}).get("available")
        ram_text = f"{ram / GB:,.0f} GB" if ram else "host RAM"
        n = self.host_budget_ranks
        return f"{ram_text} less the 10 GiB reserve, over the {n} rank{'s' if n != 1 else ''} sharing it"

    def render(self) -> str:
        """A human-readable summary (what ``job=setup`` prints)."""
        g = self.geometry
        lines = [
            f"KV memory plan ({g['arch']}, {g['layers']} layers, {g['heads']} kv heads/rank, "
            f"dtype {g['dtype']}, page {self.page_size})",
            f"  bytes per token {self.bytes_per_token:,}  bytes per page {self.bytes_per_page:,}",
        ]
        hw = self.hardware or {}
        if hw:
            gpu = f"{hw['gpu_memory_gb']:g} GB GPU" if hw.get("gpu_memory_gb") else "no GPU"
            host = f"{hw['host_memory_gb']:g} GB host RAM" if hw.get("host_memory_gb") else "host RAM unknown"
            live = f"; read live: {', '.join(hw['measured'])}" if hw.get("measured") else ""
            lines.append(f"  target {self.target}: {gpu}, {host}, {hw.get('gpus_per_node') or '?'} GPU(s)/node{live}")
        if self.weights_bytes:
            lines.append(f"  weights {self.weights_bytes / GB:.2f} GB per GPU ({self.weights_reason})")
        lines += [
            f"  device [{self.device}] {self.device_tokens:,} tokens = {self.device_pages:,} pages "
            f"(+1 padding page), {self.device_bytes / GiB:.3f} GiB; sized by {self.device_budget_reason}",
        ]
        if self.retraction_backup is not None:
            lines.append(f"  decode retraction backup {self.retraction_backup} ({self.retraction_reason})")
        if self.host_tokens:
            purpose = "" if self.hicache else " (decode retraction backup only)"
            lines.append(
                f"  host{purpose} [{self.host_layout}] {self.host_tokens:,} tokens = {self.host_pages:,} pages, "
                f"{self.host_bytes / GiB:.3f} GiB{' pinned (exact size)' if self.pin_memory else ''}; "
                f"sized by {self.host_budget_reason}"
                + (f"; host budget {self.host_budget_bytes / GB:,.1f} GB/rank ({self._budget_text()})"
                   if self.host_budget_bytes is not None else ""))
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


def _cuda_memory(device: str) -> Tuple[int, int]:
    """(free, total) bytes of a CUDA device, read now."""
    import torch
    free, total = torch.cuda.mem_get_info(torch.device(device))
    return int(free), int(total)


def default_mem_fraction(record: Any, gpu_bytes: int) -> Tuple[float, str]:
    """The reference's default ``mem_fraction_static`` for a GPU of ``gpu_bytes``.

    ``(gpu_MB - reserved_MB) / gpu_MB`` with ``reserved_MB = 512 + 1.5 x activation tokens
    + tp x pp / 8 x 1024``, at least 10,240 MB on GPUs above 60 GB; activation tokens are
    ``max(chunked_prefill_size, 2048)``.  CUDA-graph and DeepEP extras are not modelled.
    """
    mb = gpu_bytes / (1 << 20)
    chunk = getattr(record, "chunked_prefill_size", None) or 0
    act = max(int(chunk), 2048)
    ranks = max(1, int(getattr(record, "tp_size", 1) or 1)) * max(1, int(getattr(record, "pp_size", 1) or 1))
    reserved = 512 + 1.5 * act + ranks / 8 * 1024
    if gpu_bytes / GiB > 60:
        reserved = max(reserved, 10240)
    frac = round((mb - reserved) / mb, 3)
    if frac <= 0:
        raise setup_error("mem_fraction_static",
                          f"the reference default reserves {reserved:,.0f} MB for activations and the runtime, more "
                          f"than the {gpu_bytes / GB:.1f} GB GPU has; set --mem-fraction-static explicitly")
    return frac, f"reference default for a {gpu_bytes / GB:.0f} GB GPU ({reserved:,.0f} MB reserved)"


def _hardware_error(field_name: str, message: str):
    from ..config.errors import ConfigError, Problem
    return ConfigError([Problem(f"hardware.{field_name}", None, message, "plan")])


def _fixed_host(bytes_: int, note: str) -> hostmem.HostMemoryInfo:
    return hostmem.HostMemoryInfo.fixed(bytes_, note=note)


def make_plan(record: Any, device: Optional[str] = None, *, hardware: Any = None,
              host_memory: Optional[hostmem.HostMemoryInfo] = None,
              strict_io: bool = True, check_io: bool = True,
              proc_root: str = "/proc", cgroup_root: str = "") -> MemoryPlan:
    """Decide every size for ``record`` on ``hardware`` without allocating.

    ``hardware`` is a :class:`sglang_hydra.config.hardware.Hardware` (a preset such as
    ``h100_80gb``, or ``local``; None means local with nothing stated).  A preset is never
    measured: its GPU memory, host RAM and GPUs per node size everything.  ``local`` keeps
    the reference's live rules on a GPU server, states a fixed size where the user set one
    (``hardware.host_memory_gb``), and on CPU uses the machine's RAM size, not its momentary
    free memory.  ``host_memory`` replaces any host reading (tests); ``strict_io=False``
    lets any layout run with any of our io backends (benchmarks); ``check_io=False`` skips
    the (torch-importing) check of which io backend would run here.
    """
    from .target import default_hardware, resolve_target

    geo = kv_geometry(record, require_known=True)
    hw_in = hardware if hardware is not None else default_hardware()
    is_target = hw_in is not None and not hw_in.is_local
    if is_target:
        dev = "cuda"
    else:
        dev = resolve_device(record, device)
    on_cuda = dev.startswith("cuda")
    # nothing to read when the caller hands over the host memory for a CPU run
    target = resolve_target(hw_in, device=dev, proc_root=proc_root, cgroup_root=cgroup_root) \
        if host_memory is None or hw_in is not None or on_cuda else None
    hw = target.hardware if target is not None else None
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

    # ---- what the device pool may use ----------------------------------------------------
    weights = weights_per_rank(record)
    gpu_stated = hw is not None and hw.gpu_memory_gb is not None and target.stated_or_preset("gpu_memory_gb")
    frac = getattr(record, "mem_fraction_static", None)
    mtt = getattr(record, "max_total_tokens", None)
    cpu_standin = False
    weights_bytes = 0
    if is_target or gpu_stated or on_cuda:
        # a GPU: mem_fraction_static of its memory holds the weights and the KV pool
        if gpu_stated:
            capacity = int(hw.gpu_memory_gb * GB)
            cap_desc = (f"{hw.gpu_memory_gb:g} GB GPU memory of {hw.name}" if is_target
                        else f"{hw.gpu_memory_gb:g} GB GPU memory (hardware.gpu_memory_gb)")
            gpu_total = capacity
        elif is_target:
            raise _hardware_error("gpu_memory_gb", f"hardware {hw.name} does not state gpu_memory_gb; set "
                                  "hardware.gpu_memory_gb=<GB per GPU>")
        else:
            capacity, gpu_total = _cuda_memory(dev)
            cap_desc = f"{capacity / GiB:.1f} GiB free GPU memory (read now)"
        if frac is None:
            frac, frac_why = default_mem_fraction(record, gpu_total)
            notes.append(f"mem_fraction_static unset; {frac} is the {frac_why}")
        if weights.bytes is None:
            if is_target or gpu_stated:
                raise setup_error("num_parameters",
                                  f"a plan for {'hardware ' + hw.name if is_target else 'a stated GPU size'} subtracts "
                                  f"the model weights from GPU memory, but model.num_parameters is unknown for "
                                  f"model_path {getattr(record, 'model_path', '')!r}; set model.num_parameters=<count>, "
                                  "use a model preset, or a checkpoint directory whose config.json can be counted")
            notes.append("model.num_parameters unknown: no weights subtracted from the live GPU memory")
        else:
            weights_bytes = weights.bytes
        budget = int(capacity * float(frac)) - weights_bytes
        reason = f"mem_fraction_static {frac} of {cap_desc}"
        if weights_bytes:
            reason += f" minus {weights_bytes / GB:.2f} GB weights"
        if budget < geo.bytes_per_page:
            raise setup_error("mem_fraction_static",
                              f"{reason} leaves {budget / GB:.2f} GB, not even one KV page "
                              f"({geo.bytes_per_page:,} bytes); raise --mem-fraction-static, shard the model over "
                              "more GPUs (--tp-size) or pick a larger GPU")
    else:
        # the CPU "device" pool: a stand-in for tests and dry runs, sized from fixed numbers
        cpu_standin = True
        if host_memory is not None:
            capacity = host_memory.available
            cap_desc = f"{capacity / GiB:.1f} GiB host memory (given)"
        else:
            capacity = int(hw.host_memory_gb * GB)
            src = "hardware.host_memory_gb" if "host_memory_gb" in target.stated else "RAM size of this machine"
            cap_desc = f"{capacity / GiB:.1f} GiB host memory ({src})"
        if frac is None:
            frac = DEFAULT_MEM_FRACTION
            notes.append(f"mem_fraction_static unset; using {frac}")
        budget = int(capacity * float(frac))
        reason = f"mem_fraction_static {frac} of {cap_desc}"
        if budget > CPU_DEVICE_POOL_CAP_BYTES:
            budget = CPU_DEVICE_POOL_CAP_BYTES
            reason += f", capped at {CPU_DEVICE_POOL_CAP_BYTES / MiB:.0f} MiB on CPU"
    budget_tokens = (max(budget, 0) // bpt) // ps * ps
    if mtt:
        tokens = int(mtt) // ps * ps
        if tokens <= 0:
            raise setup_error("max_total_tokens", f"max_total_tokens={mtt} is smaller than one page ({ps} tokens)")
        if cpu_standin:
            budget, reason = None, "max_total_tokens"
            if geo.device_bytes(tokens) > capacity:
                raise setup_error("max_total_tokens",
                                  f"max_total_tokens={mtt} needs {geo.device_bytes(tokens) / GiB:.2f} GiB for the KV "
                                  f"pool but the host has {cap_desc}")
        elif tokens > budget_tokens:
            # the reference clamps the pool to what fits and warns
            notes.append(f"max_total_tokens={mtt} does not fit; clamped to {budget_tokens:,} tokens ({reason})")
            tokens = budget_tokens
        else:
            reason = f"max_total_tokens (below the {budget_tokens:,} tokens that fit: {reason})"
    else:
        tokens = budget_tokens
    if tokens <= 0:
        raise setup_error("mem_fraction_static",
                          f"not enough memory for even one KV page ({geo.bytes_per_page:,} bytes) in "
                          f"{budget:,} bytes ({reason}); raise --mem-fraction-static or set --max-total-tokens")
    dev_bytes = geo.device_bytes(tokens)
    plan = MemoryPlan(
        device=dev, geometry=geo.to_dict(), bytes_per_token=bpt, bytes_per_page=geo.bytes_per_page,
        page_size=ps, device_tokens=tokens, device_pages=tokens // ps, device_bytes=dev_bytes,
        device_budget_bytes=budget, device_budget_reason=reason, notes=notes,
        retraction_backup=backup.backend, retraction_reason=backup.reason,
        target=hw.name if hw is not None else "local",
        hardware=target.to_dict() if target is not None else None,
        mem_fraction_static=None if cpu_standin and mtt else float(frac) if frac is not None else None,
        weights_bytes=weights_bytes or None, weights_reason=weights.reason if weights_bytes else "")
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
    if is_target:
        plan.io_backend_effective, plan.io_note = io, f"on {hw.name} (not checked on this machine)"
    elif check_io:
        plan.io_backend_effective, plan.io_note = effective_io(io, dev)
    else:
        plan.io_backend_effective = io
    plan.pin_memory = on_cuda
    if plan.pin_memory:
        plan.pin_method = "cudaHostRegister on an exact-size mmap (no caching-allocator rounding)"
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
    # Where the host budget comes from: given (tests), stated (preset or hardware.host_memory_gb),
    # this machine's RAM size (CPU runs), or the live reading of a GPU server (the reference's rule).
    live_host = False      # True: the host figure is this machine's (read now, or its RAM size)
    if host_memory is not None:
        info = host_memory
    elif target.stated_or_preset("host_memory_gb") or not on_cuda:
        if hw.host_memory_gb is None:
            raise _hardware_error("host_memory_gb", f"hardware {hw.name} does not state host_memory_gb, which sizes "
                                  "the host KV tier; set hardware.host_memory_gb=<GB per node>")
        what = (f"{hw.name} host RAM" if is_target else
                "hardware.host_memory_gb" if "host_memory_gb" in target.stated else "RAM size of this machine")
        info = _fixed_host(int(hw.host_memory_gb * GB), f"{hw.host_memory_gb:g} GB, {what}")
        live_host = "host_memory_gb" in target.measured
    else:
        info = hostmem.probe_host_memory(proc_root, cgroup_root, allow_cgroup_fallback=not auto)
        live_host = True
    backup_only = not hicache
    if backup_only and live_host:
        # RT-1's backup-only pool is a fraction of the device pool; a decode server must not
        # start or fail on this machine's host memory (what else holds it now, or a RAM size
        # below the 10 GiB reserve).  A preset or a stated host_memory_gb is still checked.
        auto = False
        notes.append("backup-only host pool: not sized against this machine's host memory")
    if not on_cuda and not is_target:
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
        if ratio_why:
            why += f"; {ratio_why}"
        plan.host_ratio = eff
    else:
        field_name = "hicache_ratio"
        budget = hostmem.host_memory_budget_bytes(info, ranks=ranks)
        host_tokens, host_pages = hostmem.host_pool_tokens(
            page_size=ps, size_per_token=bpt, device_tokens=tokens, ratio=ratio)
        why = f"hicache_ratio {ratio:g} x {tokens:,} device tokens" + (f" ({ratio_why})" if ratio_why else "")
        plan.host_ratio = ratio
    requested = host_tokens * bpt
    if backup_only and live_host:
        budget = None
    else:
        hostmem.check_host_request(requested, budget, field_name)
    if host_tokens <= tokens and hicache:
        notes.append("host pool is not larger than the device pool; the host tier adds little")
    plan.host_tokens, plan.host_pages, plan.host_bytes = host_tokens, host_pages, requested
    # the figure reported per rank: on a target node every GPU runs a rank, and they all share its RAM
    # (SGLang itself checks one server's ranks only, which is what sizing above checked)
    sharing = ranks
    if is_target and hw is not None and int(getattr(hw, "gpus_per_node", 0) or 0) > ranks:
        sharing = int(hw.gpus_per_node)
    if budget is not None and sharing != ranks:
        budget = hostmem.host_memory_budget_bytes(info, ranks=sharing)
        if requested > budget:
            notes.append(f"the host pool ({requested / GB:,.1f} GB) is over one rank's share of the node "
                         f"({budget / GB:,.1f} GB when {sharing} ranks share it): it fits only with fewer servers "
                         "on the node")
    plan.host_budget_bytes, plan.host_budget_reason, plan.host_budget_ranks = budget, why, sharing
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


@dataclass(frozen=True)
class PoolPages:
    """Pool sizes of a plan, in pages (what a replay's cache capacity is)."""

    device_pages: int
    host_pages: int          # 0 without a host tier
    page_size: int
    bytes_per_page: int


def pool_pages(record: Any, hardware: Any = None, *,
               host_memory: Optional[hostmem.HostMemoryInfo] = None) -> PoolPages:
    """Device and host pages ``record`` gets on ``hardware``, without allocating anything.

    The replay (what-if sweeps) calls this to size its cache tiers for a target machine;
    it is :func:`make_plan` without the io-backend check, so it never imports torch for a
    hardware preset.  Raises the same ConfigError subclasses as ``make_plan``.
    """
    p = make_plan(record, hardware=hardware, host_memory=host_memory, check_io=False)
    return PoolPages(p.device_pages, p.host_pages, p.page_size, p.bytes_per_page)


__all__ = ["MemoryPlan", "BufferInfo", "make_plan", "check_layout_io", "effective_io", "resolve_device",
           "pool_pages", "PoolPages", "default_mem_fraction", "CPU_DEVICE_POOL_CAP_BYTES", "DEFAULT_MEM_FRACTION"]
