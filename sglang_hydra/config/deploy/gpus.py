"""The GPU layout: how many GPUs a server takes and which ids, and placing decode after prefill's
GPUs when both sides share a node.  It reuses the port layout's host matching, nothing more."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..errors import Problem, problem_for
from ..record import ServerArgs
from .model import SIDES, _SOURCE, _Side
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


def _lay_out_gpus(workers: List[Tuple[str, str, ServerArgs, int]], sides: Dict[str, _Side], problems: List[Problem],
                  node_gpus: Optional[int] = None) -> Dict[str, Dict[str, int]]:
    """Give every server on a node its own GPUs: ``{server name: {"base_gpu_id": id}}`` for those placed.

    ``workers`` is (name, role, record, index among its role) in start order.  The first server
    keeps its ``base_gpu_id`` (a top-level value is prefill's, like ``serving.port``); each later
    one starts right after the last GPU of the servers before it on the same host, unless its
    role's value was written on its side (for the first server of that role), in which case it is
    kept and must not share a GPU with another server.  Servers on different hosts are left alone.
    With ``node_gpus`` (the hardware's ``gpus_per_node``) a server placed past the node's last GPU
    is an error: the layout covers one node."""
    import logging

    written_device = {role: "device" in s.side_names or "device" in s.shared_names for role, s in sides.items()}
    placed: List[Tuple[str, str, ServerArgs, List[int], int]] = []    # ..., its GPU ids, its base_gpu_id
    out: Dict[str, Dict[str, int]] = {}
    detected = False
    for name, role, rec, index in workers:
        if not _on_gpus(rec, written_device[role]):
            continue
        detected = detected or (str(rec.device).lower() == "cpu" and not written_device[role])
        neighbours = [p for p in placed if _hosts_overlap(p[2].host, rec.host)]
        side_written = role in SIDES and "base_gpu_id" in sides[role].side_names
        written = index == 0 and (side_written or (role != "decode" and "base_gpu_id" in sides[role].shared_names))
        step = max(1, rec.gpu_id_step)
        if neighbours and not written:      # right after the last GPU of the servers before it on this host
            base = max(b + gpus_per_node(o) * max(1, o.gpu_id_step) for _n, _r, o, _ids, b in neighbours)
            out[name] = {"base_gpu_id": base}
            ids = [base + i * step for i in range(gpus_per_node(rec))]
        else:
            base, ids = rec.base_gpu_id, gpu_ids(rec)
            for n, r, _other, other_ids, _b in neighbours:
                shared = sorted(set(ids) & set(other_ids))
                if shared:
                    key = problem_for("base_gpu_id", "")
                    mine = f"{role}.{key.key}" if role in SIDES else key.key
                    problems.append(Problem(
                        mine, key.flag,
                        f"{name} GPUs {ids} overlap {_label(r if r in SIDES else None, 'base_gpu_id')} GPUs "
                        f"{other_ids} of {n} (GPU {', '.join(map(str, shared))}) on host {rec.host}; each server needs "
                        f"its own GPUs (move one of them, leave {mine} unset to have it placed after the others, or "
                        f"run the sides on different hosts with prefill.serving.host / decode.serving.host)", _SOURCE))
                    break
        if node_gpus and ids and max(ids) >= node_gpus:
            problems.append(Problem("hardware.gpus_per_node", None,
                                    f"{name} would use GPU {max(ids)} (GPUs {ids}), past the node's {node_gpus} GPUs "
                                    f"(0-{node_gpus - 1}); the layout covers one node: use fewer or smaller servers, "
                                    f"or start the others on another node yourself", _SOURCE))
        placed.append((name, role, rec, ids, base))
    if detected and len(placed) > 1 and not problems:
        logging.getLogger("sglang_hydra.config").warning(
            "deploy: no GPU was found here (device detected as cpu), so each server is placed after the GPUs of the "
            "ones before it as on a GPU node; set device.device=cpu if they really run on the CPU")
    return out


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
