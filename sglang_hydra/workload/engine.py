"""One SGLang scheduler over one tensor-parallel engine, stepped by the deployment's event loop.

An :class:`Engine` holds what SGLang's scheduler holds: a waiting queue, at most one request
whose prefill is chunked, the running (decoding) batch, the device KV pool's accounting and its
prefix cache (a :class:`~sglang_hydra.cache.tiered.TieredCache`, device only or with host and
storage tiers; the mover decides whether bytes move).  :meth:`Engine.step` runs the next forward
pass the way SGLang's ``get_next_batch_to_run`` chooses it and returns when it ends:

* a **prefill pass** whenever the waiting queue (or a chunked request) can be admitted: the
  chunked request first, then waiting requests in ``schedule_policy`` order (``fcfs``; ``lpm``
  = longest cached prefix first) while the batch holds fewer than ``max_running_requests``,
  the pool holds their prompts plus the running requests' reserved output
  (``new_token_ratio`` x ``min(output, 4096)``, SGLang's estimate) and the pass's token budget
  (``chunked_prefill_size``, ``max_prefill_tokens``) lasts; the request that does not fit the
  budget is chunked.  Decoding requests join the pass only with ``enable_mixed_chunk``
  (otherwise they wait for it, as in SGLang);
* otherwise a **decode pass** of the whole running batch, one token each.  Before it the pool
  must hold one more token per request, else requests are retracted (fewest output tokens
  first, then the longest prompt: SGLang's order) back to the waiting queue, to be prefilled
  again (prompt + generated tokens, minus what the cache still holds).

Decode passes between two outside events (an arrival, a finish that lets a waiting request in)
are run in one call, so the loop stays cheap on long decodes.  Every pass is timed by the pass
model (:meth:`~sglang_hydra.perf.pass_time.PassModel.step_s`: tokens computed, causal attention
pairs of the prefill part, decode sequences and their KV, prefill sequences).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from heapq import heappop, heappush
from typing import Any, Callable, Dict, List, Optional, Tuple

def _heads(queue: deque):
    """The head of ``queue`` again and again (the caller pops what it takes; stops when empty)."""
    while queue:
        yield queue[0]


__all__ = ["SimRequest", "EngineSpec", "Engine", "ROLES", "ITL_BIN_S", "SCHEDULE_POLICIES", "NEW_TOKEN_RATIO",
           "CLIP_MAX_NEW_TOKENS"]

ROLES = ("agg", "prefill", "decode")
#: resolution of the inter-token latency histogram (seconds)
ITL_BIN_S = 1e-5
SCHEDULE_POLICIES = ("fcfs", "lpm")
#: SGLang 0.5.23's initial new-token ratio (SGLANG_INIT_NEW_TOKEN_RATIO); held constant here.  Kept
#: in tenths so that the engine sums reservations exactly, in integers (``Engine._reserved``)
RESERVE_TENTHS = 7
NEW_TOKEN_RATIO = RESERVE_TENTHS / 10
#: SGLang's cap on the output tokens it reserves for one request (SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION)
CLIP_MAX_NEW_TOKENS = 4096
INF = float("inf")


def _output_key(s: "SimRequest") -> int:
    """The key of a request's generated tokens.  A deterministic engine (greedy decoding, one
    request at a time) generates the same tokens after the same prompt, so the key names the
    prompt (its blocks and length); it never equals a prompt block's key (bit 62 set)."""
    import hashlib
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((tuple(s.hash_ids) or tuple(s.keys), s.input_len)).encode())
    return (int.from_bytes(h.digest(), "little") >> 2) | (1 << 62)


