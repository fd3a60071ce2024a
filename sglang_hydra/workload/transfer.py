"""How long a request's KV takes from a prefill engine to a decode engine (``deploy=pd``).

Each prefill rank sends its share of the KV over its own link in parallel: ``min(prefill TP,
decode TP)`` links of ``nvlink_gbps`` when both engines sit on one node and the backend moves
GPU memory over NVLink there (NIXL: UCX picks CUDA IPC), else of ``nic_gbps`` (both per GPU, from the
hardware preset).  Mooncake in SGLang 0.5.23 initialises its transfer engine with
``MOONCAKE_PROTOCOL`` (default ``rdma``) and only uses NVLink with ``SGLANG_MOONCAKE_CUSTOM_MEM_POOL``
set, so by default its KV crosses the NICs even within a node; ZMQ is TCP through the host.  A backend reaches only part of a link: the efficiencies are
the project's own idle-machine ``bench_disagg`` ratios to a loopback copy (docs/benchmarks.md,
"The idle rerun at 256 MiB": NIXL 0.52x, Mooncake 0.22x, ZMQ 0.10x), and its per-transfer
overhead comes from the same run (128 requests of 2 MiB against one of 256 MiB: NIXL 0.90 ms,
Mooncake 0.65 ms per request, ZMQ none measurable).  A prefill engine's link carries one transfer
at a time (FIFO), so bursts queue.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

__all__ = ["TRANSFER_BACKENDS", "BACKEND_EFFICIENCY", "BACKEND_OVERHEAD_S", "KVLink", "link_for"]

BACKEND_EFFICIENCY: Dict[str, float] = {"nixl": 0.52, "mooncake": 0.22, "zmq": 0.10}
BACKEND_OVERHEAD_S: Dict[str, float] = {"nixl": 0.90e-3, "mooncake": 0.65e-3, "zmq": 0.0}
TRANSFER_BACKENDS = tuple(BACKEND_EFFICIENCY)
#: backends that move KV over NVLink between engines of one node (by default)
NVLINK_BACKENDS = ("nixl",)
GB = 1e9


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
    if backend not in BACKEND_EFFICIENCY:
        raise ValueError(f"disagg.disaggregation_transfer_backend={backend!r} is not modelled; "
                         f"allowed: {', '.join(TRANSFER_BACKENDS)}")
    use_nvlink = same_node and backend in NVLINK_BACKENDS and nvlink_gbps
    gbps = nvlink_gbps if use_nvlink else nic_gbps
    if not gbps or gbps <= 0:
        raise ValueError(f"hardware.{'nvlink_gbps' if use_nvlink else 'nic_gbps'} is not set; "
                         "the KV transfer of deploy=pd needs it")
    return KVLink(bytes_per_s=lanes * gbps * GB * BACKEND_EFFICIENCY[backend],
                  overhead_s=BACKEND_OVERHEAD_S[backend], medium="nvlink" if use_nvlink else "nic")
