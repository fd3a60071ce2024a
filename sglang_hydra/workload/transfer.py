"""How long a request's KV takes from a prefill engine to a decode engine (``deploy=pd``).

Each prefill rank sends its share of the KV over its own link in parallel: ``min(prefill TP,
decode TP)`` links of ``nvlink_gbps`` when both engines sit on one node and the backend moves
GPU memory over NVLink there (NIXL: UCX picks CUDA IPC), else of ``nic_gbps`` (both per GPU, from the
hardware preset).  Mooncake in SGLang 0.5.23 initialises its transfer engine with
``MOONCAKE_PROTOCOL`` (default ``rdma``) and only uses NVLink with ``SGLANG_MOONCAKE_CUSTOM_MEM_POOL``
set, so by default its KV crosses the NICs even within a node; ZMQ is TCP through the host.

A backend reaches only part of its medium.  :data:`LINK_EFFICIENCY` holds, per backend and
medium, the share of the medium's line rate public measurements of that backend reached on
that medium (sources beside each number; a NIC figure is keyed by the NIC line rate it was
measured at, and a link uses the measurement whose NIC rate is nearest its own).  The fixed
cost per transfer (:data:`BACKEND_OVERHEAD_S`: bootstrap handshake, transfer-status polling,
completion notice) is a CPU control path that does not scale with the link: it is the
project's own measurement (docs/benchmarks.md, "The idle rerun at 256 MiB": 128 requests of
2 MiB against one of 256 MiB: NIXL 0.90 ms, Mooncake 0.65 ms per request, ZMQ none measurable).
These two terms are the whole PD cost of the simulation: a PD server's passes are otherwise
timed like an aggregated server's (the hardware presets' ``disagg_*_pass_scale`` are 1.0).
A prefill engine's link carries one transfer at a time (FIFO), so bursts queue.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Tuple

__all__ = ["TRANSFER_BACKENDS", "LINK_EFFICIENCY", "BACKEND_OVERHEAD_S", "KVLink", "link_for", "link_efficiency"]

#: backend -> medium -> ((NIC line rate it was measured at in GB/s, 0 for NVLink's one figure), share of the line rate)
LINK_EFFICIENCY: Dict[str, Dict[str, Tuple[Tuple[float, float], ...]]] = {
    "mooncake": {
        # Mooncake Transfer Engine, RDMA (RoCE), 40 GB transfers (github.com/kvcache-ai/Mooncake README,
        # "Transfer Engine" performance): 87 GB/s on 4 x 200 Gb/s NICs (87 / 100 = 0.87) and 190 GB/s on
        # 8 x 400 Gb/s NICs (190 / 400 = 0.475).
        "nic": ((25.0, 0.87), (50.0, 0.475)),
    },
    "nixl": {
        # NIXL (UCX backend) over RoCE v2, 16 MB blocks: nixlbench 341 Gb/s on a 400 Gb/s NIC (0.85)
        # (github.com/ai-dynamo/nixl pull 1647, cross-node bandwidth table; ib_write_bw gave 327 Gb/s there).
        "nic": ((50.0, 0.85),),
        # NIXL between GPUs of one node: UCX cuda_ipc, i.e. the GPUs' copy engines over NVLink.  Bound by
        # what a copy-engine peer copy reaches: 380 of 450 GB/s one way on H100 SXM NVLink 4 (0.84;
        # p2pBandwidthLatencyTest, github.com/NVIDIA/nccl issue 1264).
        "nvlink": ((0.0, 0.84),),
    },
    "zmq": {
        # TCP through the host: the TCP baseline of the same Mooncake measurement, 87 / 2.4 = 36 GB/s on
        # 4 x 200 Gb/s (0.36) and 190 / 4.6 = 41 GB/s on 8 x 400 Gb/s (0.10) (Mooncake README).
        "nic": ((25.0, 0.36), (50.0, 0.10)),
    },
}
BACKEND_OVERHEAD_S: Dict[str, float] = {"nixl": 0.90e-3, "mooncake": 0.65e-3, "zmq": 0.0}
TRANSFER_BACKENDS = tuple(LINK_EFFICIENCY)
#: backends that move KV over NVLink between engines of one node (by default)
NVLINK_BACKENDS = tuple(b for b, media in LINK_EFFICIENCY.items() if "nvlink" in media)
GB = 1e9


def link_efficiency(backend: str, medium: str, gbps: float) -> float:
    """The share of a ``medium`` link of ``gbps`` that ``backend`` reaches: the measurement taken at
    the nearest NIC line rate (NVLink has one)."""
    points = LINK_EFFICIENCY[backend][medium]
    return min(points, key=lambda p: (abs(p[0] - gbps), p[0]))[1]


@dataclass
class KVLink:
    """One prefill engine's outgoing KV link towards one decode engine."""

    bytes_per_s: float
    overhead_s: float
    medium: str                 # "nvlink" | "nic"

    def seconds(self, nbytes: float) -> float:
        return self.overhead_s + nbytes / self.bytes_per_s


def link_for(backend: str, *, same_node: bool, lanes: int, nvlink_gbps: float, nic_gbps: float) -> KVLink:
    """The link a ``backend`` transfer runs on (``lanes``: ranks sending in parallel)."""
    if backend not in LINK_EFFICIENCY:
        raise ValueError(f"disagg.disaggregation_transfer_backend={backend!r} is not modelled; "
                         f"allowed: {', '.join(TRANSFER_BACKENDS)}")
    use_nvlink = same_node and backend in NVLINK_BACKENDS and nvlink_gbps
    gbps = nvlink_gbps if use_nvlink else nic_gbps
    if not gbps or gbps <= 0:
        raise ValueError(f"hardware.{'nvlink_gbps' if use_nvlink else 'nic_gbps'} is not set; "
                         "the KV transfer of deploy=pd needs it")
    medium = "nvlink" if use_nvlink else "nic"
    return KVLink(bytes_per_s=lanes * gbps * GB * link_efficiency(backend, medium, gbps),
                  overhead_s=BACKEND_OVERHEAD_S[backend], medium=medium)
