"""The deployment search's evaluator: a request trace through one candidate deployment, step by step.

``evaluate(candidate, requests, sla)`` runs every request of a trace through the engines a
candidate describes (aggregated replicas, or prefill and decode pools with a KV transfer between
them) and returns the latency and throughput figures the search ranks by.  It is an event-driven
simulation at the granularity of SGLang's scheduler passes:

* **Engines** batch continuously the way SGLang's default scheduler does: whenever a new prefill
  batch can be formed (waiting requests whose KV fits the pool, under ``max_running_requests``)
  it runs first, up to ``chunked_prefill_size`` new tokens per pass (a longer prompt is chunked
  over several passes); otherwise one decode step runs for every running request.  The time of
  each pass is the pass-time model's (:class:`sglang_hydra.perf.pass_time.PassModel`) for exactly
  that batch.  Decode steps between two events (an arrival, a finish) are taken together: the
  context grows by one token per step and the steps are costed at the mean context, which is
  exact while the pass time is linear in the context.
* **KV admission**: a request reserves its prompt and its output in the engine's KV pool when it
  is admitted (so nothing is ever retracted); what does not fit waits in the queue.
* **Prefix cache**: every engine that keeps a radix cache holds the trace's prefix blocks in an
  LRU over its device pool and, with HiCache, a second LRU over the host tier
  (``hicache_ratio`` x the device pool).  A device hit costs nothing, a host hit the copy of its
  KV at ``hardware.h2d_gbps`` per GPU, a miss the prefill compute.
* **Routing**: several engines of one kind are chosen by ``router_policy`` as sglang-router does
  (random, round_robin, power_of_two by outstanding requests, cache_aware by the longest prefix
  it routed to a worker before, falling back to the least loaded worker when the match is under
  half the prompt or the load is out of balance).
* **Disaggregation**: a prefill engine computes the prompt, its KV moves to a decode engine at
  ``min(prefill TP, decode TP)`` x ``hardware.nic_gbps`` (one NIC per GPU), the decode engine
  admits it when its pool has room and produces the output; TTFT = queue + prefill + transfer +
  the first decode step.

Everything is deterministic for a given input (the random policies draw from a seeded generator).
No Hydra, no torch.
"""
from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

BLOCK_TOKENS = 512                 # tokens per hash id in Mooncake traces
_CACHE_AWARE_THRESHOLD = 0.5       # sglang-router --cache-threshold default
_BALANCE_ABS = 64                  # sglang-router --balance-abs-threshold default
_BALANCE_REL = 1.5                 # sglang-router --balance-rel-threshold default
_MAX_MACRO_STEPS = 512             # decode steps taken together at most (bounds the error of the mean context)


# --------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class EngineModel:
    """One SGLang server as the evaluator sees it (all figures for the whole engine, TP ranks together)."""

    tp: int
    step_s: Callable[..., float]       # PassModel.step_s(new_tokens, attn_pairs, decode_seqs, decode_kv_tokens, prefill_seqs)
    kv_tokens: int                     # device KV pool
    host_tokens: int                   # HiCache host tier (0: none)
    kv_bytes_per_token_rank: float     # KV bytes of one token on one rank
    h2d_bytes_per_s: float             # host-to-device copy rate of one GPU
    chunk_tokens: int                  # chunked_prefill_size
    max_running: int                   # max_running_requests
    radix: bool = True                 # keeps a prefix cache
    eviction_policy: str = "lru"       # memory.radix_eviction_policy
    mixed_chunk: bool = False          # schedule.enable_mixed_chunk: prefill chunks ride along decode steps


@dataclass(frozen=True)
class Plan:
    """A candidate deployment, ready to evaluate."""

    mode: str                          # agg | disagg
    engines: int                       # agg: replicas; disagg: prefill workers
    engine: EngineModel                # agg: the replica; disagg: a prefill worker
    decode_engines: int = 0
    decode: Optional[EngineModel] = None
    router_policy: str = "round_robin"
    link_bytes_per_s: float = 0.0      # disagg: one GPU's NIC
    transfer_overhead_s: float = 0.0   # disagg: fixed cost per transfer
    seed: int = 0

    @property
    def gpus(self) -> int:
        return self.engines * self.engine.tp + self.decode_engines * (self.decode.tp if self.decode else 0)


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    input_length: int
    output_length: int
    blocks: Tuple[int, ...]