class SimRequest:
    """One request's life in the simulation (times in seconds since the trace's start)."""

    __slots__ = ("idx", "arrival_s", "input_len", "output_len", "keys", "weights", "priority",
                 "device_hit", "host_hit", "storage_hit", "storage_wait_s", "new_total", "done_new",
                 "computed_tokens", "decoded", "held", "reserve", "first_token_s", "finish_s",
                 "prefill_start_s", "prefill_end_s", "transfer_s", "join_step", "finish_step", "retractions",
                 "engine", "decode_engine", "state", "itl_first_s", "admitted_once", "hash_ids",
                 # cache_semantics=sglang: the pinned tree node, pages the tree owns of this request,
                 # pages it inserted, KV tokens it holds (SGLang's kv_committed_len), its output's key
                 "node", "tree_pages", "inserted_pages", "kv_tokens", "out_key",
                 # the reservation in tenths of a token, and its entry in the engine's running sum
                 "reserve10", "res_seq", "res_e10")

    def __init__(self, idx: int, arrival_s: float, input_len: int, output_len: int, keys, weights,
                 priority: int = 0):
        self.idx = idx
        self.arrival_s = arrival_s
        self.input_len = input_len
        self.output_len = max(1, output_len)
        self.keys = keys
        self.weights = weights
        self.priority = priority
        self.device_hit = self.host_hit = self.storage_hit = 0
        self.storage_wait_s = 0.0
        self.new_total = 0
        self.done_new = 0
        self.computed_tokens = 0        # prefill tokens computed over all admissions
        self.decoded = 0                # output tokens produced
        self.held = 0                   # KV tokens held on the engine that runs it
        self.reserve = min(self.output_len, CLIP_MAX_NEW_TOKENS) * NEW_TOKEN_RATIO
        self.reserve10 = min(self.output_len, CLIP_MAX_NEW_TOKENS) * RESERVE_TENTHS
        self.res_seq = self.res_e10 = 0
        self.first_token_s: Optional[float] = None
        self.finish_s: Optional[float] = None
        self.prefill_start_s: Optional[float] = None
        self.prefill_end_s: Optional[float] = None
        self.transfer_s = 0.0
        self.join_step = 0
        self.finish_step = 0
        self.retractions = 0
        self.engine = None
        self.decode_engine = None
        self.state = "new"
        self.itl_first_s = 0.0          # gap before the first decoded token (added to the ITL samples)
        self.admitted_once = False
        self.hash_ids = ()
        self.node = None
        self.tree_pages = self.inserted_pages = self.kv_tokens = 0
        self.out_key = None


@dataclass
class EngineSpec:
    """What one engine (one TP group) is: its pass model, pool and scheduler settings."""

    pass_model: Any                       # .step_s(new, pairs, decode_seqs, decode_kv_tokens), .attn_pairs
    pool_tokens: int                      # device KV pool (tokens) for running requests and the cache
    max_running: int
    chunk_tokens: Optional[int]           # None: prefill is not chunked
    max_prefill_tokens: int
    schedule_policy: str = "fcfs"
    mixed_chunk: bool = False
    gpus: int = 1                         # GPUs of this engine (its TP degree)
    layers: int = 1                       # for the layer-by-layer host load overlap
    kv_bytes_per_token_rank: float = 0.0  # one rank's KV bytes per token (host loads)
    kv_bytes_per_token: float = 0.0       # all ranks (storage reads, PD transfers)
    h2d_bytes_per_s: float = 0.0          # per GPU
    storage_bytes_per_s: Optional[float] = None   # this engine's share of the node's storage read rate


