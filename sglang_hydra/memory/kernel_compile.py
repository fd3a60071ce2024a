"""The Triton page-copy kernel compiled for CUDA GPUs this machine does not have.

No GPU has been lent to the project, so the interpreter (``TRITON_INTERPRET=1``) is the
only place the kernel runs; it accepts programs a real compile rejects and says nothing
about registers or access widths.  Triton compiles for any ``GPUTarget`` without a
device (``ptxas`` ships in its wheel), so this module:

* enumerates every compile configuration the project can launch by running its own
  launch path (:meth:`TritonTransfer.plan_launches` on real, tiny pools) over every host
  layout, MLA and MHA, both directions, all-layer and per-layer calls, page sizes 1-256
  and element widths 1, 2, 4 and 8 bytes, then binds each launch with Triton's own binder
  (the one ``kernel[grid](...)`` uses) and keeps one launch per distinct compile key;
* compiles each key for each target and reads, from the PTX and the cubin, the registers,
  local memory (spills), the global access widths and any 64-bit integer division.

Pools are allocated on the CPU: the strides are the ones a CUDA pool has, and the base
pointers are at least 64-byte aligned there as on a GPU (the kernel uses at most 16), so
the launches, and hence the compile keys, are the ones a GPU run makes.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

from . import device_pool as device_pool_module
from . import host_pool as host_pool_module
from . import transfer_triton
from .device_pool import DeviceKVPool
from .geometry import ITEMSIZE, MHA_LAYOUTS, MLA_LAYOUTS, KVGeometry
from .host_pool import HostKVPool

#: GPU names accepted by ``--targets`` (compute capability); Triton 3.x compiles for these
TARGETS = {"sm_80": 80, "sm_86": 86, "sm_87": 87, "sm_89": 89, "sm_90": 90, "sm_100": 100, "sm_120": 120}
#: A100, L40S, H100/H200
DEFAULT_TARGETS = ("sm_80", "sm_89", "sm_90")
#: page sizes the enumeration walks (the record allows any page size >= 1; 256 tokens is the
#: largest the project plans for, and block_for_page reaches its largest block well before)
PAGE_SIZES = tuple(range(1, 257))
#: element width of each KV dtype the pools store
KV_DTYPES = ("bfloat16", "float8_e4m3fn")


class CompileSetupError(Exception):
    """Bad input for the compile run (unknown target, Triton without the CUDA backend)."""


# ------------------------------------------------------------------------------ geometries
@dataclass(frozen=True)
class PoolShape:
    """One KV row shape to build pools for (layers kept small: strides, not sizes, matter)."""

    name: str
    arch: str
    heads: int
    head_dim: int
    v_head_dim: int
    kv_lora_rank: int
    rope: int
    dtype: str
    layers: int

    def geometry(self, page_size: int) -> KVGeometry:
        store = "uint8" if self.dtype.startswith("float8") else self.dtype
        return KVGeometry(self.arch, self.layers, self.heads, self.head_dim, self.v_head_dim, self.kv_lora_rank,
                          self.rope, page_size, self.dtype, store, ITEMSIZE[store])

    @property
    def layouts(self) -> Tuple[str, ...]:
        if self.arch == "mla":
            return MLA_LAYOUTS
        return MHA_LAYOUTS if self.head_dim == self.v_head_dim else ("page_first", "page_first_direct")


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float8_e4m3fn": "fp8"}.get(dtype, dtype)


def preset_shapes(layers: int = 2) -> List[PoolShape]:
    """Row shapes of the model presets (``conf/model``): all KV heads and one head per rank
    (the most tensor-parallel split), in bf16 and fp8."""
    from ..config.presets import group_options, preset

    shapes = []
    for name in group_options("model"):
        data = (preset("model", name)[0] or {}).get("model", {})
        arch = str(data.get("attention_arch", "mha")).lower()
        for dtype in KV_DTYPES:
            if arch == "mla":
                rank, rope = int(data["kv_lora_rank"]), int(data["qk_rope_head_dim"])
                shapes.append(PoolShape(f"{name}/{_short(dtype)}", "mla", 1, rank + rope, 0, rank, rope, dtype, layers))
                continue
            d = int(data["head_dim"])
            for heads in sorted({int(data["num_key_value_heads"]), 1}, reverse=True):
                shapes.append(PoolShape(f"{name}/{heads}h/{_short(dtype)}", "mha", heads, d, int(data.get("v_head_dim") or d), 0, 0,
                                        dtype, layers))
    return shapes


def width_probe_shapes() -> List[PoolShape]:
    """Rows whose byte length forces each element width the kernel moves (1, 2, 4 bytes;
    the presets all move 8-byte integers), at 1, 2 and 3 layers so that strides take odd
    and even multiples, plus K and V of different widths (no shared allocation)."""
    out = []
    for layers in (1, 2, 3):
        for name, arch, heads, d, rank, rope, dtype in (
                ("odd-row-fp8", "mha", 1, 65, 0, 0, "float8_e4m3fn"),      # 65-byte rows: 1-byte integers
                ("2mod4-row-bf16", "mha", 1, 65, 0, 0, "bfloat16"),        # 130-byte rows: 2-byte integers
                ("4mod8-row-bf16", "mha", 1, 66, 0, 0, "bfloat16"),        # 132-byte rows: 4-byte integers
                ("3-heads-bf16", "mha", 3, 22, 0, 0, "bfloat16"),          # 3 heads of 44 bytes
                ("odd-mla-fp8", "mla", 1, 65, 33, 32, "float8_e4m3fn")):   # 33 + 32-byte latent split
            out.append(PoolShape(f"{name}/{layers}L", arch, heads, d, 0 if arch == "mla" else d, rank, rope, dtype,
                                 layers))
    out.append(PoolShape("k192-v128-bf16", "mha", 2, 192, 128, 0, 0, "bfloat16", 2))
    return out


def pool_shapes() -> List[PoolShape]:
    return preset_shapes() + width_probe_shapes()


# ------------------------------------------------------------------------- launch path
@dataclass(frozen=True)
class LaunchOrigin:
    """Where a launch came from: pool shape, host layout, page size, direction, layers."""

    shape: str
    layout: str
    page_size: int
    direction: str
    layers: str

    def __str__(self) -> str:
        return f"{self.shape} {self.layout} ps={self.page_size} {self.direction} {self.layers}"


@contextmanager
def _untouched_pools():
    """Pools allocated without zeroing: the enumeration reads strides and pointers, never
    contents, and zeroing every page size of every shape would write gigabytes."""
    def empty(shape, dtype, device, **_):
        return torch.empty(tuple(shape), dtype=dtype, device=device)

    saved = device_pool_module.allocate_zeroed, host_pool_module.allocate_zeroed
    device_pool_module.allocate_zeroed = host_pool_module.allocate_zeroed = empty
    try:
        yield
    finally:
        device_pool_module.allocate_zeroed, host_pool_module.allocate_zeroed = saved


def planned_launches(shape: PoolShape, layout: str, page_size: int) -> Iterator[Tuple[LaunchOrigin, Any]]:
    """Every launch a transfer call makes for pools of ``shape`` in ``layout``: backup and
    load, all layers and each single layer, through ``TritonTransfer.plan_launches``."""
    geometry = shape.geometry(page_size)
    with _untouched_pools():
        device_pool = DeviceKVPool(geometry, page_size, "cpu")
        host_pool = HostKVPool(geometry, layout, page_size)
    transfer = transfer_triton.TritonTransfer(device_pool, host_pool)
    pages = torch.tensor([0], dtype=torch.int64)
    for to_host in (True, False):
        for layer in (None,) + tuple(range(shape.layers)):
            pairs = list(transfer._views(layer))
            origin = LaunchOrigin(shape.name, layout, page_size, "backup" if to_host else "load",
                                  "all layers" if layer is None else f"layer {layer}")
            for plan in transfer.plan_launches(pairs, pages, pages, page_size, to_host):
                yield origin, plan


@dataclass
class KernelConfig:
    """One compile key: what Triton compiles once and reuses for every matching launch."""

    elem_bytes: int
    mode: int
    block: int
    vec: int
    num_warps: int
    triton_key: str
    signature: Dict[str, str]
    constexprs: Dict[Tuple[int, ...], Any]
    attrs: Dict[Tuple[int, ...], Any]
    options: Dict[str, Any]
    origins: List[LaunchOrigin] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"i{8 * self.elem_bytes}/MODE{self.mode}/BLOCK{self.block}/VEC{self.vec}/w{self.num_warps}"

    @property
    def vector_bits(self) -> int:
        """Bits one lane moves per access when the PTX uses all the alignment VEC promises."""
        return 8 * self.vec * self.elem_bytes


def cuda_target(name: str):
    """``GPUTarget`` for ``sm_XY`` (CompileSetupError for a name not in ``TARGETS``)."""
    if name not in TARGETS:
        raise CompileSetupError(f"--targets: unknown target {name!r}; allowed: {', '.join(TARGETS)}")
    from triton.backends.compiler import GPUTarget
    return GPUTarget("cuda", TARGETS[name], 32)


def cuda_backend():
    """Triton's CUDA compiler backend, or CompileSetupError when this Triton has none."""
    try:
        import triton  # noqa: F401
        from triton.backends import backends
        from triton.compiler import make_backend
    except Exception as exc:  # pragma: no cover - depends on the install
        raise CompileSetupError(f"triton: not importable ({exc}); install triton with its CUDA backend")
    if "nvidia" not in backends:
        raise CompileSetupError(f"triton {triton.__version__}: no CUDA backend (backends: "
                                f"{', '.join(sorted(backends)) or 'none'}); install a triton wheel with the nvidia backend")
    return make_backend(cuda_target(DEFAULT_TARGETS[-1]))


