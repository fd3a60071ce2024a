"""The GPU layout: how many GPUs a server takes and which ids, and placing decode after prefill's
GPUs when both sides share a node.  It reuses the port layout's host matching, nothing more."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..errors import Problem, problem_for
from ..record import ServerArgs
from .model import _SOURCE, _Side
from .ports import _hosts_overlap, _label

# --------------------------------------------------------------------------- GPUs
def gpus_per_node(record: ServerArgs) -> int:
    """How many GPUs one server takes on each of its nodes.

    Every data-parallel replica (``dp_size``) is a full ``tp_size`` x ``pp_size`` group of GPUs;
    attention DP (``attn_dp_size``) splits the TP group and adds none.  A multi-node server
    (``nnodes``) spreads its GPUs evenly over its nodes."""
    total = max(1, record.tp_size) * max(1, record.pp_size) * max(1, record.dp_size)
    nodes = max(1, record.nnodes)
    return -(-total // nodes)


def gpu_ids(record: ServerArgs) -> List[int]:
    """The GPU ids a server uses on its node: ``base_gpu_id`` then every ``gpu_id_step``-th one."""
    step = max(1, record.gpu_id_step)
    return [record.base_gpu_id + i * step for i in range(gpus_per_node(record))]


def _on_gpus(record: ServerArgs, device_written: bool) -> bool:
    """Whether a server's GPUs need laying out.  A device the user did not write was detected on the
    machine that resolves the command (a login node without a GPU driver says ``cpu``); the servers
    run on a GPU node, so they are laid out as GPU servers: an unused ``--base-gpu-id`` on a real CPU
    run is harmless, while two sides on one GPU would fail at start."""
    return str(record.device or "cuda").lower() != "cpu" or not device_written


def _lay_out_gpus(records: Dict[str, ServerArgs], sides: Dict[str, _Side], problems: List[Problem]) -> Dict[str, int]:
    """Give decode its own GPUs when both sides run on one node.

    Prefill keeps its ``base_gpu_id`` (a top-level value is prefill's, like ``serving.port``);
    decode starts right after prefill's last GPU unless decode's value was written, in which case
    it is kept and must not share a GPU with prefill.  Servers on different hosts are left alone."""
    import logging

    pre, dec = records["prefill"], records["decode"]
    written = {role: "device" in s.side_names or "device" in s.shared_names for role, s in sides.items()}
    if not _hosts_overlap(pre.host, dec.host) or not (_on_gpus(pre, written["prefill"])
                                                       and _on_gpus(dec, written["decode"])):
        return {}
    detected = [role for role, rec in records.items() if str(rec.device).lower() == "cpu" and not written[role]]
    if detected and "base_gpu_id" not in sides["decode"].side_names and not problems:
        logging.getLogger("sglang_hydra.config").warning(
            "deploy=pd: no GPU was found here (device detected as cpu), so decode is placed after prefill's GPUs "
            "as on a GPU node; set device.device=cpu if both sides really run on the CPU")
    if "base_gpu_id" not in sides["decode"].side_names:
        return {"base_gpu_id": pre.base_gpu_id + gpus_per_node(pre) * max(1, pre.gpu_id_step)}
    shared = sorted(set(gpu_ids(pre)) & set(gpu_ids(dec)))
    if shared:
        key = problem_for("base_gpu_id", "")
        problems.append(Problem(
            f"decode.{key.key}", key.flag,
            f"decode GPUs {gpu_ids(dec)} overlap {_label('prefill', 'base_gpu_id')} GPUs {gpu_ids(pre)} "
            f"(GPU {', '.join(map(str, shared))}) on host {dec.host}; each side needs its own GPUs (move one of "
            f"them, leave decode's unset to have it placed after prefill, or run the sides on different hosts "
            f"with prefill.serving.host / decode.serving.host)", _SOURCE))
    return {}


# --------------------------------------------------------------------------- the GPU budget
def server_gpus(record: ServerArgs) -> int:
    """GPUs one server takes over all its nodes: every data-parallel replica is a TP x PP group."""
    return max(1, record.tp_size) * max(1, record.pp_size) * max(1, record.dp_size)


def gpu_budget_problems(groups: List[Tuple[str, int, ServerArgs]], total_gpus: Optional[int],
                        node_gpus: Optional[int], hardware_name: str = "") -> List[Problem]:
    """The deployment's GPUs against ``deploy.total_gpus`` (or one node when that is unset).

    ``groups`` is (count key, server count, one server's record) per kind of server, e.g.
    ``("deploy.prefill_workers", 3, prefill_record)``.  One line names every key in the product."""
    parts, used = [], 0
    for key, count, record in groups:
        side = key.split(".")[1].replace("_workers", "").replace("workers", "")
        prefix = f"{side}." if side else ""
        parts.append(f"{key} {count} x {prefix}parallel.tp_size {max(1, record.tp_size)} x {prefix}parallel.pp_size "
                     f"{max(1, record.pp_size)} x {prefix}parallel.dp_size {max(1, record.dp_size)}")
        used += count * server_gpus(record)
    if total_gpus is not None:
        limit, what, fix = total_gpus, f"deploy.total_gpus {total_gpus}", "raise deploy.total_gpus or use fewer/smaller servers"
    elif node_gpus:
        limit = node_gpus
        what = f"one node's hardware.gpus_per_node {node_gpus}" + (f" (hardware={hardware_name})" if hardware_name else "")
        fix = "use fewer/smaller servers, or set deploy.total_gpus for a larger budget"
    else:
        return []
    if used <= limit:
        return []
    key = groups[0][0] if len(groups) == 1 else "deploy"
    return [Problem(key, None, f"{' + '.join(parts)} = {used} GPUs, over {what}; {fix}", "deploy")]
