"""The machine a memory plan is sized for: a hardware preset, or this machine read live.

:func:`resolve_target` turns the composed ``hardware`` settings
(:class:`sglang_hydra.config.hardware.Hardware`, nulls allowed) into a :class:`Target`
whose numbers the plan uses.  For a preset (``hardware=h100_80gb``) nothing is measured:
the plan is the same on every machine.  For ``hardware=local`` each null field is read
here, and each field the user set (``hardware.host_memory_gb=16``) is kept as given.

Reading the GPU imports torch, so it only happens when the record's device is cuda.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ..config.hardware import LOCAL, Hardware, compose_hardware
from . import hostmem

GB = 10 ** 9

#: GPU name fragments -> preset whose spec figures fill a live local GPU's null fields
_GPU_PRESETS = (("H200", "h200_141gb"), ("H100", "h100_80gb"), ("A100", "a100_80gb"), ("L40S", "l40s_48gb"))
_SPEC_FIELDS = ("hbm_bandwidth_gbps", "bf16_tflops", "h2d_gbps", "d2h_gbps", "nvlink_gbps", "nic_gbps")


@dataclass(frozen=True)
class Target:
    """Hardware numbers a plan uses, and where each came from."""

    hardware: Hardware
    measured: Tuple[str, ...] = ()     # fields read live from this machine
    stated: Tuple[str, ...] = ()       # local fields the user set explicitly
    notes: Tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.hardware.name

    @property
    def is_local(self) -> bool:
        return self.hardware.is_local

    def stated_or_preset(self, field: str) -> bool:
        """True when ``field`` is a fixed number (a preset's, or set by the user), not a live reading."""
        return not self.is_local or field in self.stated

    def to_dict(self) -> Dict[str, Any]:
        d = self.hardware.to_dict()
        d.update(measured=list(self.measured), stated=list(self.stated), notes=list(self.notes))
        return d


def local_hardware(**fields: Any) -> Hardware:
    """``hardware=local`` with ``fields`` set explicitly (tests, Python callers)."""
    hw, problems = compose_hardware(LOCAL, [(k, v, "python") for k, v in fields.items()])
    if problems:
        from ..config.errors import ConfigError
        raise ConfigError(problems)
    return hw


def preset_hardware(name: str, **fields: Any) -> Hardware:
    """The preset ``name`` (``h100_80gb`` ...) with ``fields`` overridden."""
    hw, problems = compose_hardware(name, [(k, v, "python") for k, v in fields.items()])
    if problems:
        from ..config.errors import ConfigError
        raise ConfigError(problems)
    return hw


#: carries the job's hardware to every plan of the process and of the processes it spawns
HARDWARE_ENV = "SGLANG_HYDRA_HARDWARE"


@contextlib.contextmanager
def hardware_scope(hardware: Optional[Hardware]):
    """Make ``hardware`` the default of every plan made inside the ``with`` block.

    Jobs that allocate through code they do not own (a full replay, the two processes of a
    PD pair) call ``build_memory(record)`` without a hardware argument; this is how they
    still honour ``hardware.host_memory_gb=16`` or refuse ``hardware=h100_80gb``.  It rides
    in an environment variable so spawned children see it too, and is restored on exit.
    """
    if hardware is None:
        yield
        return
    old = os.environ.get(HARDWARE_ENV)
    os.environ[HARDWARE_ENV] = json.dumps(hardware.to_dict())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(HARDWARE_ENV, None)
        else:
            os.environ[HARDWARE_ENV] = old


def default_hardware() -> Optional[Hardware]:
    """The hardware of the enclosing :func:`hardware_scope` (None outside any)."""
    text = os.environ.get(HARDWARE_ENV)
    if not text:
        return None
    return Hardware(**json.loads(text))


def _live_gpu(device: str) -> Optional[Tuple[float, str]]:
    """(total memory in GB, device name) of the current CUDA device, or None."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return None
    if not torch.cuda.is_available():
        return None
    dev = torch.device(device if ":" in device else "cuda")
    props = torch.cuda.get_device_properties(dev)
    return props.total_memory / GB, props.name


def resolve_target(hardware: Optional[Hardware] = None, *, device: str = "cpu",
                   proc_root: str = "/proc", cgroup_root: str = "") -> Target:
    """Fill a local hardware's null fields from this machine; presets pass through untouched."""
    hw = hardware if hardware is not None else Hardware()
    if not hw.is_local:
        return Target(hw)
    defaults = Hardware()
    stated = tuple(f for f in ("gpu_memory_gb", "host_memory_gb", "hbm_bandwidth_gbps", "bf16_tflops",
                               "h2d_gbps", "d2h_gbps", "storage_read_gbps", "storage_write_gbps",
                               "gpus_per_node")
                   if getattr(hw, f) is not None and getattr(hw, f) != getattr(defaults, f))
    fill: Dict[str, Any] = {}
    measured = []
    notes = []
    if hw.host_memory_gb is None:
        cap, why = hostmem.host_capacity_bytes(proc_root, cgroup_root)
        fill["host_memory_gb"] = cap / GB
        measured.append("host_memory_gb")
        notes.append(f"host memory read live: {why}")
    if str(device).startswith("cuda"):
        live = _live_gpu(str(device))
        if live is not None:
            total_gb, gpu_name = live
            if hw.gpu_memory_gb is None:
                fill["gpu_memory_gb"] = total_gb
                measured.append("gpu_memory_gb")
                notes.append(f"GPU read live: {gpu_name}, {total_gb:.1f} GB")
            for frag, preset in _GPU_PRESETS:
                if frag in gpu_name.upper():
                    spec, _ = compose_hardware(preset)
                    for f in _SPEC_FIELDS:
                        if getattr(hw, f) is None and getattr(spec, f) is not None:
                            fill[f] = getattr(spec, f)
                            measured.append(f)
                    notes.append(f"{', '.join(_SPEC_FIELDS)} from the {preset} preset (GPU {gpu_name})")
                    break
            if hw.gpus_per_node is None:
                import torch
                fill["gpus_per_node"] = torch.cuda.device_count()
                measured.append("gpus_per_node")
    return Target(dataclasses.replace(hw, **fill), tuple(measured), stated, tuple(notes))


__all__ = ["Target", "resolve_target", "local_hardware", "preset_hardware", "hardware_scope", "default_hardware",
           "HARDWARE_ENV"]