def _binder(kernel, backend):
    from triton.runtime.jit import create_function_from_signature
    return create_function_from_signature(kernel.signature, kernel.params, backend)


def triton_key(binder, plan) -> Tuple[str, Any]:
    """Triton's cache key for ``kernel[grid](*plan.args, **plan.options)`` (the kernel
    takes no JIT functions as arguments, so the key is the specialisation and the options,
    as in ``triton.runtime.jit.compute_cache_key``), and the bound call."""
    bound = binder(*plan.args, **plan.options)
    _, specialization, options = bound
    return str(specialization) + str(options), bound


def bind_launch(kernel, backend, plan, key: str, bound) -> KernelConfig:
    """What that launch compiles: Triton's own argument packing, without a driver."""
    args, specialization, options = bound
    opts, signature, constexprs, attrs = kernel._pack_args(backend, dict(plan.options), args, specialization, options)
    return KernelConfig(plan.args[0].element_size(), plan.mode, plan.block, plan.vec, plan.num_warps, key,
                        signature, constexprs, attrs, dict(opts.__dict__))


def _launch_signature(plan) -> Tuple[Any, ...]:
    """What Triton's binder sees of a launch once no scalar is specialised on its value:
    the tensors' dtypes and the compile options."""
    return tuple(str(a.dtype) for a in plan.args if isinstance(a, torch.Tensor)) + tuple(sorted(plan.options.items()))


