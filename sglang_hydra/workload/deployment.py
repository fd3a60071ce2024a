"""The event loop of a whole deployment: routers, servers, DP replicas, engines, KV links.

:func:`simulate` replays a trace through a :class:`DeploymentModel` in simulated time.  Events
are arrivals (in the order of :mod:`.arrivals`), the end of an engine's pass (or run of decode
passes), and the end of a KV transfer (``disagg``).  One set of engine objects does everything:
the cache hits, the queueing, the batches, the decode and the transfers are decided in the same
pass, not in separate post-processing steps.

* ``agg``: each arrival goes to a server by the router policy, then to one of the server's
  ``dp`` replicas by its load-balance method, and joins that engine's waiting queue.
* ``disagg``: the router picks a prefill server and a decode server at arrival; the prefill
  engine computes the prompt; the decode engine admits the request when its pool holds it
  (FIFO otherwise), the KV crosses the prefill engine's link (:mod:`.transfer`), and the request
  decodes from the decode engine's next step (its first token ends that step).

Nothing here reads the wall clock or the machine: the answer depends on the inputs only.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .arrivals import arrival_times
from .engine import Engine, EngineSpec, SimRequest
from .router import DataParallelDispatcher, Router
from .transfer import KVLink, link_for

__all__ = ["ServerGroup", "DeploymentModel", "SimResult", "GiveUp", "simulate", "request_units"]

INF = float("inf")


def request_units(req, page_size: int, block_size: int):
    """(keys, weights or None) the cache needs for one trace request (one weighted unit per
    trace block when pages are smaller than a block, else one unit per page)."""
    from ..cache.radix import block_page_keys, block_page_weights
    if page_size < block_size and block_size % page_size == 0:
        return req.hash_ids, block_page_weights(req.hash_ids, req.input_length, page_size, block_size)
    return block_page_keys(req.hash_ids, req.input_length, page_size, block_size), None


@dataclass
class ServerGroup:
    """``servers`` identical servers of ``dp`` engines each (one side of a deployment)."""

    role: str                                   # agg | prefill | decode
    spec: EngineSpec
    servers: int = 1
    dp: int = 1
    load_balance: str = "round_robin"           # resolved (no "auto")
    make_cache: Optional[Callable[[], Any]] = None   # a fresh cache per engine; None: no prefix cache
    page_size: int = 1

    @property
    def gpus(self) -> int:
        return self.servers * self.dp * self.spec.gpus


@dataclass
class DeploymentModel:
    """What :func:`simulate` runs: one group (``agg``) or a prefill and a decode group (``disagg``)."""

    mode: str                                   # agg | disagg
    groups: Dict[str, ServerGroup]
    router_policy: str = "cache_aware"
    transfer_backend: Optional[str] = None      # disagg only
    nvlink_gbps: float = 0.0
    nic_gbps: float = 0.0
    gpus_per_node: int = 8
    block_size: int = 512
    request_path_s: float = 0.0                 # client <-> scheduler, before the first token (hardware.request_path_us)

    @property
    def gpus(self) -> int:
        return sum(g.gpus for g in self.groups.values())


@dataclass(frozen=True)
class GiveUp:
    """When a run may stop before the trace ends (a search that only needs to know it fails).

    The run stops at an arrival once more than ``late_allowed`` requests have certainly missed
    ``ttft_s`` (their first token came later, or they have waited longer and still have none),
    so the TTFT percentile the caller bounds misses whatever follows, *and* a request has waited
    ``wait_s`` without its first token (the backlog, not a near miss).  A run that could still
    meet the bound is never stopped, so its figures are those of the whole trace."""

    ttft_s: float
    late_allowed: int
    wait_s: float


@dataclass
class SimResult:
    """Per-request outcomes and per-engine statistics of one simulation."""

    model: DeploymentModel
    requests: List[SimRequest]
    engines: Dict[str, List[Engine]]
    unloaded_ttft_s: List[float]
    wall_time_s: float
    events: int
    routers: Dict[str, Router] = field(default_factory=dict)
    links: Dict[Tuple[int, int], KVLink] = field(default_factory=dict)
    stopped_at_s: Optional[float] = None        # set when :class:`GiveUp` ended the run there


def _build_side(group: ServerGroup, rng: random.Random, first_gpu: int):
    servers, engines = [], []
    gpu = first_gpu
    for si in range(group.servers):
        members = []
        for di in range(group.dp):
            cache = group.make_cache() if group.make_cache is not None else None
            e = Engine(f"{group.role}{si}.{di}", group.spec, cache, role=group.role)
            e.first_gpu = gpu
            gpu += group.spec.gpus
            members.append(e)
            engines.append(e)
        servers.append(DataParallelDispatcher(members, group.load_balance, rng))
    return servers, engines, gpu


class RequestsDoNotFit(ValueError):
    """A request longer than the smallest KV pool of the deployment: the deployment cannot serve the
    trace (infeasible, not a bug; ``job=deploy_search`` reports it as a rejected candidate)."""


def simulate(model: DeploymentModel, requests: Sequence, *, arrival: str = "spread", time_scale: float = 1.0,
             seed: int = 0, progress: bool = False, give_up: Optional[GiveUp] = None) -> SimResult:
    """Run ``requests`` (trace :class:`~.trace.Request` objects, already checked against the
    context length) through ``model``; see the module doc.  With ``give_up`` the run may end
    early (``stopped_at_s``), the requests not finished by then left without a finish time."""
    t0 = time.perf_counter()
    if model.mode not in ("agg", "disagg"):
        raise ValueError(f"deployment mode must be agg or disagg, got {model.mode!r}")
    rng = random.Random(seed)
    smallest = min(g.spec.pool_tokens for g in model.groups.values())
    too_long = sum(1 for r in requests if r.input_length + 1 > smallest)
    if too_long:
        raise RequestsDoNotFit(f"{too_long} request(s) can never fit the KV pool of {smallest:,} tokens; "
                         "reject them first (the replay job counts them as rejected_requests)")
    arrivals = arrival_times([r.timestamp for r in requests], how=arrival, time_scale=time_scale, seed=seed)
    if model.mode == "agg":
        front = model.groups["agg"]
        f_servers, f_engines, _ = _build_side(front, rng, 0)
        all_engines = {"agg": f_engines}
        back = None
    else:
        front, back = model.groups["prefill"], model.groups["decode"]
        f_servers, f_engines, nxt = _build_side(front, rng, 0)
        b_servers, b_engines, _ = _build_side(back, random.Random(seed + 3), nxt)
        all_engines = {"prefill": f_engines, "decode": b_engines}
        d_router = Router(back.servers, model.router_policy, random.Random(seed + 2))
    f_router = Router(front.servers, model.router_policy, random.Random(seed + 1))
    ps, bs = front.page_size, model.block_size
    sims: List[SimRequest] = []
    for i, r in enumerate(requests):
        keys, weights = request_units(r, ps, bs) if front.make_cache is not None else ((), None)
        s = SimRequest(i, arrivals[i], r.input_length, r.output_length, keys, weights, getattr(r, "priority", 0))
        s.hash_ids = r.hash_ids
        sims.append(s)
    for e in f_engines:
        if e.cache is not None and getattr(e.cache.policy, "needs_future", False):
            if len(f_engines) > 1:
                raise ValueError(f"{e.cache.policy.name if hasattr(e.cache.policy, 'name') else 'this'} eviction "
                                 "policy needs the future of one engine's requests; it only runs on one engine")
            e.cache.policy.prepare([s.keys for s in sorted(sims, key=lambda s: s.arrival_s)])
    order = sorted(range(len(sims)), key=lambda i: arrivals[i])
    path_s = model.request_path_s
    heap: List[tuple] = []
    seq = 0
    pending: Dict[int, Tuple[list, list]] = {}
    server_of: Dict[int, int] = {}
    dserver_of: Dict[int, int] = {}
    links: Dict[Tuple[int, int], KVLink] = {}
    link_free: Dict[int, float] = {}
    events = 0
    STEP, XFER, START = 0, 1, 2
    kv_bytes = back.spec.kv_bytes_per_token if back is not None else 0.0
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(sims), unit="req", desc="simulate", mininterval=0.25)

    def kick(e: Engine, now: float, horizon: float) -> None:
        nonlocal seq
        end = e.step(now, horizon)
        if end is None:
            e.busy_until = None
            return
        seq += 1
        # what the pass finished is read from the engine when its event comes: nothing steps an
        # engine while its event is pending (busy_until is set), so e.finished is still that pass's
        heappush(heap, (end, seq, STEP, e, None))

    def link(pe: Engine, de: Engine) -> KVLink:
        key = (id(pe), id(de))
        lk = links.get(key)
        if lk is None:
            gpn = max(1, model.gpus_per_node)
            same = pe.first_gpu // gpn == de.first_gpu // gpn and \
                (pe.first_gpu + pe.spec.gpus - 1) // gpn == (de.first_gpu + de.spec.gpus - 1) // gpn
            lk = link_for(model.transfer_backend, same_node=same, lanes=min(pe.spec.gpus, de.spec.gpus),
                          nvlink_gbps=model.nvlink_gbps, nic_gbps=model.nic_gbps)
            links[key] = lk
        return lk

    def start_transfer(s: SimRequest, de: Engine, now: float) -> None:
        nonlocal seq
        pe = s.engine
        de.hold_for_transfer(s)
        begin = max(now, link_free.get(id(pe), 0.0))
        end = begin + link(pe, de).seconds(s.input_len * kv_bytes)
        link_free[id(pe)] = end
        s.transfer_s = end - now
        seq += 1
        heappush(heap, (end, seq, XFER, de, s))

    def admit_prealloc(de: Engine, now: float) -> None:
        while de.prealloc and de.fits_decode(de.prealloc[0]):
            start_transfer(de.prealloc.popleft(), de, now)

    # Routing that reads no engine state (one server or a stateless router policy, and stateless
    # DP dispatch) is decided up front, so each engine knows its own next arrival and runs its
    # decode passes up to it instead of stopping at every arrival of the deployment.
    sequential = arrival == "sequential"
    stateless = not sequential and (f_router.n == 1 or f_router.policy in ("random", "round_robin")) and all(
        len(d.engines) == 1 or d.method in ("round_robin", "follow_bootstrap_room") for d in f_servers)
    routed: Dict[int, Engine] = {}
    own_arrivals: Dict[int, List[float]] = {}
    if stateless:
        for i in order:
            s = sims[i]
            si = f_router.pick(s, s.arrival_s)
            server_of[i] = si
            if back is not None:
                dserver_of[i] = d_router.pick(s, s.arrival_s)
            e = f_servers[si].pick(s)
            routed[i] = e
            own_arrivals.setdefault(id(e), []).append(s.arrival_s + path_s)
        own_next = {k: 0 for k in own_arrivals}

    def next_own(e: Engine) -> float:
        lst = own_arrivals.get(id(e))
        k = own_next.get(id(e), 0) if lst else 0
        return lst[k] if lst and k < len(lst) else INF

    decided = [0, 0]          # requests (by arrival) whose first token is known, from the first; of them late

    def hopeless(now: float) -> bool:
        """Whether ``give_up`` holds at ``now`` (see :class:`GiveUp`).  Requests are counted in
        arrival order; a request whose first token is known stays counted (it never changes)."""
        cutoff, bound = now - give_up.ttft_s, give_up.ttft_s
        k, late = decided
        while k < ai:             # the leading requests that are settled: counted once
            s = sims[order[k]]
            ft = s.first_token_s
            if s.arrival_s > cutoff or ft is None or ft > now:
                break
            late += ft - s.arrival_s > bound
            k += 1
        decided[0], decided[1] = k, late
        oldest = 0.0
        for j in range(k, ai):    # the rest that arrived over the bound ago (the backlog)
            s = sims[order[j]]
            if s.arrival_s > cutoff:
                break
            ft = s.first_token_s
            if ft is None or ft > now:
                late += 1
                oldest = max(oldest, now - s.arrival_s)
            elif ft - s.arrival_s > bound:
                late += 1
        return late > give_up.late_allowed and oldest >= give_up.wait_s

    n = len(order)
    check_every = max(1, n // 64)
    stopped_at = None
    ai = 0
    # a request reaches its engine request_path_s after the client sent it (arrival_s, the
    # moment TTFT and E2E are measured from)
    next_arrival = [arrivals[i] + path_s for i in order] + [INF]    # by arrival order; INF once all have come
    if sequential:            # the next request comes when the one before it has finished
        next_arrival[1:n] = [INF] * (n - 1)
    while True:
        ta = next_arrival[ai]
        th = heap[0][0] if heap else INF
        if ta == INF and th == INF:
            break
        events += 1
        if give_up is not None and (ai % check_every == 0 if ta <= th else events % 256 == 0) \
                and hopeless(min(ta, th)):
            stopped_at = min(ta, th)
            break
        if ta <= th:
            s = sims[order[ai]]
            ai += 1
            now = ta
            if stateless:
                e = routed[s.idx]
                own_next[id(e)] += 1
                horizon = next_own(e)
            else:
                si = f_router.pick(s, now)
                server_of[s.idx] = si
                if back is not None:
                    dserver_of[s.idx] = d_router.pick(s, now)
                e = f_servers[si].pick(s)
                horizon = next_arrival[ai]
            e.enqueue(s, now)
            if e.busy_until is None:
                # start after every arrival of this instant has joined the queue (one batch, as
                # SGLang's scheduler receives what arrived together)
                e.busy_until = now
                seq += 1
                heappush(heap, (now, seq, START, e, None))
            continue
        now, _, kind, e, payload = heappop(heap)
        nxt_arrival = ta                       # no arrival was taken since ta was read
        if kind == STEP:
            e.busy_until = None
            if sequential and e.finished and 0 < ai < n:
                nxt_arrival = next_arrival[ai] = now + path_s
                sims[order[ai]].arrival_s = now
            for s in e.finished:
                if back is None:
                    f_router.done(server_of[s.idx])
                else:
                    d_router.done(dserver_of[s.idx])
                if bar is not None:
                    bar.update(1)
            for s in e.prefilled:             # disagg: the prompt is done; on to a decode engine
                f_router.done(server_of[s.idx])
                de = b_servers[dserver_of[s.idx]].pick(s)
                if not de.prealloc and de.fits_decode(s):
                    start_transfer(s, de, now)
                else:
                    s.decode_engine = de
                    de.prealloc.append(s)
            if e.role == "decode" and e.prealloc:
                admit_prealloc(e, now)
            if e.role == "agg":
                horizon = next_own(e) if stateless else nxt_arrival
            else:
                th = heap[0][0] if heap else INF
                horizon = th if th < nxt_arrival else nxt_arrival
            end = e.step(now, horizon)        # kick(e, now, horizon), inlined: most events are this
            if end is None:
                e.busy_until = None
            else:
                seq += 1
                heappush(heap, (end, seq, STEP, e, None))
        elif kind == START:
            if e.role == "agg":
                kick(e, now, next_own(e) if stateless else nxt_arrival)
            else:
                kick(e, now, min(nxt_arrival, heap[0][0] if heap else INF))
        else:                                  # XFER: the KV has landed on decode engine e
            e.join_transferred(payload)
            if e.busy_until is None:
                kick(e, now, min(nxt_arrival, heap[0][0] if heap else INF))
    if bar is not None:
        bar.close()
    # requests alone on an idle engine of their kind, with the hits they got
    unloaded = [path_s + _unloaded_ttft(s, front.spec, back.spec if back is not None else None,
                                        link(s.engine, s.decode_engine) if back is not None
                                        and s.decode_engine is not None else None, kv_bytes)
                for s in sims]
    routers = {"front": f_router}
    if back is not None:
        routers["decode"] = d_router
    return SimResult(model=model, requests=sims, engines=all_engines, unloaded_ttft_s=unloaded,
                     wall_time_s=time.perf_counter() - t0, events=events, routers=routers, links=links,
                     stopped_at_s=stopped_at)


def _unloaded_ttft(s: SimRequest, spec: EngineSpec, decode: Optional[EngineSpec], lk: Optional[KVLink],
                   kv_bytes: float) -> float:
    """TTFT of ``s`` alone on an idle engine (same cache hits): its prefill chunks, exposed loads,
    and for disagg the bare transfer and one decode step."""
    pm = spec.pass_model
    pairs_of = pm.attn_pairs
    cached = s.device_hit + s.host_hit + s.storage_hit
    new = max(1, s.input_len - cached)
    cached = s.input_len - new
    chunk = spec.chunk_tokens or new
    t = 0.0
    done = 0
    first = None
    while done < new:
        n = min(chunk, new - done)
        d = pm.step_s(n, pairs_of(cached + done, n), 0, 0, 1)
        if first is None:
            first = d
        t += d
        done += n
    if s.host_hit or s.storage_hit or s.storage_wait_s:
        t += Engine._load_seconds(_LoadView(spec), s, first or 0.0)
    if decode is not None:
        if lk is not None:
            t += lk.seconds(s.input_len * kv_bytes)
        t += decode.pass_model.step_s(1, 0, 1, s.input_len)
    return t


class _LoadView:
    """Lets :meth:`Engine._load_seconds` run for a spec without an engine."""

    def __init__(self, spec):
        self.spec = spec
