"""KV memory built from a resolved record: device pool, page allocator, host pool, io.

``build_memory(record, device=None)`` is the entry point; ``make_plan(record, hardware=...)``
and ``pool_pages(record, hardware)`` size pools for a target machine without allocating.  Names are loaded lazily so
that ``sglang_hydra.memory.geometry`` (and the errors module) can be imported by the
config layer without pulling in torch.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "build_memory": "build", "KVMemory": "build", "verify": "build", "VerifyReport": "build",
    "make_transfer": "build",
    "make_plan": "plan", "MemoryPlan": "plan", "BufferInfo": "plan", "pool_pages": "plan", "PoolPages": "plan",
    "resolve_target": "target", "Target": "target", "local_hardware": "target", "preset_hardware": "target",
    "hardware_scope": "target", "weights_per_rank": "weights", "weight_bytes": "weights",
    "DeviceKVPool": "device_pool", "PageAllocator": "device_pool", "AllocatorError": "device_pool",
    "HostKVPool": "host_pool",
    "DirectTransfer": "transfer_direct", "TransferBackend": "transfer_direct",
    "TritonTransfer": "transfer_triton",
    "KVGeometry": "geometry", "kv_geometry": "geometry",
    "MemorySetupError": "errors", "TransferIndexError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'sglang_hydra.memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))
