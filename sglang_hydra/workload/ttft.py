"""A what-if model of time to first token (TTFT) for a prefill engine replaying a trace.

The cache replays decide, per request, how many prompt tokens are already on the device,
in host memory or in storage.  :class:`PrefillTimeline` turns those hits into time:

* **one prefill engine per rank, first come first served**: a request starts when it has
  arrived and the engine has finished every earlier request (``start_time``);
* **compute of the uncached tokens**, split into chunks of ``chunk_tokens`` (SGLang's
  ``chunked_prefill_size``).  Each chunk is one forward pass costing
  ``2 * num_parameters`` FLOPs per new token plus causal attention over the prefix already
  in the KV cache and the chunk itself, ``4 * layers * heads * head_dim`` FLOPs per
  (query, key) pair, at ``bf16_tflops * prefill_efficiency * tp`` FLOP/s, and never
  faster than reading the rank's weights and the prefix's KV once from HBM.  Causal
  attention does the same number of (query, key) pairs however a prompt is chunked; what
  chunking costs is that every pass re-reads the weights and the growing prefix, which
  matters for small chunks and short prompts;
* **loads that compute does not hide**: host hits (and storage hits, once in host memory)
  travel host->device layer by layer while earlier layers compute, so only the first
  layer's copy plus whatever a layer's copy takes beyond a layer's compute of the first
  chunk is exposed; storage hits that the caller did not prefetch are read at
  ``storage_read_gbps`` before compute starts, and ``storage_wait_s`` is added as given.

Pure Python, no torch: a sweep point replays 12k requests in well under a second.
Every simplification is listed by :func:`assumptions` (and written to replay.json) with
what would make it wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

from .metrics import nearest_rank

__all__ = ["HardwareSpec", "ModelShape", "PrefillTimeline", "assumptions",
           "GB"]

GB = 1e9          # the hardware presets give bandwidths in GB/s (10^9 bytes per second)
TERA = 1e12


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


@dataclass(frozen=True)
class HardwareSpec:
    """The few numbers of one accelerator (and its host) the model needs."""

    name: str
    bf16_tflops: float            # dense BF16 peak, TFLOP/s
    hbm_bandwidth_gbps: float     # device memory, GB/s
    h2d_gbps: float               # host -> device copy, GB/s per GPU
    # share of the peak a prefill pass reaches (0-1]: only for the single-factor cost of a bare
    # ModelShape; a timeline given a PassModel (what job=replay builds) times passes with it
    prefill_efficiency: float = 0.5
    storage_read_gbps: Optional[float] = None   # storage -> host, GB/s per node (needed for storage hits)
    gpu_memory_gb: float = 80.0

    @classmethod
    def from_any(cls, hw: Any) -> "HardwareSpec":
        """From a hardware preset (dataclass, namespace or dict with the preset's field names)."""
        if isinstance(hw, HardwareSpec):
            return hw
        problems = []
        vals = {}
        for f in ("bf16_tflops", "prefill_efficiency", "hbm_bandwidth_gbps", "h2d_gbps"):
            v = _get(hw, f)
            if f == "prefill_efficiency" and v is None:
                continue
            if v is None or float(v) <= 0:
                problems.append(f"hardware.{f} must be a positive number, got {v!r}")
            else:
                vals[f] = float(v)
        if "prefill_efficiency" in vals and vals["prefill_efficiency"] > 1:
            problems.append(f"hardware.prefill_efficiency must be in (0, 1], got {vals['prefill_efficiency']}")
        storage = _get(hw, "storage_read_gbps")
        if storage is not None and float(storage) <= 0:
            problems.append(f"hardware.storage_read_gbps must be a positive number, got {storage!r}")
        if problems:
            raise ValueError("; ".join(problems))
        return cls(name=str(_get(hw, "name", "custom")), gpu_memory_gb=float(_get(hw, "gpu_memory_gb", 80.0) or 80.0),
                   storage_read_gbps=float(storage) if storage is not None else None, **vals)


@dataclass(frozen=True)
class ModelShape:
    """What prefill costs depend on, for one tensor-parallel rank's view of the model."""

    num_parameters: float         # whole model (all ranks)
    num_hidden_layers: int
    num_attention_heads: int      # query heads of the whole model
    head_dim: int
    kv_bytes_per_token: int       # KV bytes of one token on one rank, all layers
    tp_size: int = 1
    weight_bytes_per_param: float = 2.0   # bf16 weights (fp8 checkpoints: 1)

    @property
    def weight_bytes_per_rank(self) -> float:
        return self.num_parameters * self.weight_bytes_per_param / self.tp_size

    @classmethod
    def from_record(cls, record: Any) -> "ModelShape":
        """From a resolved record (``model.*`` fields plus the rank-local KV geometry)."""
        from ..memory.geometry import kv_geometry

        problems = []
        params = _get(record, "num_parameters")
        if not params or float(params) <= 0:
            problems.append("model.num_parameters is not set; choose a model preset that has it "
                            "(e.g. model=llama3_8b) or set model.num_parameters")
        heads = _get(record, "num_attention_heads")
        if not heads or int(heads) <= 0:
            problems.append("model.num_attention_heads is not set; choose a model preset that has it "
                            "or set model.num_attention_heads")
        if problems:
            raise ValueError("; ".join(problems))
        geo = kv_geometry(record)
        from ..memory.weights import WEIGHT_ITEMSIZE, weight_dtype
        wdtype = weight_dtype(record)[0]
        head_dim = int(_get(record, "head_dim") or geo.head_dim)
        return cls(num_parameters=float(params), num_hidden_layers=int(_get(record, "num_hidden_layers")),
                   num_attention_heads=int(heads), head_dim=head_dim,
                   kv_bytes_per_token=int(geo.bytes_per_token), tp_size=max(1, int(_get(record, "tp_size", 1) or 1)),
                   weight_bytes_per_param=WEIGHT_ITEMSIZE.get(str(wdtype).lower(), 2.0))


def assumptions(chunk_tokens: Optional[int]) -> List[str]:
    """Every simplification of the model, each with what would make it wrong."""
    chunk = f"{chunk_tokens} tokens" if chunk_tokens else "disabled (one pass per request)"
    return [
        "One prefill engine per rank serves requests first come first served at their trace timestamps; "
        "wrong when the scheduler reorders (priorities, longest-prefix-first) or several prefill engines "
        "(data parallel) share the trace.",
        f"Each chunk ({chunk}) is its own forward pass holding one request; SGLang packs several requests "
        "into one prefill batch, so the model is wrong (pessimistic) for bursts of short requests, which queue "
        "less in SGLang.",
        "Decode does not slow prefill (prefill-only engine as in PD disaggregation, or no mixed batches); "
        "wrong for a colocated server under decode load, where TTFT is higher.",
        "Each chunk's time is the pass-time model's (sglang_hydra.perf.PassModel: GEMMs by the model's shapes, "
        "causal attention, TP all-reduces, element-wise kernels, each at a per-class efficiency of the hardware "
        "preset, fitted to aiconfigurator's measured SGLang kernels); its own assumptions are listed in "
        "docs/whatif.md (wrong for sliding-window attention, expert parallelism, overlapped communication).",
        "Each rank loads its share of host hits over its own host link; wrong when ranks share a PCIe switch.",
        "Host hits are copied host->device layer by layer while earlier layers compute (only the first layer's "
        "copy and the excess of a layer's copy over a layer's compute of the first chunk are exposed); wrong "
        "when the io backend copies the whole prefix before compute, or pages are not pinned.",
        "Storage hits the caller did not prefetch are read at storage_read_gbps (shared by the ranks of a node) "
        "before compute starts, then copied like host hits; storage_wait_s is added as given. This is wrong when the "
        "storage backend is latency-bound (small pages) rather than bandwidth-bound.",
        "At least one prompt token is computed even when the whole prompt is cached (the last token yields "
        "the logits); tokenisation, network and sampling time are not part of TTFT, which is wrong when "
        "clients measure TTFT end to end over a slow network.",
        "Bandwidths and FLOP/s are sustained rates from the hardware preset; wrong by the preset's own error "
        "when it holds datasheet guesses (job=calibrate measures them on the target GPU).",
    ]


class PrefillTimeline:
    """Per-request TTFT for one prefill engine; fed request by request in trace order.

    ``start_time(arrival)`` says when the engine could start a request arriving then;
    ``serve(...)`` advances the engine past that request and returns its TTFT in seconds.
    """

    def __init__(self, hardware: Any, model: ModelShape, *, chunk_tokens: Optional[int], pass_model: Any = None):
        self.hw = HardwareSpec.from_any(hardware)
        self.model = model
        # sglang_hydra.perf.PassModel: when given, it times every pass (per-op-class model)
        self.pass_model = pass_model
        if chunk_tokens is not None and chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be positive or None, got {chunk_tokens}")
        self.chunk_tokens = chunk_tokens
        tp = max(1, model.tp_size)
        self._flops_per_s = self.hw.bf16_tflops * TERA * self.hw.prefill_efficiency * tp
        self._linear_flops_per_token = 2.0 * model.num_parameters
        self._attn_flops_per_pair = 4.0 * model.num_hidden_layers * model.num_attention_heads * model.head_dim
        # memory floor of a pass: read the weights once, read the prefix's KV and write the new KV
        self._weights_read_s = model.weight_bytes_per_rank / (self.hw.hbm_bandwidth_gbps * GB)
        self._kv_hbm_s_per_token = model.kv_bytes_per_token / (self.hw.hbm_bandwidth_gbps * GB)
        self._h2d_s_per_token = model.kv_bytes_per_token / (self.hw.h2d_gbps * GB)
        self._storage_s_per_token = (model.kv_bytes_per_token * tp / (self.hw.storage_read_gbps * GB)
                                     if self.hw.storage_read_gbps else None)
        self._layers = max(1, model.num_hidden_layers)
        self.engine_free_s = 0.0
        # per-request records and running totals
        self.ttft_s: List[float] = []
        self.queue_s: List[float] = []
        self.first_arrival_s: Optional[float] = None
        self.last_arrival_s = 0.0
        self.last_end_s = 0.0
        self.busy_s = 0.0
        self.compute_s = 0.0
        self.exposed_host_load_s = 0.0
        self.exposed_storage_s = 0.0
        self.computed_tokens = 0
        self.input_tokens = 0

    # ------------------------------------------------------------------ cost pieces
    def pass_seconds(self, new_tokens: int, prefix_tokens: int) -> float:
        """One forward pass over ``new_tokens`` after ``prefix_tokens`` already in the KV cache."""
        n = new_tokens
        if self.pass_model is not None:
            return self.pass_model.step_s(n, n * prefix_tokens + n * (n + 1) // 2, 0, 0, 1)
        pairs = n * prefix_tokens + n * (n + 1) / 2.0
        flops = self._linear_flops_per_token * n + self._attn_flops_per_pair * pairs
        t = flops / self._flops_per_s
        floor = self._weights_read_s + (prefix_tokens + n) * self._kv_hbm_s_per_token
        return t if t > floor else floor

    def compute_seconds(self, new_tokens: int, cached_tokens: int) -> List[float]:
        """Seconds of every chunk (pass) that computes ``new_tokens`` after ``cached_tokens``."""
        c = self.chunk_tokens or new_tokens
        out = []
        done = 0
        while done < new_tokens:
            n = min(c, new_tokens - done)
            out.append(self.pass_seconds(n, cached_tokens + done))
            done += n
        return out

    def exposed_host_load_seconds(self, load_tokens: int, first_pass_s: float) -> float:
        """Copy time not hidden by the first pass's compute when copies go layer by layer."""
        if load_tokens <= 0:
            return 0.0
        per_layer_load = load_tokens * self._h2d_s_per_token / self._layers
        per_layer_compute = first_pass_s / self._layers
        excess = per_layer_load - per_layer_compute
        return per_layer_load + (self._layers - 1) * (excess if excess > 0 else 0.0)

    # ------------------------------------------------------------------ the protocol
    def start_time(self, arrival_s: float) -> float:
        """When the engine can start a request that arrives at ``arrival_s``."""
        return arrival_s if arrival_s > self.engine_free_s else self.engine_free_s

    def serve(self, arrival_s: float, input_tokens: int, device_hit_tokens: int, host_hit_tokens: int,
              storage_hit_tokens: int, storage_wait_s: float = 0.0) -> float:
        """Run one request on the engine; returns its TTFT in seconds."""
        if min(input_tokens, device_hit_tokens, host_hit_tokens, storage_hit_tokens) < 0 or storage_wait_s < 0:
            raise ValueError("token counts and storage_wait_s must be >= 0")
        cached = device_hit_tokens + host_hit_tokens + storage_hit_tokens
        if cached > input_tokens:
            raise ValueError(f"hits ({cached} tokens) exceed the prompt ({input_tokens} tokens)")
        new = input_tokens - cached
        if new < 1:          # the last token is always computed (it produces the logits)
            new, cached = 1, input_tokens - 1
        if storage_hit_tokens and self._storage_s_per_token is None:
            raise ValueError(f"hardware {self.hw.name!r} has no storage_read_gbps, needed to time storage hits")
        start = self.start_time(arrival_s)
        passes = self.compute_seconds(new, cached)
        compute = sum(passes)
        storage = (storage_hit_tokens * self._storage_s_per_token if storage_hit_tokens else 0.0) + storage_wait_s
        host = self.exposed_host_load_seconds(host_hit_tokens + storage_hit_tokens, passes[0])
        end = start + storage + host + compute
        self.engine_free_s = end
        if self.first_arrival_s is None or arrival_s < self.first_arrival_s:
            self.first_arrival_s = arrival_s
        if arrival_s > self.last_arrival_s:
            self.last_arrival_s = arrival_s
        if end > self.last_end_s:
            self.last_end_s = end
        ttft = end - arrival_s
        self.ttft_s.append(ttft)
        self.queue_s.append(start - arrival_s)
        self.busy_s += end - start
        self.compute_s += compute
        self.exposed_host_load_s += host
        self.exposed_storage_s += storage
        self.computed_tokens += new
        self.input_tokens += input_tokens
        return ttft

    # ------------------------------------------------------------------ results
    def summary(self) -> Dict[str, Any]:
        """TTFT percentiles (nearest rank, ms), throughput and engine load, JSON-ready."""
        n = len(self.ttft_s)
        srt = sorted(self.ttft_s)
        qs = sorted(self.queue_s)
        span = (self.last_end_s - self.first_arrival_s) if n else 0.0
        arrivals = (self.last_arrival_s - self.first_arrival_s) if n else 0.0
        ms = 1000.0
        return {
            "ttft_p50_ms": nearest_rank(srt, 0.5) * ms,
            "ttft_p90_ms": nearest_rank(srt, 0.9) * ms,
            "ttft_p99_ms": nearest_rank(srt, 0.99) * ms,
            "ttft_mean_ms": (sum(srt) / n * ms) if n else 0.0,
            "ttft_max_ms": (srt[-1] * ms) if n else 0.0,
            "queue_wait_p90_ms": nearest_rank(qs, 0.9) * ms,
            "queue_wait_mean_ms": (sum(qs) / n * ms) if n else 0.0,
            "prefill_throughput": (self.computed_tokens / span) if span > 0 else 0.0,
            "engine_busy_share": (self.busy_s / span) if span > 0 else 0.0,
            "compute_share": (self.compute_s / span) if span > 0 else 0.0,
            # engine time the requests need over the time they arrive in: above 1 the queue grows
            # without bound and TTFT is backlog
            "offered_load": (self.busy_s / arrivals) if arrivals > 0 else 0.0,
            "exposed_host_load_s": self.exposed_host_load_s,
            "exposed_storage_s": self.exposed_storage_s,
            "computed_tokens": self.computed_tokens,
            "chunk_tokens": self.chunk_tokens,
            "hardware": self.hw.name,
        }

    def assumptions(self) -> List[str]:
        return assumptions(self.chunk_tokens)