class Engine:
    """One TP engine: scheduler state, KV pool accounting and its own prefix cache."""

    def __init__(self, name: str, spec: EngineSpec, cache=None, *, role: str = "agg"):
        if role not in ROLES:
            raise ValueError(f"engine role must be one of {ROLES}, got {role!r}")
        if spec.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule.schedule_policy={spec.schedule_policy!r} is not modelled; "
                             f"allowed: {', '.join(SCHEDULE_POLICIES)}")
        self.name = name
        self.spec = spec
        self.role = role
        self.cache = cache
        self._step_s = spec.pass_model.step_s
        self._pairs = spec.pass_model.attn_pairs
        self.waiting: deque = deque()
        self.chunked: Optional[SimRequest] = None
        self.running: Dict[int, SimRequest] = {}    # decoding, insertion-ordered
        self.joining: List[SimRequest] = []         # decode role: transferred, first step pending
        self.prealloc: deque = deque()              # decode role: waiting for pool room
        self._finish_heap: List[Tuple[int, int, SimRequest]] = []
        self.steps = 0                               # decode steps taken (token index clock)
        self.used = 0                                # KV tokens held by admitted requests
        self.kv_decode = 0                           # context tokens of the decoding requests
        self.busy_until: Optional[float] = None
        self.clock = 0                               # cache admissions so far (the tree's logical clock)
        self.last_decode_end: Optional[float] = None
        # outputs of the last step() call, collected by the loop
        self.finished: List[SimRequest] = []
        self.prefilled: List[SimRequest] = []
        # statistics
        self.busy_s = 0.0
        self.passes = 0
        self.prefill_passes = 0
        self.decode_passes = 0
        self.retracted = 0
        self.itl_hist: Dict[int, int] = {}           # inter-token gap (units of ITL_BIN_S) -> tokens
        self.batch_seq_sum = 0
        self.queue_peak = 0
        self.exposed_load_s = 0.0
        self.retracted_now = False
        self._fresh: List[SimRequest] = []           # joined the decode batch since the last decode step
        # what the running requests still reserve, kept as a sum (see _reserved)
        self._res_heap: List[Tuple[int, int, SimRequest]] = []
        self._res_sum10 = 0
        self._res_cnt = 0
        self._res_seq = 0
        # cache_semantics=sglang: the tree and the requests share one paged pool (docs/whatif.md,
        # "Follows the engine"); ``private`` counts the pages requests hold outside the tree
        self._sg = bool(cache is not None and getattr(cache, "_engine", False) and role == "agg")
        if self._sg:
            self.page = int(cache.page_size)
            self.pool_pages = min(spec.pool_tokens // self.page, int(getattr(cache, "device_pages", 1 << 62)))
            self.private = 0
            self._lru = getattr(cache.policy, "name", "") == "lru"
            self._refresh_calls = 0

    # ------------------------------------------------------------------ load, as routers see it
    @property
    def num_requests(self) -> int:
        return (len(self.waiting) + len(self.running) + len(self.joining) + len(self.prealloc)
                + (1 if self.chunked is not None else 0))

    @property
    def num_tokens(self) -> int:
        """KV tokens in use plus the prompts still queued (SGLang's ``num_total_tokens``)."""
        return self.used + sum(s.input_len for s in self.waiting)

    def has_work(self) -> bool:
        return bool(self.waiting or self.chunked is not None or self.running or self.joining)

    # ------------------------------------------------------------------ queue entry points
    def enqueue(self, s: SimRequest, now: float) -> None:
        """A request reaches this engine's scheduler (aggregated or prefill role)."""
        s.engine = self
        s.state = "waiting"
        self.waiting.append(s)
        if len(self.waiting) > self.queue_peak:
            self.queue_peak = len(self.waiting)
        if self.cache is not None and not self._sg:
            self.cache.arrive(s.idx, s.keys, s.weights, now)

    def fits_decode(self, s: SimRequest) -> bool:
        """Decode role: does the pool hold this request's prompt and reserved output now?"""
        if self.used == 0 and not self.running and not self.joining:
            return s.input_len + 1 <= self.spec.pool_tokens      # alone, only the prompt must fit
        return self.used + self._reserved() + s.input_len + s.reserve <= self.spec.pool_tokens

    def hold_for_transfer(self, s: SimRequest) -> None:
        """Decode role: allocate the request's KV before its transfer starts."""
        s.decode_engine = self
        s.held = s.input_len
        self.used += s.input_len

    def join_transferred(self, s: SimRequest) -> None:
        """Decode role: the KV has landed; the request decodes from the next step."""
        s.state = "joining"
        self.joining.append(s)

    # ------------------------------------------------------------------ helpers
    def _run(self, s: SimRequest) -> None:
        """``s`` joins the running batch (its reservation joins the running sum)."""
        self.running[s.idx] = s
        e10 = s.reserve10 - 10 * (s.decoded - s.join_step)
        if e10 > 10 * self.steps:
            self._res_seq = seq = self._res_seq + 1
            s.res_seq, s.res_e10 = seq, e10
            heappush(self._res_heap, (e10, seq, s))
            self._res_sum10 += e10
            self._res_cnt += 1

    def _unrun(self, s: SimRequest) -> None:
        """``s`` leaves the running batch."""
        del self.running[s.idx]
        if s.res_seq:
            self._res_sum10 -= s.res_e10
            self._res_cnt -= 1
            s.res_seq = 0

    def _reserved(self) -> float:
        """Output tokens the admitted requests may still need: SGLang's ``new_token_ratio`` x
        ``min(output, 4096)`` each, less what a running request has decoded since.  A running
        request's share ``reserve - (decoded + steps - join_step)`` reaches zero at a step known
        when it joins, so the sum is kept (in tenths, exact) with a heap of those steps instead of
        a loop over the batch at every prefill pass."""
        t10 = 10 * self.steps
        heap = self._res_heap
        while heap and heap[0][0] <= t10:
            e10, seq, s = heappop(heap)
            if s.res_seq == seq:
                self._res_sum10 -= e10
                self._res_cnt -= 1
                s.res_seq = 0
        total = (self._res_sum10 - self._res_cnt * t10) / 10
        for s in self.joining:
            total += s.reserve
        if self.chunked is not None:
            total += self.chunked.reserve
        return total

    def _order_waiting(self) -> List[SimRequest]:
        """``lpm``: longest cached prefix first (SGLang matches every waiting request against the
        tree, which touches the matched nodes, and falls back to fcfs above 128 waiting)."""
        if self.cache is not None and 1 < len(self.waiting) <= 128:
            match = self.cache.match_prefix
            self.clock += 1
            clock = self.clock
            return sorted(self.waiting, key=lambda s: -match(s.keys, clock, s.weights).length)
        return list(self.waiting)

    def _admit(self, s: SimRequest, now: float) -> None:
        """Match and insert the prompt in the cache; what is left is computed by prefill."""
        length = s.input_len
        extra = s.decoded          # a retracted request recomputes its generated tokens too
        d = h = a = 0
        if self._sg:
            a = h = d = self._sg_match(s, length + extra)
        elif self.cache is not None:
            adm = self.cache.admit(s.idx, clock=self.clock, priority=s.priority, now_s=now)
            self.clock += 1
            ps = self.cache.page_size
            d = min(adm.device_pages * ps, length)
            h = min((adm.device_pages + adm.host_pages) * ps, length)
            a = min(adm.hit_pages * ps, length)
            s.storage_wait_s += adm.storage_wait_s
        if not s.admitted_once:
            s.device_hit, s.host_hit, s.storage_hit = d, h - d, a - h
            s.admitted_once = True
        new = length + extra - a
        if new < 1:                # the last token is always computed: it yields the logits
            new = 1
        s.new_total = new
        s.done_new = 0
        s.held = length + extra
        self.used += s.held
        s.state = "prefill"
        if s.prefill_start_s is None:
            s.prefill_start_s = now

    # ------------------------------------------------------------------ cache_semantics=sglang
    def _sg_evict_for(self, tokens: int) -> None:
        """SGLang's ``evict_to_free_tokens``: evict whole leaves until ``tokens`` are free."""
        ps = self.page
        free = (self.pool_pages - self.cache.size - self.private) * ps
        if tokens > free:
            self.cache.evict(-(-(tokens - free) // ps))

    def _sg_hold(self, s: SimRequest, tokens: int) -> None:
        """``s`` holds ``tokens`` more KV tokens (its new pages come from the pool)."""
        ps = self.page
        before = -(-s.kv_tokens // ps)
        s.kv_tokens += tokens
        self.private += -(-s.kv_tokens // ps) - before

    def _sg_match(self, s: SimRequest, tokens: int) -> int:
        """``init_next_round_input``: match at most ``tokens - 1`` tokens, page-aligned; pin
        the match.  Returns the cached tokens."""
        k, node = self.cache.engine_match(s.keys, s.weights, (tokens - 1) // self.page)
        s.node = node
        s.tree_pages = k
        s.inserted_pages = 0
        counts = getattr(self.cache, "counts", None)
        if counts is not None:
            counts["device_hit_pages"] += k
            counts["miss_pages"] += -(-tokens // self.page) - k
        s.kv_tokens = k * self.page
        if s.out_key is None:
            s.out_key = _output_key(s)
        return k * self.page

    def _sg_refresh_waiting(self) -> None:
        """The LRU waiting-prefix refresh of ``SchedulePolicy.calc_priority`` (every 32nd call,
        the first 128 waiting requests, last first, each whole prompt page-aligned)."""
        calls = self._refresh_calls
        self._refresh_calls = calls + 1
        if calls % 32:
            return
        ps = self.page
        for w in reversed(list(self.waiting)[:128]):
            self.cache.engine_touch(w.keys, w.weights, (w.input_len + w.decoded) // ps)

    def _sg_alloc_extend(self, batch) -> None:
        """``alloc_for_extend``: evict for the pass's new tokens plus one page per request
        (SGLang's over-estimate when pages hold more than one token), then hold them."""
        need = 0
        for r, n in batch:
            need += n
        if self.page > 1:
            need += len(batch) * self.page
        self._sg_evict_for(need)
        for r, n in batch:
            self._sg_hold(r, n)

    def _sg_alloc_decode(self, passes: int) -> None:
        """``alloc_for_decode`` over ``passes`` decode passes of the running batch: each pass
        evicts until one page per request is free, then a request takes a page when its
        next token starts one.  No stamp happens between the passes, so the victims are
        those of the last pass's shortfall, taken at once."""
        ps = self.page
        n = len(self.running)
        if passes == 1 and ps > 1:
            # check_decode_mem first evicts for the requests whose next token starts a page
            starts = 0
            for s in self.running.values():
                if s.kv_tokens % ps == 0:
                    starts += 1
            if starts:
                self._sg_evict_for(starts * ps)
        before_last = 0
        total = 0
        for s in self.running.values():
            c0 = s.kv_tokens
            before_last += (c0 + passes - 2) // ps - (c0 - 1) // ps
            total += (c0 + passes - 1) // ps - (c0 - 1) // ps
        free = (self.pool_pages - self.cache.size - self.private - before_last) * ps
        need = n * ps
        if need > free:
            self.cache.evict(-(-(need - free) // ps))
        self.private += total
        for s in self.running.values():
            s.kv_tokens += passes

    def _sg_checkpoint(self, s: SimRequest, tokens: int, finished: bool = False) -> None:
        """``RadixCache.checkpoint(req, up_to=tokens)``: the request's first ``tokens`` tokens
        (prompt, then its generated tokens, keyed by the prompt) page-aligned into the tree."""
        ps = self.page
        pages = tokens // ps
        prompt_pages = s.input_len // ps
        keys, weights = s.keys, s.weights
        if pages > prompt_pages:
            from ..cache.radix import cut_units
            keys, weights = cut_units(keys, weights, prompt_pages)
            extra = pages - prompt_pages
            if weights is None:
                keys = list(keys) + [s.out_key + j for j in range(extra)]
            else:
                keys = list(keys) + [s.out_key]
                weights = list(weights) + [extra]
        s.node = self.cache.engine_checkpoint(keys, weights, pages, priority=s.priority,
                                              inserted=s.inserted_pages, locked=s.node,
                                              prompt_pages=prompt_pages if finished else None)
        if pages > s.tree_pages:
            # the tree owns these pages now (or they were duplicates, freed): off the request
            self.private -= pages - s.tree_pages
            s.tree_pages = pages
        if pages > s.inserted_pages:
            s.inserted_pages = pages

    def _sg_free(self, s: SimRequest) -> None:
        """``release_kv_cache``: the request's pages outside the tree go back; unpin."""
        ps = self.page
        self.private -= -(-s.kv_tokens // ps) - s.tree_pages
        s.kv_tokens = s.tree_pages = 0
        if s.node is not None:
            self.cache.engine_release(s.node)
            s.node = None

    def _load_seconds(self, s: SimRequest, compute_s: float) -> float:
        """Host and storage loads of a request's cached prefix not hidden behind compute."""
        spec = self.spec
        t = s.storage_wait_s
        if s.storage_hit and spec.storage_bytes_per_s:
            t += s.storage_hit * spec.kv_bytes_per_token / spec.storage_bytes_per_s
        load = s.host_hit + s.storage_hit
        if load and spec.h2d_bytes_per_s:
            per_layer = load * spec.kv_bytes_per_token_rank / spec.h2d_bytes_per_s / spec.layers
            per_layer_compute = compute_s / spec.layers
            excess = per_layer - per_layer_compute
            t += per_layer + (spec.layers - 1) * (excess if excess > 0 else 0.0)
        return t

    def _retract_for(self, need: int, now: float) -> bool:
        """Free room for ``need`` more tokens by retracting decoding requests; True if any was."""
        pool = self.spec.pool_tokens
        if self.used + need <= pool or len(self.running) <= 1:
            return False
        steps = self.steps
        order = sorted(self.running.values(),
                       key=lambda s: (s.decoded + steps - s.join_step, -s.input_len), reverse=True)
        done = False
        while self.used + need > pool and len(order) > 1:
            s = order.pop()
            self._unrun(s)
            s.decoded += steps - s.join_step
            self.used -= s.held + (steps - s.join_step)
            self.kv_decode -= s.input_len + s.decoded
            need -= 1
            s.state = "waiting"
            s.retractions += 1
            self.retracted += 1
            self.waiting.appendleft(s)
            if self._sg:
                self._sg_free(s)
            elif self.cache is not None:
                self.cache.arrive(s.idx, s.keys, s.weights, now)
            done = True
        return done

    # ------------------------------------------------------------------ one pass (or a run of decodes)
    def step(self, now: float, horizon: float) -> Optional[float]:
        """Run the next pass starting at ``now``; returns when it ends (None: nothing to do).

        Decode passes continue in this call while nothing outside can change the schedule
        (no event before ``horizon``, no waiting request that a finish could let in)."""
        if self.finished:          # the loop has read the last pass's lists by now; empty ones are reused
            self.finished = []
        if self.prefilled:
            self.prefilled = []
        if self.joining:
            steps = self.steps
            for s in self.joining:
                s.join_step = steps
                s.decoded = 0
                s.state = "decode"
                self._run(s)
                self._fresh.append(s)
                self.kv_decode += s.input_len
                s.finish_step = steps + s.output_len
                heappush(self._finish_heap, (s.finish_step, s.idx, s))
            self.joining = []
        if self.role != "decode" and (self.chunked is not None or self.waiting):
            end = self._prefill_pass(now)
            if end is not None:
                return end
        if not self.running:
            self.busy_until = None
            return None
        t = self._decode_pass(now)
        while self.running and t < horizon and not (
                (self.finished or self.retracted_now) and (self.waiting or self.prealloc)):
            t = self._decode_run(t, horizon)
        self.busy_until = t
        return t

    def _prefill_pass(self, now: float) -> Optional[float]:
        spec = self.spec
        chunk = spec.chunk_tokens
        budget = min(chunk, spec.max_prefill_tokens) if chunk else spec.max_prefill_tokens
        batch: List[Tuple[SimRequest, int]] = []
        new_tokens = 0
        pairs = 0
        pairs_of = self._pairs
        s = self.chunked
        if s is not None:
            n = min(s.new_total - s.done_new, budget)
            batch.append((s, n))
            budget -= n
            if s.done_new + n >= s.new_total:
                self.chunked = None
        if self._sg and self.waiting and self._lru:
            self._sg_refresh_waiting()
        if self.chunked is None and self.waiting and budget > 0:
            if self.cache is not None and self.cache.has_storage:
                self.cache.scheduling_pass([w.idx for w in self.waiting], now)
            running = len(self.running) + len(batch)
            reserved = self._reserved()
            pool = spec.pool_tokens
            lpm = spec.schedule_policy == "lpm"
            for w in (self._order_waiting() if lpm else _heads(self.waiting)):
                if running >= spec.max_running:
                    break
                need = w.input_len + w.decoded
                if self.used + reserved + need + w.reserve > pool and (
                        running or self.used + need > pool):    # alone, only the prompt must fit
                    break
                if lpm:
                    self.waiting.remove(w)
                else:
                    self.waiting.popleft()
                self._admit(w, now)
                reserved += w.reserve
                running += 1
                n = min(w.new_total, budget) if chunk else w.new_total
                batch.append((w, n))
                budget -= n
                if n < w.new_total:
                    self.chunked = w
                    break
                if budget <= 0:
                    break
        if not batch:
            return None
        if self._sg:
            self._sg_alloc_extend(batch)
        for r, n in batch:
            cached = r.input_len + r.decoded - r.new_total + r.done_new
            new_tokens += n
            pairs += pairs_of(cached, n)
        mixed = spec.mixed_chunk and self.role == "agg" and self.running
        dseqs = len(self.running) if mixed else 0
        compute = self._step_s(new_tokens + dseqs, pairs, dseqs, self.kv_decode if mixed else 0, len(batch))
        load = 0.0
        for r, n in batch:
            if r.done_new == 0 and r.retractions == 0 and (r.host_hit or r.storage_hit or r.storage_wait_s):
                load += self._load_seconds(r, compute)
        self.exposed_load_s += load
        end = now + load + compute
        self.passes += 1
        self.prefill_passes += 1
        self.busy_s += end - now
        self.batch_seq_sum += len(batch) + dseqs
        if mixed:            # the decoding requests get their token in this pass, before the new ones join
            self._advance_decode(end, end - now, dseqs)
        for r, n in batch:
            r.done_new += n
            r.computed_tokens += n
            if r.done_new < r.new_total:
                if self._sg:       # SGLang's checkpoint after every chunk
                    self._sg_checkpoint(r, r.input_len + r.decoded - r.new_total + r.done_new)
                continue
            r.prefill_end_s = end
            if self.role == "prefill":
                self.used -= r.held
                r.held = 0
                r.state = "transfer"
                self.prefilled.append(r)
                continue
            if r.first_token_s is None:
                r.first_token_s = end
                r.decoded = 1
                r.held += 1
                self.used += 1
            if r.decoded >= r.output_len:
                self._finish(r, end)
                continue
            if self._sg:
                self._sg_checkpoint(r, r.kv_tokens)
            r.join_step = self.steps
            r.state = "decode"
            r.itl_first_s = end
            self._run(r)
            self._fresh.append(r)
            self.kv_decode += r.input_len + r.decoded
            r.finish_step = self.steps + (r.output_len - r.decoded)
            heappush(self._finish_heap, (r.finish_step, r.idx, r))
        self.busy_until = end
        return end

    def _finish(self, s: SimRequest, t: float) -> None:
        if self._sg:             # release_kv_cache(checkpoint=True): prompt and output into the tree
            self._sg_checkpoint(s, s.kv_tokens, finished=True)
            self._sg_free(s)
        s.finish_s = t
        s.state = "done"
        self.used -= s.held
        s.held = 0
        self.finished.append(s)

    def _decode_run(self, now: float, horizon: float) -> float:
        """Several decode passes of an unchanging batch at once (until the next finish, the
        pool's edge or ``horizon``).  Pass times are summed in closed form where the pass model
        is linear in the KV read over the run (checked at its middle), else one pass is taken."""
        n = len(self.running)
        k = self._finish_heap[0][0] - self.steps if self._finish_heap else 1
        room = self.spec.pool_tokens - self.used
        if room // n < k:
            k = room // n
        if self._sg and self.cache._node_hooks:
            k = 1          # the policy reads the clock at every eviction: one pass at a time
        step_s = self._step_s
        kv = self.kv_decode
        while k > 2:
            a = step_s(n, 0, n, kv)
            z = step_s(n, 0, n, kv + (k - 1) * n)
            slope = (z - a) / (k - 1)
            h = k // 2
            mid = step_s(n, 0, n, kv + h * n)
            if abs(mid - (a + slope * h)) <= 1e-9 * mid + 1e-12:
                break
            k = h
        if k <= 2:
            return self._decode_pass(now)
        # passes j = 0..k-1 last a + slope * j; stop at the first pass that ends at or after horizon
        j = k
        if horizon < INF:
            lo, hi = 1, k
            while lo < hi:
                m = (lo + hi) // 2
                if now + a * m + slope * m * (m - 1) / 2 >= horizon:
                    hi = m
                else:
                    lo = m + 1
            j = lo
        if self._sg:
            self._sg_alloc_decode(j)
        total = a * j + slope * j * (j - 1) / 2
        end = now + total
        self.passes += j
        self.decode_passes += j
        self.busy_s += total
        self.batch_seq_sum += n * j
        # ITL: every request waited a + slope * i at pass i (two samples stand for the run)
        if self.last_decode_end is not None:
            self._itl(now - self.last_decode_end + a, n)
        if j > 1:
            half = n * (j - 1) // 2 or 1
            self._itl(a + slope * (j - 1) / 4, half)
            self._itl(a + slope * 3 * (j - 1) / 4, n * (j - 1) - half)
        self.last_decode_end = end
        self.steps += j
        self.kv_decode += n * j
        self.used += n * j
        self._pop_finished(end)
        return end

    def _decode_pass(self, now: float) -> float:
        n = len(self.running)
        if self.used + n > self.spec.pool_tokens and n > 1:     # else _retract_for has nothing to do
            self.retracted_now = self._retract_for(n, now)
            n = len(self.running)
        else:
            self.retracted_now = False
        if self._sg:
            self._sg_alloc_decode(1)
        d = self._step_s(n, 0, n, self.kv_decode)
        end = now + d
        self.passes += 1
        self.decode_passes += 1
        self.busy_s += d
        self.batch_seq_sum += n
        self._advance_decode(end, d, n)
        return end

    def _advance_decode(self, end: float, d: float, n: int) -> None:
        """Every decoding request gets one token at ``end``; finished ones leave."""
        steps = self.steps
        # ITL: requests that also got a token at the previous decode step waited (end - last end);
        # the ones that joined since then waited since their first token
        prev = self.last_decode_end
        fresh = 0
        if self._fresh:
            for s in self._fresh:
                if s.state != "decode" or self.running.get(s.idx) is not s:
                    continue
                fresh += 1
                if self.role == "decode":
                    s.first_token_s = end      # PD: the first decode step yields the first token
                else:
                    self._itl(end - s.itl_first_s, 1)
            self._fresh = []
        cont = n - fresh
        if cont > 0 and prev is not None:       # self._itl(end - prev, cont), inlined (once per pass)
            b = int((end - prev) / ITL_BIN_S + 0.5)
            h = self.itl_hist
            h[b] = h.get(b, 0) + cont
        self.last_decode_end = end
        self.steps = steps = steps + 1
        self.kv_decode += n
        self.used += n
        heap = self._finish_heap
        if heap and heap[0][0] <= steps:
            self._pop_finished(end)

    def _itl(self, gap: float, tokens: int) -> None:
        if tokens > 0:
            b = int(gap / ITL_BIN_S + 0.5)
            h = self.itl_hist
            h[b] = h.get(b, 0) + tokens

    def _pop_finished(self, end: float) -> None:
        steps = self.steps
        heap = self._finish_heap
        while heap and heap[0][0] <= steps:
            fs, _, s = heappop(heap)
            if s.state != "decode" or s.finish_step != fs or self.running.get(s.idx) is not s:
                continue            # retracted (its entry is stale)
            self._unrun(s)
            s.decoded = s.decoded + steps - s.join_step
            self.kv_decode -= s.input_len + s.decoded
            s.held += steps - s.join_step          # _finish frees all of it
            self._finish(s, end)