def launch_configurations(shapes: Optional[Sequence[PoolShape]] = None, page_sizes: Iterable[int] = PAGE_SIZES,
                          bind_every: bool = False, jobs: int = 1) -> Tuple[List[KernelConfig], Dict[str, int]]:
    """Distinct compile keys over the whole launch space, and how many launches were planned
    per ``"<arch> <layout>"``.

    Triton's binder runs once per distinct :func:`_launch_signature`; ``bind_every`` runs it
    for every launch and checks that the signature does determine Triton's key (slower).
    ``jobs`` > 1 spreads the pool shapes over that many processes."""
    shapes = list(pool_shapes() if shapes is None else shapes)
    page_sizes = tuple(page_sizes)
    if jobs > 1 and len(shapes) > 1:
        chunks = [shapes[i::jobs] for i in range(jobs)]
        with _process_pool(jobs) as pool:
            parts = list(pool.map(_configurations_of, [(c, page_sizes, bind_every) for c in chunks if c]))
    else:
        parts = [_configurations_of((shapes, page_sizes, bind_every))]
    configs: "OrderedDict[str, KernelConfig]" = OrderedDict()
    launches: Dict[str, int] = {}
    for part, counts in parts:
        for k, v in counts.items():
            launches[k] = launches.get(k, 0) + v
        for cfg in part:
            seen = configs.setdefault(cfg.triton_key, cfg)
            if seen is not cfg:
                seen.origins.extend(cfg.origins[:max(0, 3 - len(seen.origins))])
    ordered = sorted(configs.values(), key=lambda c: (c.elem_bytes, c.mode, c.block, c.vec, c.num_warps))
    return ordered, launches


