"""The cache counts of ``replay_rules.md`` §3, from the deployment simulation.

The rules serve requests one at a time in input order with the request index as the logical
clock: each request matches its longest cached prefix, inserts the rest and then evicts unpinned
leaves until the tree fits its capacity.  :func:`replay` runs exactly that through the same event
loop and engine as ``job=replay`` (:func:`~.deployment.simulate`): one engine whose passes take no
time, every request arriving alone in input order and asking for one token, its tiered cache with
HiCache off and ``max_total_tokens // page_size`` pages.  With ``page_size == 512`` and
``max_total_tokens == C * 512`` it reproduces the rules' reference hit counts exactly
(tests/workload/test_reference_counts.py).  It measures the cache only: latencies are the
simulation's (``job=replay``).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional

from ..cache.policies import get_policy_info, make_policy
from ..cache.movers import CountingMover
from ..cache.radix import block_page_keys, block_page_weights
from ..cache.tiered import UNBOUNDED_PAGES, TieredCache
from .metrics import hits_by_depth, nearest_rank, tail_stats
from .trace import BLOCK_SIZE, Request

__all__ = ["ReplayResult", "replay", "REPLAY_MODES", "DEFAULT_TAIL_THRESHOLD_TOKENS", "limit_requests"]

REPLAY_MODES = ("device_only",)
DEFAULT_TAIL_THRESHOLD_TOKENS = 4096


@dataclass
class ReplayResult:
    """Outcome of one replay; every field is JSON-serialisable (see :meth:`to_dict`)."""

    mode: str
    policy: str
    policy_config: Optional[Dict[str, Any]]
    page_size: int
    capacity_pages: Optional[int]          # None = unbounded
    radix_cache_disabled: bool
    requests: int
    # pages (= 512-token blocks when page_size is 512)
    lookup_pages: int
    hit_pages: int
    page_hit_rate: float
    # 512-token trace blocks fully covered by hits
    lookup_blocks: int
    hit_blocks: int
    block_hit_rate: float
    input_tokens: int
    hit_tokens: int
    token_hit_rate: float
    evictions: int
    hits_by_depth: Dict[str, int]
    uncached_tokens_mean: float
    uncached_tokens_p50: int
    uncached_tokens_p90: int
    uncached_tokens_p99: int
    tail_threshold_tokens: float
    frac_uncached_gt_threshold: float
    mean_excess_over_threshold: float
    wall_time_s: float
    page_lookups_per_s: float
    per_request_hit_pages: Optional[List[int]] = field(default=None, repr=False)

    def to_dict(self, *, include_per_request: bool = False) -> Dict[str, Any]:
        d = asdict(self)
        if not include_per_request:
            d.pop("per_request_hit_pages")
        return d

    def summary_rows(self) -> List[tuple]:
        """(label, formatted value) pairs for a short table."""
        cap = "unbounded" if self.capacity_pages is None else f"{self.capacity_pages:,} pages"
        return [
            ("policy", self.policy),
            ("capacity", cap),
            ("requests", f"{self.requests:,}"),
            ("block hit rate", f"{100 * self.block_hit_rate:.2f} %"),
            ("token hit rate", f"{100 * self.token_hit_rate:.2f} %"),
            ("evictions (pages)", f"{self.evictions:,}"),
            ("uncached tokens P50/P90/P99",
             f"{self.uncached_tokens_p50:,} / {self.uncached_tokens_p90:,} / "
             f"{self.uncached_tokens_p99:,}"),
            (f"share uncached > {self.tail_threshold_tokens:g}",
             f"{100 * self.frac_uncached_gt_threshold:.2f} %"),
            ("wall time", f"{self.wall_time_s:.3f} s"),
        ]


def limit_requests(requests, max_requests: Optional[int]) -> List[Request]:
    """The first ``max_requests`` requests (all when None) of a Trace or any iterable, as a list."""
    reqs = list(getattr(requests, "requests", requests))
    if max_requests is not None:
        if max_requests < 0:
            raise ValueError(f"max_requests must be >= 0, got {max_requests}")
        reqs = reqs[:max_requests]
    return reqs


def _progress(iterable, total, enabled):
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, unit="req", mininterval=0.25, desc="replay")


class _InstantPasses:
    """A pass model whose every pass takes no time: the rules count cache decisions, not time."""

    @staticmethod
    def attn_pairs(cached: int, new: int) -> int:
        return 0

    def step_s(self, *args, **kwargs) -> float:
        return 0.0


def replay(record, requests: Iterable[Request], *, mode: str = "device_only",
           max_requests: Optional[int] = None,
           tail_threshold_tokens: float = DEFAULT_TAIL_THRESHOLD_TOKENS,
           progress: bool = False, policy: Optional[str] = None,
           policy_config: Optional[Dict[str, Any]] = None,
           keep_per_request: bool = False, block_size: int = BLOCK_SIZE,
           cache_semantics: str = "rules") -> ReplayResult:
    """The rules' cache counts for ``requests`` under ``record`` (see the module doc).

    ``record`` supplies ``page_size``, ``max_total_tokens`` (capacity =
    ``max_total_tokens // page_size`` pages; ``None`` = unbounded), ``disable_radix_cache``,
    ``radix_eviction_policy`` and ``radix_eviction_policy_config``.  ``policy`` /
    ``policy_config`` override the last two; they are how replay-only policies
    (``belady``) and non-choice ones (``fifo``) are selected.  ``cache_semantics`` is
    ``"rules"`` (``replay_rules.md``) or ``"sglang"`` (SGLang's scheduler and radix cache, the
    path of ``job=replay job.cache_semantics=sglang``: the pool is the capacity, each request
    asks for one token; docs/whatif.md, "Follows the engine").  ``requests`` may be a
    :class:`~sglang_hydra.workload.trace.Trace` or any iterable of requests.
    """
    import dataclasses

    from .deployment import DeploymentModel, ServerGroup, simulate
    from .engine import EngineSpec

    if mode not in REPLAY_MODES:
        raise ValueError(f"unknown replay mode {mode!r}; supported: {', '.join(REPLAY_MODES)}")
    reqs = limit_requests(requests, max_requests)
    page_size = int(record.page_size or 1)
    max_tokens = record.max_total_tokens
    capacity = None if max_tokens is None else int(max_tokens) // page_size
    disabled = bool(getattr(record, "disable_radix_cache", False))
    if policy is None:
        name = record.radix_eviction_policy
        cfg = record.radix_eviction_policy_config if policy_config is None else policy_config
    else:
        name, cfg = policy, policy_config
    get_policy_info(name)  # unknown names fail here, before any work
    make_policy(name, cfg, page_size=page_size)    # and bad configs

    t0 = time.perf_counter()
    n_req = len(reqs)
    weighted = page_size < block_size and block_size % page_size == 0
    hits = [0] * n_req
    evictions = 0
    if n_req:
        def make_cache():
            return TieredCache(CountingMover(UNBOUNDED_PAGES if capacity is None else capacity),
                               policy=make_policy(name, cfg, page_size=page_size), page_size=page_size,
                               hierarchical=False, semantics=cache_semantics)

        longest = max(r.input_length for r in reqs) + 2
        # the rules' tree alone holds the capacity; under sglang semantics the engine's pool is
        # the capacity, shared with the request being served (docs/whatif.md, "Follows the engine")
        pool = longest if cache_semantics == "rules" or capacity is None else max(longest, capacity * page_size)
        spec = EngineSpec(_InstantPasses(), pool_tokens=pool, max_running=1, chunk_tokens=None,
                          max_prefill_tokens=pool)
        group = ServerGroup("agg", spec, make_cache=None if disabled else make_cache, page_size=page_size)
        model = DeploymentModel("agg", {"agg": group}, router_policy="round_robin", block_size=block_size)
        # alone and in order: request i arrives at i ms and asks for one token
        alone = [dataclasses.replace(r, timestamp=float(i), output_length=1) for i, r in enumerate(reqs)]
        sim = simulate(model, alone, arrival="as_is", progress=progress)
        engine = sim.engines["agg"][0]
        if engine.cache is not None:
            evictions = engine.cache.evictions
        for i, s in enumerate(sim.requests):
            hits[i] = -(-s.device_hit // page_size)
    keys = [r.hash_ids for r in reqs] if weighted else \
        [block_page_keys(r.hash_ids, r.input_length, page_size, block_size) for r in reqs]
    weights = [block_page_weights(r.hash_ids, r.input_length, page_size, block_size) for r in reqs] \
        if weighted else None

    # ----------------------------------------------------------------- metrics
    lookup_pages = 0
    hit_pages = 0
    input_tokens = 0
    hit_tokens = 0
    lookup_blocks = 0
    hit_blocks = 0
    uncached = [0] * n_req
    for i in range(n_req):
        r = reqs[i]
        k = hits[i]
        length = r.input_length
        ht = k * page_size
        if ht > length:
            ht = length
        lookup_pages += sum(weights[i]) if weighted else len(keys[i])
        hit_pages += k
        input_tokens += length
        hit_tokens += ht
        lookup_blocks += len(r.hash_ids)
        hb = ht // block_size
        if ht == length and length % block_size:
            hb += 1
        hit_blocks += hb
        uncached[i] = length - ht
    wall = time.perf_counter() - t0

    srt = sorted(uncached)
    tails = tail_stats(uncached, tail_threshold_tokens)
    p50, p90, p99 = (nearest_rank(srt, q) for q in (0.5, 0.9, 0.99))
    mean_unc = (sum(uncached) / n_req) if n_req else 0.0
    return ReplayResult(
        mode=mode,
        policy=name,
        policy_config=dict(cfg) if cfg else None,
        page_size=page_size,
        capacity_pages=capacity,
        radix_cache_disabled=disabled,
        requests=n_req,
        lookup_pages=lookup_pages,
        hit_pages=hit_pages,
        page_hit_rate=hit_pages / lookup_pages if lookup_pages else 0.0,
        lookup_blocks=lookup_blocks,
        hit_blocks=hit_blocks,
        block_hit_rate=hit_blocks / lookup_blocks if lookup_blocks else 0.0,
        input_tokens=input_tokens,
        hit_tokens=hit_tokens,
        token_hit_rate=hit_tokens / input_tokens if input_tokens else 0.0,
        evictions=evictions,
        hits_by_depth=hits_by_depth(hits),
        uncached_tokens_mean=mean_unc,
        uncached_tokens_p50=p50,
        uncached_tokens_p90=p90,
        uncached_tokens_p99=p99,
        tail_threshold_tokens=tail_threshold_tokens,
        frac_uncached_gt_threshold=tails["frac_gt"],
        mean_excess_over_threshold=tails["mean_excess"],
        wall_time_s=wall,
        page_lookups_per_s=lookup_pages / wall if wall > 0 else 0.0,
        per_request_hit_pages=hits if keep_per_request else None,
    )