# --------------------------------------------------------------------------- the prefix cache
class _BlockCache:
    """The engine's radix cache over prefix blocks (the project's :class:`RadixTree` with the
    eviction policy named), and with HiCache a host tier that keeps every block written
    through to it (LRU over ``hicache_ratio`` x the device pool, on top of the device's)."""

    def __init__(self, device_tokens: int, host_tokens: int, policy: str):
        from ..cache.policies import make_policy
        from ..cache.radix import RadixTree

        self.device = RadixTree(max(0, device_tokens // BLOCK_TOKENS), make_policy(policy))
        self.host = RadixTree(max(0, (device_tokens + host_tokens) // BLOCK_TOKENS), make_policy("lru")) \
            if host_tokens > 0 else None

    def match(self, blocks: Sequence[int]) -> Tuple[int, int]:
        """(device blocks, host-only blocks) of the longest cached prefix, touching what it finds."""
        d = self.device.match_prefix(blocks).length
        h = self.host.match_prefix(blocks).length if self.host is not None else 0
        return d, max(0, h - d)

    def insert(self, blocks: Sequence[int]) -> None:
        self.device.serve(blocks)
        if self.host is not None:
            self.host.serve(blocks)


# --------------------------------------------------------------------------- requests in flight
class _Req:
    __slots__ = ("i", "arrival", "isl", "osl", "blocks", "t_first", "t_done", "todo", "cached", "host_blocks",
                 "reserve", "finish_k", "joined")

    def __init__(self, i: int, r: TraceRequest):
        self.i = i
        self.arrival = r.arrival_s
        self.isl = max(1, r.input_length)
        self.osl = max(1, r.output_length)
        self.blocks = r.blocks
        self.t_first = self.t_done = -1.0
        self.todo = 0            # prompt tokens still to compute
        self.cached = 0          # prompt tokens found in the cache
        self.host_blocks = 0
        self.reserve = 0
        self.finish_k = 0
        self.joined = False


class _Engine:
    """One server: a waiting queue, the prompt being prefilled, the running decode batch."""

    def __init__(self, idx: int, model: EngineModel, role: str):
        self.idx = idx
        self.m = model
        self.role = role                      # agg | prefill | decode
        self.waiting: deque = deque()
        self.prefilling: List[_Req] = []      # admitted, prompt not done
        self.heap: List[Tuple[int, int, _Req]] = []   # (finish step, id, request) of running decodes
        self.fresh: List[_Req] = []           # decode side: joined, first token not yet out
        self.n = 0                            # running decodes
        self.ctx = 0                          # their summed context
        self.k = 0                            # decode steps done
        self.reserved = 0
        self.outstanding = 0                  # routed and not finished here (the router's load)
        self.cache = _BlockCache(model.kv_tokens, model.host_tokens, model.eviction_policy) if model.radix else None
        self.busy_until: Optional[float] = None
        self.version = 0
        self.cur: Optional[tuple] = None      # the pass running: ("prefill", batch) / ("decode", start, per_step, m)

    # ---- admission and the next pass
    def _admit(self) -> None:
        m = self.m
        while self.waiting and self.n + len(self.prefilling) + len(self.fresh) < m.max_running:
            r = self.waiting[0]
            need = r.isl + (r.osl if self.role != "prefill" else 0)
            if self.reserved + need > m.kv_tokens:
                return
            if self.role != "decode":
                if self.cache is not None:
                    d, h = self.cache.match(r.blocks)
                    r.cached = min(r.isl - 1, (d + h) * BLOCK_TOKENS)
                    r.host_blocks = h if r.cached else 0
                r.todo = r.isl - r.cached
            self.waiting.popleft()
            self.reserved += need
            r.reserve = need
            if self.role == "decode":
                self._join(r)
            else:
                self.prefilling.append(r)

    def _join(self, r: _Req) -> None:
        """Into the decode batch: ``osl - 1`` more steps after the first token (decode side: ``osl``)."""
        steps = r.osl if self.role == "decode" else r.osl - 1
        r.finish_k = self.k + steps
        self.n += 1
        self.ctx += r.isl + (0 if self.role == "decode" else 1)
        heapq.heappush(self.heap, (r.finish_k, r.i, r))
        if self.role == "decode":
            self.fresh.append(r)

    def start(self, now: float) -> Optional[float]:
        """Begin the next pass at ``now``; its end time, or None when there is nothing to do."""
        self._admit()
        m = self.m
        if self.prefilling:                       # a prefill batch runs first, as SGLang's scheduler does
            mixed = m.mixed_chunk and self.role == "agg" and self.n > 0
            # mixed with a decode step, the running requests' tokens come out of the chunk budget
            budget, batch, new, pairs, load = m.chunk_tokens - (self.n if mixed else 0), [], 0, 0, 0.0
            budget = max(budget, 1)
            for r in self.prefilling:
                if budget <= 0:
                    break
                take = min(r.todo, budget)
                done_before = r.isl - r.todo
                pairs += take * done_before + take * (take + 1) // 2
                if r.host_blocks:                 # HiCache: the host hit is copied in before the first chunk
                    load += r.host_blocks * BLOCK_TOKENS * m.kv_bytes_per_token_rank / m.h2d_bytes_per_s
                    r.host_blocks = 0
                batch.append((r, take))
                new += take
                budget -= take
            if mixed:
                t = m.step_s(new + self.n, pairs, self.n, self.ctx, len(batch)) + load
            else:
                t = m.step_s(new, pairs, 0, 0, len(batch)) + load
            self.cur = ("prefill", batch, mixed)
        elif self.n:
            first = self.heap[0][0] - self.k
            steps = max(1, min(first, _MAX_MACRO_STEPS))
            mean_ctx = self.ctx + self.n * (steps - 1) / 2.0
            per = m.step_s(self.n, 0, self.n, int(mean_ctx))
            self.cur = ("decode", now, per, steps)
            t = per * steps
        else:
            self.cur = None
            self.busy_until = None
            return None
        self.busy_until = now + t
        self.version += 1
        return self.busy_until

    def interrupt(self, now: float) -> Optional[float]:
        """Something arrived during a run of decode steps: end the run after the step in progress."""
        if self.cur is None or self.cur[0] != "decode":
            return None
        _, start, per, steps = self.cur
        done = min(steps, int((now - start) / per) + 1) if per > 0 else steps
        if done >= steps:
            return None
        self.cur = ("decode", start, per, done)
        self.busy_until = start + per * done
        self.version += 1
        return self.busy_until

    def finish(self, now: float) -> List[_Req]:
        """End the pass at ``now``; the requests that left this engine (done, or prefilled for transfer)."""
        out: List[_Req] = []
        cur, self.cur = self.cur, None
        if cur is None:
            return out
        if cur[0] == "prefill":
            if cur[2]:                            # mixed: the running requests took one decode step too
                out += self._step_done(now, 1)
            for r, take in cur[1]:
                r.todo -= take
                if r.todo > 0:
                    continue
                self.prefilling.remove(r)
                if self.cache is not None:
                    self.cache.insert(r.blocks)
                if self.role == "prefill":
                    self.reserved -= r.reserve
                    self.outstanding -= 1
                    out.append(r)
                    continue
                r.t_first = now
                if r.osl <= 1:
                    r.t_done = now
                    self.reserved -= r.reserve
                    self.outstanding -= 1
                    out.append(r)
                else:
                    self._join(r)
            return out
        _, start, per, steps = cur
        if self.fresh:                            # decode side: their first token came with the first step
            for r in self.fresh:
                r.t_first = start + per
            self.fresh = []
        return out + self._step_done(now, steps)

    def _step_done(self, now: float, steps: int) -> List[_Req]:
        """``steps`` decode steps of the running batch ended at ``now``: the requests they finished."""
        out: List[_Req] = []
        self.k += steps
        self.ctx += self.n * steps
        while self.heap and self.heap[0][0] <= self.k:
            _, _, r = heapq.heappop(self.heap)
            r.t_done = now
            self.n -= 1
            self.ctx -= r.isl + r.osl             # its prompt and every token it decoded here
            self.reserved -= r.reserve
            self.outstanding -= 1
            out.append(r)
        if not self.n:
            self.ctx = 0
        return out


# --------------------------------------------------------------------------- routing
class _Router:
    """sglang-router's choice among the workers of one kind."""

    def __init__(self, engines: List[_Engine], policy: str, rng: random.Random):
        self.engines = engines
        self.policy = policy
        self.rng = rng
        self.next = 0
        self.seen: List[Dict[int, None]] = [dict() for _ in engines]   # prefixes routed to each worker

    def pick(self, r: _Req) -> _Engine:
        es = self.engines
        if len(es) == 1:
            return es[0]
        p = self.policy
        if p == "round_robin":
            e = es[self.next % len(es)]
            self.next += 1
            return e
        if p == "random":
            return es[self.rng.randrange(len(es))]
        if p == "power_of_two":
            a, b = self.rng.sample(range(len(es)), 2)
            return es[a] if es[a].outstanding <= es[b].outstanding else es[b]
        # cache_aware
        loads = [e.outstanding for e in es]
        least = min(range(len(es)), key=lambda i: (loads[i], i))
        hi, lo = max(loads), min(loads)
        if hi - lo > _BALANCE_ABS and hi > lo * _BALANCE_REL:
            choice = least
        else:
            best, best_match = least, -1
            for i, seen in enumerate(self.seen):
                match = 0
                for blk in r.blocks:
                    if blk not in seen:
                        break
                    match += 1
                if match > best_match:
                    best, best_match = i, match
            choice = best if r.blocks and best_match / len(r.blocks) >= _CACHE_AWARE_THRESHOLD else least
        seen = self.seen[choice]
        for blk in r.blocks:
            seen[blk] = None
        return es[choice]


# --------------------------------------------------------------------------- the run
class Saturated(Exception):
    """The run was given up: a request waited longer than the limit for its engine."""


def simulate(plan: Plan, requests: Sequence[TraceRequest], give_up_wait_s: float = math.inf) -> List[_Req]:
    """Every request through the deployment; returns them with ``t_first`` / ``t_done`` set
    (-1 for a request no engine of its kind can ever hold: it is rejected).

    With ``give_up_wait_s`` the run stops (raising :class:`Saturated` with the requests in its
    ``args[0]``) as soon as a request has waited that long in an engine's queue: the deployment
    cannot keep up, and simulating the rest of a growing backlog would only cost time."""
    rng = random.Random(plan.seed)
    front_role = "agg" if plan.mode == "agg" else "prefill"
    front = [_Engine(i, plan.engine, front_role) for i in range(plan.engines)]
    back = ([_Engine(plan.engines + i, plan.decode, "decode") for i in range(plan.decode_engines)]
            if plan.mode == "disagg" else [])
    router = _Router(front, plan.router_policy, rng)
    back_router = _Router(back, plan.router_policy if plan.router_policy != "cache_aware" else "power_of_two", rng) \
        if back else None
    reqs = [_Req(i, r) for i, r in enumerate(requests)]
    events: List[Tuple[float, int, int, Any]] = []    # (time, order, kind, payload); kind 0: pass end, 1: KV landed
    order = 0

    def schedule(e: _Engine, end: Optional[float]) -> None:
        nonlocal order
        if end is not None:
            order += 1
            heapq.heappush(events, (end, order, 0, (e, e.version)))

    def deliver(e: _Engine, now: float) -> None:
        if e.busy_until is None:
            schedule(e, e.start(now))
        else:
            schedule(e, e.interrupt(now))

    front_need = plan.engine.kv_tokens
    back_need = plan.decode.kv_tokens if plan.decode else 0
    pending = sorted(reqs, key=lambda r: (r.arrival, r.i))
    ai = 0
    while ai < len(pending) or events:
        t_arr = pending[ai].arrival if ai < len(pending) else math.inf
        if events and events[0][0] < t_arr:
            now, _, kind, payload = heapq.heappop(events)
            if kind == 1:
                e, r = payload
                e.waiting.append(r)
                if now - e.waiting[0].arrival > give_up_wait_s:
                    raise Saturated(reqs)
                deliver(e, now)
                continue
            e, version = payload
            if version != e.version:
                continue
            for r in e.finish(now):
                if e.role == "prefill":
                    d = back_router.pick(r)
                    d.outstanding += 1
                    lanes = min(plan.engine.tp, plan.decode.tp)
                    x = plan.transfer_overhead_s + r.isl * plan.engine.kv_bytes_per_token_rank * plan.engine.tp / (
                        lanes * plan.link_bytes_per_s)
                    order += 1
                    heapq.heappush(events, (now + x, order, 1, (d, r)))
            schedule(e, e.start(now))
            continue
        r = pending[ai]
        ai += 1
        if r.isl + r.osl > (front_need if plan.mode == "agg" else back_need) or r.isl > front_need:
            continue                                   # no engine can ever hold it: rejected
        e = router.pick(r)
        e.outstanding += 1
        e.waiting.append(r)
        if r.arrival - e.waiting[0].arrival > give_up_wait_s:
            raise Saturated(reqs)
        deliver(e, r.arrival)
    return reqs


# --------------------------------------------------------------------------- figures
def _pct(values: List[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (0 for none)."""
    if not values:
        return 0.0
    k = max(0, min(len(values) - 1, math.ceil(q / 100.0 * len(values)) - 1))
    return values[k]


@dataclass(frozen=True)
class Sla:
    """Bounds on TTFT and TPOT, held by the ``percentile``-th request (nearest rank)."""

    ttft_ms: float
    tpot_ms: float
    percentile: int = 90


def evaluate(plan: Plan, requests: Sequence[TraceRequest], sla: Sla) -> Dict[str, Any]:
    """The figures of one deployment on one trace (keys with units, as the replay's metrics).

    A run in which some request waits over ten times the TTFT bound in a queue is stopped there
    (status ``saturated``; the figures are those of the requests that finished, goodput counts
    the rest as missed)."""
    gave_up = False
    try:
        done = simulate(plan, requests, give_up_wait_s=10.0 * sla.ttft_ms / 1e3)
    except Saturated as stop:
        done, gave_up = stop.args[0], True
    fits = [r for r in done if r.isl + r.osl <= _pool(plan)]
    ok = [r for r in done if r.t_done >= 0]
    rejected = len(done) - len(fits)
    ttft = sorted((r.t_first - r.arrival) * 1e3 for r in ok)
    tpots = sorted((r.t_done - r.t_first) * 1e3 / (r.osl - 1) for r in ok if r.osl > 1)
    e2e = sorted((r.t_done - r.arrival) * 1e3 for r in ok)
    first = min((r.arrival for r in done), default=0.0)
    last_arrival = max((r.arrival for r in done), default=0.0)
    end = max(max((r.t_done for r in ok), default=first), last_arrival)
    span = max(end - first, 1e-9)
    out_tokens = sum(r.osl for r in ok)
    good = sum(1 for r in ok if (r.t_first - r.arrival) * 1e3 <= sla.ttft_ms
               and (r.osl <= 1 or (r.t_done - r.t_first) * 1e3 / (r.osl - 1) <= sla.tpot_ms))
    gpus = plan.gpus
    mean_tpot = sum(tpots) / len(tpots) if tpots else 0.0
    # saturated: queueing keeps growing, i.e. the last quarter of the arrivals waits far longer for
    # its first token than the first quarter did
    by_arrival = sorted(ok, key=lambda r: r.arrival)
    quarter = max(1, len(by_arrival) // 4)
    early = sorted(r.t_first - r.arrival for r in by_arrival[:quarter])
    late = sorted(r.t_first - r.arrival for r in by_arrival[-quarter:])
    saturated = gave_up or (len(by_arrival) >= 8 and _pct(late, 50) > 2 * _pct(early, 50) + 5.0)
    return {
        "status": "rejected" if rejected and not fits else ("saturated" if saturated else "ok"),
        "requests": len(done), "rejected_requests": rejected,
        "ttft_p50_ms": _pct(ttft, 50), "ttft_p90_ms": _pct(ttft, 90), "ttft_p99_ms": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpots, 50), "tpot_p90_ms": _pct(tpots, 90), "tpot_p99_ms": _pct(tpots, 99),
        "e2e_p90_ms": _pct(e2e, 90),
        "tokens_per_s_per_gpu": out_tokens / span / gpus,
        "tokens_per_s_per_user": 1000.0 / mean_tpot if mean_tpot > 0 else 0.0,
        "goodput_rps_per_gpu": good / span / gpus,
        "goodput_share": good / len(done) if done else 0.0,
        "gpus": gpus,
    }


def _pool(plan: Plan) -> int:
    """KV tokens of the pool that holds a whole request (the replica, or a decode worker)."""
    return plan.engine.kv_tokens if plan.mode == "agg" else plan.decode.kv_tokens


def meets(metrics: Dict[str, Any], sla: Sla) -> bool:
    """The SLA holds: TTFT and TPOT at the SLA's percentile within it, nothing rejected, not saturated."""
    p = sla.percentile
    return (metrics["status"] == "ok" and not metrics["rejected_requests"]
            and metrics[f"ttft_p{p}_ms"] <= sla.ttft_ms and metrics[f"tpot_p{p}_ms"] <= sla.tpot_ms)


def shortfall(metrics: Dict[str, Any], sla: Sla) -> float:
    """How far a deployment is from the SLA: the larger of its two ratios to the bounds (<= 1: met)."""
    p = sla.percentile
    worst = max(metrics[f"ttft_p{p}_ms"] / sla.ttft_ms, metrics[f"tpot_p{p}_ms"] / sla.tpot_ms)
    return worst if metrics["status"] == "ok" else max(worst, 10.0)