def _configurations_of(job) -> Tuple[List[KernelConfig], Dict[str, int]]:
    shapes, page_sizes, bind_every = job
    backend = cuda_backend()
    kernel = transfer_triton.jit_page_copy()
    binder = _binder(kernel, backend)
    configs: "OrderedDict[str, KernelConfig]" = OrderedDict()
    key_of: Dict[Tuple[Any, ...], str] = {}
    launches: Dict[str, int] = {}
    for shape in shapes:
        for layout in shape.layouts:
            where = f"{shape.arch} {layout}"
            for ps in page_sizes:
                for origin, plan in planned_launches(shape, layout, ps):
                    launches[where] = launches.get(where, 0) + 1
                    signature = _launch_signature(plan)
                    key = key_of.get(signature)
                    if key is None or bind_every:
                        bound_key, bound = triton_key(binder, plan)
                        if key is not None and bound_key != key:
                            raise AssertionError(f"{origin}: Triton key {bound_key} differs from {key} of an "
                                                 "identical launch signature; a scalar is specialised on its value")
                        key = key_of[signature] = bound_key
                        if key not in configs:
                            configs[key] = bind_launch(kernel, backend, plan, key, bound)
                    seen = configs[key]
                    if len(seen.origins) < 3:
                        seen.origins.append(origin)
    return list(configs.values()), launches


