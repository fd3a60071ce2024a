"""``hardware``: the machine a plan is sized for, composed *beside* the flat record.

The record says what the server is (model, memory settings ...); the hardware says where
it would run.  Keeping the two apart lets one record be planned for several machines
(``-m hardware=h100_80gb,h200_141gb``) without touching any server setting, and keeps
machine facts (HBM size, PCIe rates) out of ``ServerArgs``, which mirrors the reference
engine's flags.

Presets live in ``conf/hardware/*.yaml`` and cite their vendor sources.  ``local`` is this
machine: its fields are left null and read live when a plan is made
(:func:`sglang_hydra.memory.target.resolve_target`); any field set explicitly, e.g.
``hardware.host_memory_gb=16``, wins over the live reading.  Pure Python (no torch).
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .errors import Problem, did_you_mean
from .spec import arg, arg_of

LOCAL = "local"


@dataclass
class Hardware:
    """One GPU machine, as far as KV sizing and what-if timing need it (GB = 1e9 bytes)."""

    name: str = arg(LOCAL, "Preset name; 'local' is this machine, read live where a field is null.")
    gpu_memory_gb: Optional[float] = arg(None, "Usable device memory (HBM) per GPU, in GB (1e9 B).", gt=0.0)
    hbm_bandwidth_gbps: Optional[float] = arg(None, "Device memory bandwidth per GPU, GB/s.", gt=0.0)
    bf16_tflops: Optional[float] = arg(None, "Dense BF16 tensor throughput per GPU, TFLOP/s (no sparsity).", gt=0.0)
    # --- pass-time model (sglang_hydra.perf): each operation class runs at an efficiency
    # share of a peak; presets derive them from measured kernel tables and say so.
    gemm_efficiency: float = arg(
        0.7, "Share of the dense BF16 peak a large GEMM reaches (many tokens).", gt=0.0, le=1.0)
    gemm_half_tokens: float = arg(
        64.0, "Tokens (GEMM rows) at which a GEMM reaches half of gemm_efficiency; smaller GEMMs are "
        "memory-bound anyway.", ge=0.0)
    gemm_half_outputs: float = arg(
        0.0, "Output elements (rows x columns) at which a GEMM's tiles fill half the GPU: a narrow GEMM "
        "(few columns per GPU at high TP) needs more rows to reach gemm_efficiency.", ge=0.0)
    gemm_k_overhead: float = arg(
        0.0, "Fixed work of a GEMM tile in units of its inner dimension K (prologue, epilogue): a GEMM "
        "with a short K runs at gemm_efficiency x K / (K + this).", ge=0.0)
    memory_efficiency: float = arg(
        0.8, "Share of hbm_bandwidth_gbps that weight reads and element-wise kernels reach.", gt=0.0, le=1.0)
    attention_prefill_efficiency: float = arg(
        0.5, "Share of the dense BF16 peak causal prefill attention (flash attention) reaches.",
        gt=0.0, le=1.0)
    attention_prefill_extra_pairs: float = arg(
        0.0, "Extra (query, key) pairs each prefilled token costs beyond the causal count: the "
        "attention kernel's tiles along the diagonal and its start-up, which short prompts feel.", ge=0.0)
    attention_decode_seq_us: float = arg(
        0.0, "Microseconds decode attention spends per sequence beyond reading its KV.", ge=0.0)
    attention_prefill_layer_us: float = arg(
        0.0, "Fixed microseconds per layer of a pass with prefill attention (the attention block's launch, "
        "rotary embedding and KV-cache write beyond the kernel's FLOPs).", ge=0.0)
    attention_decode_half_ctas: float = arg(
        0.0, "Decode attention: sequences x KV heads per GPU at which the KV read reaches half of "
        "attention_decode_efficiency (small batches leave the GPU's multiprocessors idle).", ge=0.0)
    attention_decode_layer_us: float = arg(
        0.0, "Fixed microseconds per layer of a pass with decode attention beyond reading the KV (the "
        "kernel's launch and the merge of its split-KV partial results).", ge=0.0)
    attention_decode_split_below: float = arg(
        0.0, "Decode attention: below this many sequences x KV heads per GPU the kernel splits each "
        "sequence's context across thread blocks (half a wave of the GPU's SMs); 0: never.", ge=0.0)
    attention_decode_split_ctas: float = arg(
        0.0, "Decode attention: the sequences x KV heads whose occupancy (attention_decode_half_ctas) a "
        "split batch reaches.", ge=0.0)
    attention_decode_efficiency: float = arg(
        0.6, "Share of hbm_bandwidth_gbps decode attention reaches reading the KV cache.", gt=0.0, le=1.0)
    allreduce_efficiency: float = arg(
        0.6, "Share of the tensor-parallel link bandwidth a large all-reduce reaches.", gt=0.0, le=1.0)
    allreduce_latency_us: float = arg(
        10.0, "Fixed microseconds of one all-reduce (launch and synchronisation).", ge=0.0)
    allreduce_tp_scaling: float = arg(
        0.0, "How an all-reduce's per-GPU rate grows with the group: x (tp/2)^scaling (NVSwitch "
        "multicast makes larger groups faster; 0: flat).", ge=-2.0, le=2.0)
    allreduce_table_us: Optional[Dict[str, Any]] = arg(
        None, "Measured all-reduce time by group size: {tp: [[message bytes, microseconds], ...]}, read by "
        "linear interpolation in the bytes (past the last point along its last segment); a group size it "
        "lacks (or null) uses the ring model of allreduce_efficiency / allreduce_latency_us.")
    allreduce_bridge_gbps: Optional[float] = arg(
        None, "PCIe cards: the rate, GB/s, that all GPUs of a tensor-parallel group larger than a pair "
        "share (their all-reduce traffic crosses the host bridge); null: every GPU has its own link.", gt=0.0)
    kernel_floor_us: float = arg(
        3.0, "Shortest time any one kernel takes, microseconds (launch and tail effects).", ge=0.0)
    elementwise_kernel_us: float = arg(
        3.0, "Fixed microseconds of one element-wise kernel (norm, activation) beyond its memory traffic.",
        ge=0.0)
    pass_overhead_us: float = arg(
        0.0, "Fixed microseconds per forward pass beyond its kernels (scheduling, sampling).", ge=0.0)
    prefill_attention_span: str = arg(
        "new", "What a prefill's attention kernel attends from: 'new' (the new tokens over the cached prefix, "
        "as FlashInfer/FA3 do) or 'full_sequence' (the whole sequence again, cached prefix included, as "
        "SGLang's torch_native backend does); job=calibrate via the engine states it for this machine.")
    request_path_us: float = arg(
        0.0, "Fixed microseconds a request spends outside forward passes before its first token reaches "
        "the client (HTTP, tokenizer manager, IPC to the scheduler and back); job=calibrate measures it "
        "through the engine. Added to TTFT and E2E, not to TPOT.", ge=0.0)
    disagg_prefill_pass_scale: float = arg(
        1.0, "What-if only: every pass of a PD prefill server takes this many times its aggregated "
        "time.  1.0 in every preset: the PD cost (KV transfer, bootstrap, polling) is simulated once, "
        "on the KV link; set it only from your own measurement of a PD server's passes.", ge=1.0, le=3.0)
    disagg_decode_pass_scale: float = arg(
        1.0, "What-if only: every pass of a PD decode server takes this many times its aggregated "
        "time.  1.0 in every preset (see disagg_prefill_pass_scale).", ge=1.0, le=3.0)
    tp_link: str = arg(
        "nvlink", "The link tensor-parallel all-reduces cross: nvlink (nvlink_gbps) or pcie (h2d_gbps).",
        choices=("nvlink", "pcie"))
    nvlink_gbps: Optional[float] = arg(
        None, "NVLink bandwidth per GPU, one direction, GB/s; null: no NVLink.", gt=0.0)
    nic_gbps: Optional[float] = arg(
        None, "Network bandwidth per GPU for cross-node KV transfer, one direction, GB/s.", gt=0.0)
    h2d_gbps: Optional[float] = arg(None, "Host-to-device copy rate per GPU, GB/s (one direction).", gt=0.0)
    d2h_gbps: Optional[float] = arg(None, "Device-to-host copy rate per GPU, GB/s (one direction).", gt=0.0)
    host_memory_gb: Optional[float] = arg(
        None, "Host RAM per node in GB (1e9 B); the host KV tier is sized against it.", gt=0.0)
    storage_read_gbps: Optional[float] = arg(None, "Local storage read rate per node, GB/s.", gt=0.0)
    storage_write_gbps: Optional[float] = arg(None, "Local storage write rate per node, GB/s.", gt=0.0)
    gpus_per_node: Optional[int] = arg(None, "GPUs in one node (they share its host RAM).", ge=1)
    source: str = arg("", "Where the numbers come from (vendor pages, datasheets).")

    @property
    def is_local(self) -> bool:
        return self.name == LOCAL

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


HARDWARE_FIELDS: Tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Hardware))


def _field_infos():
    from .record import FieldInfo

    hints = typing.get_type_hints(Hardware)
    return {f.name: FieldInfo(f.name, "hardware", hints[f.name], f.default, f.default_factory, arg_of(f))
            for f in dataclasses.fields(Hardware)}


def hardware_options() -> List[str]:
    """The presets in ``conf/hardware``."""
    from .presets import group_options

    return group_options("hardware")


def compose_hardware(option: Optional[str], settings: Iterable[Tuple[str, Any, str]] = (),
                     preset_data: Optional[Dict[str, Any]] = None) -> Tuple[Hardware, List[Problem]]:
    """The hardware for ``hardware=<option>`` plus ``hardware.<field>=value`` settings.

    Every value goes through the record's own type and bound checks; unknown presets and
    fields are problems (listing what exists), never exceptions.  ``preset_data`` replaces
    reading ``conf/hardware/<option>.yaml`` (the Hydra composer hands over its own tree).
    """
    problems: List[Problem] = []
    infos = _field_infos()
    values: Dict[str, Any] = {n: fi.default_value() for n, fi in infos.items()}
    option = option or LOCAL
    if preset_data is None:
        from .presets import preset

        data, _plain = preset("hardware", option)
        if data is None:
            opts = hardware_options()
            problems.append(Problem("hardware", None, f"no hardware preset '{option}'; available: "
                                    f"{', '.join(opts)}{did_you_mean(option, opts)}", "preset"))
            data = {}
        preset_data = (data or {}).get("hardware", {}) if isinstance(data, dict) else {}
        if not isinstance(preset_data, dict):
            problems.append(Problem("hardware", None, f"preset hardware/{option} must map fields to values", "preset"))
            preset_data = {}
    values["name"] = option
    items = [(k, v, f"preset hardware/{option}") for k, v in preset_data.items()] + list(settings)
    from .coerce import coerce

    for key, value, source in items:
        fi = infos.get(key)
        if fi is None:
            problems.append(Problem(f"hardware.{key}", None, f"unknown hardware field{did_you_mean(key, infos)}; "
                                    f"fields: {', '.join(HARDWARE_FIELDS)}", source))
            continue
        v, err = coerce(fi, value)
        if err:
            problems.append(Problem(f"hardware.{key}", None, f"{err} ({fi.arg.help})", source))
            continue
        values[key] = v
    return Hardware(**values), problems


__all__ = ["Hardware", "HARDWARE_FIELDS", "LOCAL", "compose_hardware", "hardware_options"]