def _process_pool(jobs: int):
    """Worker processes started fresh (``spawn``): no state of this process leaks in."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    return ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_quiet_worker)


def _quiet_worker() -> None:
    import warnings
    warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")


# ------------------------------------------------------------------------- compile + PTX
_ACCESS = re.compile(r"\b(ld|st)\.global((?:\.[\w:]+)*)")
_DIV64 = re.compile(r"\b(?:div|rem)(?:\.[a-z]+)*\.[su]64\b")
_LOCAL = re.compile(r"\b(?:ld|st)\.local\b")


def access_bits(suffixes: str) -> int:
    """Bits of one ``ld.global``/``st.global`` from its suffixes (``.v4.b32`` -> 128)."""
    lanes, bits = 1, 0
    for part in suffixes.split(".")[1:]:
        if re.fullmatch(r"v\d+", part):
            lanes = int(part[1:])
        elif re.fullmatch(r"[bsuf]\d+", part):
            bits = int(part[1:])
    return lanes * bits


def ptx_facts(ptx: str) -> Dict[str, Any]:
    loads, stores = [], []
    for kind, suffixes in _ACCESS.findall(ptx):
        (loads if kind == "ld" else stores).append(access_bits(suffixes))
    return {"load_bits": sorted(loads), "store_bits": sorted(stores), "div64": sorted(set(_DIV64.findall(ptx))),
            "local_ops": len(_LOCAL.findall(ptx))}


def _cuobjdump() -> Optional[str]:
    import triton
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return path if os.access(path, os.X_OK) else None


def cubin_resources(cubin: bytes) -> Dict[str, int]:
    """Registers, stack and local bytes of the kernel, from ``cuobjdump -res-usage``."""
    tool = _cuobjdump()
    if tool is None:
        raise RuntimeError("cuobjdump is missing from the triton wheel")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, timeout=60, check=True).stdout
    found = {k: int(v) for k, v in re.findall(r"\b(REG|STACK|LOCAL):(\d+)", out)}
    if "REG" not in found:
        raise RuntimeError(f"cuobjdump -res-usage printed no register count: {out.strip()[:200]}")
    return {"registers": found["REG"], "stack_bytes": found.get("STACK", 0), "local_bytes": found.get("LOCAL", 0)}


def compile_config(job: Tuple[str, Dict[str, Any]]) -> Dict[str, Any]:
    """Compile one configuration for one target (a process-pool job); never raises."""
    target_name, cfg = job
    result = {"target": target_name, "name": cfg["name"]}
    try:
        import triton
        from triton.compiler import ASTSource

        kernel = transfer_triton.jit_page_copy()
        src = ASTSource(fn=kernel, signature=cfg["signature"], constexprs=cfg["constexprs"], attrs=cfg["attrs"])
        compiled = triton.compile(src, target=cuda_target(target_name), options=cfg["options"])
        result.update(ptx_facts(compiled.asm["ptx"]))
        result.update(cubin_resources(compiled.asm["cubin"]))
        result["ok"] = True
    except Exception as exc:
        result.update(ok=False, error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}")
    return result


def compile_job(cfg: KernelConfig) -> Dict[str, Any]:
    """What a worker process needs of a configuration."""
    return {"name": cfg.name, "signature": cfg.signature, "constexprs": cfg.constexprs, "attrs": cfg.attrs,
            "options": cfg.options}


def compile_all(configs: Sequence[KernelConfig], targets: Sequence[str], jobs: int = 1) -> List[Dict[str, Any]]:
    """Compile every configuration for every target, ``jobs`` processes at a time."""
    work = [(t, compile_job(c)) for t in targets for c in configs]
    if jobs <= 1:
        return [compile_config(w) for w in work]
    with _process_pool(jobs) as pool:
        return list(pool.map(compile_config, work, chunksize=2))


# -------------------------------------------------------------------------------- checks
def expected_vector_bits(cfg: KernelConfig) -> int:
    """The global access width every data load/store of ``cfg`` must reach: 128 bits, or
    ``8 * VEC * elem_bytes`` when the pointers/strides/row length allow only ``VEC``
    elements (see :func:`transfer_triton.vector_elems`)."""
    return min(128, cfg.vector_bits)


def ptx_problems(cfg: KernelConfig, result: Dict[str, Any]) -> List[str]:
    """What ``result`` (one target) shows against the copy-kernel rules; empty when fine."""
    if not result.get("ok"):
        return [f"did not compile: {result.get('error')}"]
    problems = []
    if result["local_bytes"] or result["stack_bytes"] or result["local_ops"]:
        problems.append(f"local memory: {result['local_bytes']} B local, {result['stack_bytes']} B stack, "
                        f"{result['local_ops']} ld/st.local")
    if result["div64"]:
        problems.append(f"64-bit integer division: {', '.join(result['div64'])}")
    want = expected_vector_bits(cfg)
    data_loads = list(result["load_bits"])
    for _ in range(2):              # the two page ids (one 64-bit scalar load each)
        if 64 in data_loads:
            data_loads.remove(64)
    if not data_loads or set(data_loads) != {want}:
        problems.append(f"data loads of {sorted(set(data_loads))} bits, want {want}")
    if not result["store_bits"] or set(result["store_bits"]) != {want}:
        problems.append(f"stores of {sorted(set(result['store_bits']))} bits, want {want}")
    return problems


__all__ = ["TARGETS", "DEFAULT_TARGETS", "PAGE_SIZES", "CompileSetupError", "PoolShape", "KernelConfig",
           "LaunchOrigin", "pool_shapes", "preset_shapes", "width_probe_shapes", "planned_launches",
           "launch_configurations", "cuda_target", "cuda_backend", "compile_all", "compile_config",
           "ptx_facts", "access_bits", "expected_vector_bits", "ptx_problems"]
