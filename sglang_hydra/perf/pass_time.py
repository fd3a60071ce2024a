"""Time of one forward pass of one engine (``tp`` GPUs) on the target hardware.

A pass is costed as the kernels SGLang runs for it, per tensor-parallel rank:

* **GEMMs** by the model's real shapes: the q/k/v and o projections (MLA: the compressed
  query and KV projections), the gated MLP (gate/up, down), for mixture-of-experts layers
  the routed experts a token runs through plus the shared experts, and the LM head (one
  row per sequence: logits are computed for a sequence's last token only).  Each GEMM
  takes the longer of its compute, ``2*M*K*N`` FLOPs at ``bf16_tflops * eff`` with
  ``eff = gemm_efficiency * M / (M + gemm_half_tokens + gemm_half_outputs / N) * K / (K + gemm_k_overhead)``
  (few rows, or few output tiles at high TP, leave SMs idle; a short K spends more of each tile
  in its prologue and epilogue), and its memory traffic
  (weights plus activations at ``hbm_bandwidth_gbps * memory_efficiency``), never less
  than ``kernel_floor_us``;
* **attention**: prefill is causal over the cached and new tokens, ``2*(d_qk + d_v)`` FLOPs
  per (query, key) pair and head at ``attention_prefill_efficiency`` of the peak (plus
  ``attention_prefill_extra_pairs`` per token and ``attention_prefill_layer_us`` per layer);
  decode reads the whole KV of every sequence at ``attention_decode_efficiency`` of the HBM
  rate, slower while few sequences x KV heads occupy the GPU (``attention_decode_half_ctas``),
  plus ``attention_decode_seq_us`` per sequence and ``attention_decode_layer_us`` per layer
  (the kernel's launch and the merge of its split-KV partial results).  Batches of fewer than
  ``attention_decode_split_below`` sequences x KV heads are split along the context and
  occupy the GPU like ``attention_decode_split_ctas`` of them;
* **tensor-parallel all-reduce**: two per layer (after attention and after the MLP) of the
  pass's activations, a ring over the link the preset names (``tp_link``: NVLink within a
  node, PCIe for cards without it) at ``allreduce_efficiency x (tp/2)^allreduce_tp_scaling``,
  plus ``allreduce_latency_us`` each; PCIe groups above a pair share ``allreduce_bridge_gbps``.
  Where the preset carries measured all-reduce times for the group size
  (``allreduce_table_us``), those are interpolated by message size instead: a custom
  all-reduce's rate ramps with the message (latency-bound at a few KB, one-shot to two-shot
  around a few MB), which no single latency + bytes/rate line follows;
* **element-wise kernels** (fused residual add + norm twice, the gated activation): memory
  traffic of the activations plus ``elementwise_kernel_us`` each;
* ``pass_overhead_us`` per pass.

Every constant that does not depend on the batch is computed once in ``__init__``; the
terms that depend only on the token count are read from an exact piecewise-linear table
(bisect), so a pass costs about as much as a handful of Python calls (over 200,000 passes
per second, ``scripts/bench_pass_model.py``).  The full table of classes and assumptions is
in ``docs/whatif.md``.  No torch, no Hydra.
"""
from __future__ import annotations

import copy
import dataclasses
from bisect import bisect_right
from types import SimpleNamespace
from typing import Any, Dict, Iterable, List, Optional, Tuple

__all__ = ["PassModel", "PassModelError", "HARDWARE_PERF_FIELDS"]

TERA = 1e12
GB = 1e9
US = 1e-6
ACT_BYTES = 2.0          # activations and the all-reduce payload are bf16
#: element-wise kernels per layer (two fused add+norm, the gated activation) and the bytes each
#: token moves through them per layer, in units of the hidden width (read + write of the
#: residual stream through two norms and two adds, q/k through the rotary embedding)
ELEMENTWISE_KERNELS_PER_LAYER = 3
ELEMENTWISE_HIDDEN_PASSES = 8

#: attention backends whose prefill attends over the whole sequence, cached prefix included
#: (hardware.prefill_attention_span=full_sequence; the engine calibration states it)
FULL_SEQUENCE_PREFILL_BACKENDS = ("torch_native",)

#: model types whose attention normalises q and k per head (RMSNorm on each head, as in Qwen3)
QK_NORM_MODEL_TYPES = ("qwen3", "qwen3_moe")

#: hardware fields the model reads (all from conf/hardware/<name>.yaml)
HARDWARE_PERF_FIELDS = (
    "bf16_tflops", "hbm_bandwidth_gbps", "gemm_efficiency", "gemm_half_tokens", "gemm_half_outputs", "gemm_k_overhead",
    "memory_efficiency",
    "attention_prefill_efficiency", "attention_prefill_extra_pairs", "attention_prefill_layer_us", "attention_decode_efficiency",
    "attention_decode_seq_us", "attention_decode_layer_us", "attention_decode_half_ctas",
    "attention_decode_split_below", "attention_decode_split_ctas", "allreduce_efficiency", "allreduce_latency_us", "allreduce_tp_scaling", "allreduce_bridge_gbps", "allreduce_table_us",
    "kernel_floor_us", "elementwise_kernel_us", "pass_overhead_us", "tp_link", "nvlink_gbps", "h2d_gbps",
)


def allreduce_points(table: Any, tp: int) -> Optional[List[Tuple[float, float]]]:
    """The ``[(message bytes, microseconds), ...]`` rows of ``hardware.allreduce_table_us`` for a
    group of ``tp`` GPUs, sorted by size; None when the table has no such group.  Raises
    :class:`PassModelError` naming the key when the rows are not positive number pairs."""
    if not table:
        return None
    rows = table.get(str(tp), table.get(tp)) if isinstance(table, dict) else None
    if rows is None:
        return None
    key = f"hardware.allreduce_table_us.{tp}"
    try:
        pts = sorted((float(b), float(us)) for b, us in rows)
    except (TypeError, ValueError):
        raise PassModelError(f"{key} must be a list of [message bytes, microseconds] pairs, got {rows!r}") from None
    if len(pts) < 2 or any(b <= 0 or us <= 0 for b, us in pts) or len({b for b, _ in pts}) != len(pts):
        raise PassModelError(f"{key} needs at least two [message bytes, microseconds] pairs with distinct "
                             f"positive sizes and positive times, got {rows!r}")
    return pts


class PassModelError(ValueError):
    """The record or hardware lacks (or has a bad) field the pass model needs; the message
    names the key, e.g. ``model.intermediate_size is not set ...``.  ``problems`` holds each
    problem on its own (every one starts with the key it names)."""

    def __init__(self, problems):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _hardware_defaults() -> Dict[str, Any]:
    from ..config.hardware import Hardware
    return {f.name: f.default for f in dataclasses.fields(Hardware)}


@dataclasses.dataclass(frozen=True)
class _Gemm:
    """One weight matrix (per rank) that every token of a pass goes through, ``count`` times."""

    name: str
    k: int
    n: int
    count: int           # layers holding it
    cls: str             # op class in breakdown()


class PassModel:
    """Time of one forward pass of one engine (tp GPUs) on the target hardware."""

    def __init__(self, *, tp: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                 v_head_dim: int, intermediate: int, vocab: int, kv_bytes_per_token: float,
                 weight_bytes_per_gpu: float, weight_itemsize: float, hardware: Dict[str, Any],
                 mla: Optional[Tuple[int, int, int]] = None,
                 moe: Optional[Tuple[int, int, int, int, int]] = None, qk_norm: bool = False,
                 name: str = "model"):
        """Shapes are the whole model's; ``mla`` = (q_lora_rank, kv_lora_rank, qk_rope_head_dim);
        ``moe`` = (experts, experts per token, expert MLP width, shared experts, first dense layers);
        ``qk_norm``: the model normalises q and k per head (Qwen3): two more element-wise kernels a layer."""
        self.name = name
        self.tp = tp
        self.time_scale = 1.0      # see scaled()
        self.weight_bytes_per_gpu = float(weight_bytes_per_gpu)
        self.kv_bytes_per_token = float(kv_bytes_per_token)
        hw = hardware
        self.hardware_name = str(hw.get("name", "custom"))
        peak = float(hw["bf16_tflops"]) * TERA
        bw = float(hw["hbm_bandwidth_gbps"]) * GB
        mem_rate = bw * float(hw["memory_efficiency"])
        gemm_rate = peak * float(hw["gemm_efficiency"])
        self._half = float(hw["gemm_half_tokens"])
        half_out = float(hw.get("gemm_half_outputs") or 0.0)
        k_over = float(hw.get("gemm_k_overhead") or 0.0)
        self._floor = float(hw["kernel_floor_us"]) * US
        self._overhead = float(hw["pass_overhead_us"]) * US
        heads_r = heads // tp
        kv_r = max(1, kv_heads // tp)
        self.layers = layers

        gemms: List[_Gemm] = []
        if mla:
            q_lora, kv_lora, rope = mla
            if q_lora:
                # fused q_a + kv_a projection (replicated on every rank), then q_b
                gemms.append(_Gemm("qkv_a", hidden, q_lora + kv_lora + rope, layers, "gemm"))
                gemms.append(_Gemm("q_b", q_lora, heads_r * head_dim, layers, "gemm"))
            else:
                gemms.append(_Gemm("q", hidden, heads_r * head_dim, layers, "gemm"))
                gemms.append(_Gemm("kv_a", hidden, kv_lora + rope, layers, "gemm"))
            nope = head_dim - rope
            gemms.append(_Gemm("kv_b", kv_lora, heads_r * (nope + v_head_dim), layers, "gemm"))
        else:
            gemms.append(_Gemm("qkv", hidden, heads_r * head_dim + kv_r * (head_dim + v_head_dim), layers, "gemm"))
        gemms.append(_Gemm("o", heads_r * v_head_dim, hidden, layers, "gemm"))
        dense_layers, moe_layers = layers, 0
        self._moe = None
        if moe:
            experts, top_k, expert_width, shared, first_dense = moe
            dense_layers, moe_layers = min(first_dense, layers), layers - min(first_dense, layers)
            if shared:
                w = shared * expert_width // tp
                gemms.append(_Gemm("shared_gate_up", hidden, 2 * w, moe_layers, "moe"))
                gemms.append(_Gemm("shared_down", w, hidden, moe_layers, "moe"))
            gemms.append(_Gemm("router", hidden, experts, moe_layers, "moe"))
            ew = expert_width // tp
            # routed experts: compute by the experts each token runs through, weights by the
            # distinct experts the pass touches
            per_expert = 3 * hidden * ew
            self._moe = (experts, top_k, moe_layers,
                         2.0 * top_k * per_expert / gemm_rate,              # s per token (compute)
                         weight_itemsize * per_expert / mem_rate,           # s per distinct expert
                         ACT_BYTES * top_k * (3 * hidden + 3 * ew) / mem_rate)  # s per token (activations)
        if dense_layers:
            i_r = intermediate // tp
            gemms.append(_Gemm("gate_up", hidden, 2 * i_r, dense_layers, "gemm"))
            gemms.append(_Gemm("down", i_r, hidden, dense_layers, "gemm"))
        self.gemms = tuple(gemms)
        # per GEMM: (count, compute s per (token + half), weight-read s, activation s per token, class,
        # its half tokens)
        self._gemm_consts = tuple(
            (g.count, 2.0 * g.k * g.n * (1.0 + k_over / g.k) / gemm_rate, weight_itemsize * g.k * g.n / mem_rate,
             ACT_BYTES * (g.k + g.n) / mem_rate, g.cls, self._half + half_out / g.n) for g in gemms)
        v_r = vocab // tp
        self._lm = (2.0 * hidden * v_r * (1.0 + k_over / hidden) / gemm_rate, weight_itemsize * hidden * v_r / mem_rate,
                    ACT_BYTES * (hidden + v_r) / mem_rate) if v_r else (0.0, 0.0, 0.0)
        self._lm_half = self._half + (half_out / v_r if v_r else 0.0)

        # attention
        att_peak = peak * float(hw["attention_prefill_efficiency"])
        if mla:
            q_lora, kv_lora, rope = mla
            # prefill runs as multi-head attention over decompressed K/V
            self._attn_pair_s = layers * heads_r * 2.0 * (head_dim + v_head_dim) / att_peak
            # decode runs absorbed: scores over the latent + rope, values from the latent
            self._dec_flop_s = layers * heads_r * 2.0 * (kv_lora + rope + kv_lora) / att_peak
        else:
            self._attn_pair_s = layers * heads_r * 2.0 * (head_dim + v_head_dim) / att_peak
            self._dec_flop_s = layers * heads_r * 2.0 * (head_dim + v_head_dim) / att_peak
        self._attn_extra_pairs = float(hw["attention_prefill_extra_pairs"])
        self._attn_layer_s = layers * float(hw["attention_prefill_layer_us"]) * US
        self._dec_kv_s = self.kv_bytes_per_token / (bw * float(hw["attention_decode_efficiency"]))
        self._dec_seq_s = layers * float(hw["attention_decode_seq_us"]) * US
        self._dec_layer_s = layers * float(hw.get("attention_decode_layer_us") or 0.0) * US
        # few sequences x KV heads leave SMs idle: the KV read runs at eff x n / (n + half)
        dec_kv_r = 1 if mla else kv_r
        self._dec_half_seqs = float(hw["attention_decode_half_ctas"]) / dec_kv_r
        # small batches are split along the context: below split_below / kv_r sequences the
        # occupancy is that of split_ctas / kv_r sequences
        self._dec_split_below = float(hw.get("attention_decode_split_below") or 0.0) / dec_kv_r
        self._dec_split_seqs = float(hw.get("attention_decode_split_ctas") or 0.0) / dec_kv_r
        if self._dec_split_seqs <= 0:        # no split occupancy given: no split
            self._dec_split_below = 0.0
        self._attn_floor = layers * self._floor

        # all-reduce: a ring moves 2 (tp-1)/tp of the payload per GPU
        self._has_ar = tp > 1
        if tp > 1:
            link = hw["nvlink_gbps"] if hw["tp_link"] == "nvlink" else hw["h2d_gbps"]
            # NVSwitch all-reduces get faster per GPU with the group (multicast): (tp/2)^scaling
            rate = float(link) * GB * float(hw["allreduce_efficiency"]) * (tp / 2.0) ** float(hw["allreduce_tp_scaling"])
            bridge = hw.get("allreduce_bridge_gbps")
            if hw["tp_link"] == "pcie" and tp > 2 and bridge:
                # beyond a pair, every GPU's share of the ring crosses one shared host bridge
                self._ar_per_token = 2 * layers * 2.0 * (tp - 1) * ACT_BYTES * hidden / (float(bridge) * GB)
            else:
                self._ar_per_token = 2 * layers * (2.0 * (tp - 1) / tp) * ACT_BYTES * hidden / rate
            self._ar_fixed = 2 * layers * float(hw["allreduce_latency_us"]) * US
        else:
            self._ar_per_token = self._ar_fixed = 0.0
        # a measured table for this group size replaces the ring: (tokens, s per pass) knots
        self._ar_knots: Optional[Tuple[Tuple[float, float], ...]] = None
        table = allreduce_points(hw.get("allreduce_table_us"), tp) if tp > 1 else None
        if table:
            per_token = ACT_BYTES * hidden
            self._ar_knots = tuple((b / per_token, 2 * layers * us * US) for b, us in table)

        # element-wise kernels
        i_act = (intermediate // tp) if not moe else (moe[1] * moe[2] // tp)
        qk = (heads_r + kv_r) * head_dim * 2 if qk_norm else 0      # q/k per-head norms read and write
        self._elem_per_token = layers * ACT_BYTES * (ELEMENTWISE_HIDDEN_PASSES * hidden + 3 * i_act + qk) / mem_rate
        kernels = ELEMENTWISE_KERNELS_PER_LAYER + (2 if qk_norm else 0)
        self._elem_fixed = layers * kernels * float(hw["elementwise_kernel_us"]) * US
        self._moe_memo: Dict[int, float] = {}
        # decode-only passes by batch size: (the token and LM-head terms, the KV-read occupancy
        # factor, the per-sequence term), each the same float step_s computes (see _decode_terms)
        self._decode_memo: Dict[int, Tuple[float, float, float]] = {}
        self._build_piecewise()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_record(cls, record: Any, hardware: Any) -> "PassModel":
        """From a resolved record (or any object/dict with its field names) and a hardware
        preset (:class:`~sglang_hydra.config.hardware.Hardware` or a dict of its fields).

        Raises :class:`PassModelError` naming every missing or bad key at once."""
        rec = SimpleNamespace(**record) if isinstance(record, dict) else record
        problems: List[str] = []
        hw = _hardware_defaults()
        for f in hw:
            v = _get(hardware, f, None)
            if v is not None:
                hw[f] = v
        name = hw.get("name") or "custom"
        for f in ("bf16_tflops", "hbm_bandwidth_gbps"):
            v = hw.get(f)
            if v is None or not isinstance(v, (int, float)) or float(v) <= 0:
                problems.append(f"hardware.{f} is not set for hardware '{name}' (got {v!r}); choose a preset "
                                "that has it (e.g. hardware=h100_80gb) or measure it with job=calibrate")

        def need(key: str, minimum: int = 1) -> int:
            v = _get(rec, key)
            try:
                iv = int(v)
            except (TypeError, ValueError):
                iv = None
            if iv is None or iv < minimum:
                problems.append(f"model.{key} is not set (got {v!r}); the pass-time model needs it: choose a "
                                f"model preset that has it (e.g. model=llama3_1_8b) or set model.{key}")
                return minimum
            return iv

        hidden = need("hidden_size")
        layers = need("num_hidden_layers")
        heads = need("num_attention_heads")
        kv_heads = need("num_key_value_heads")
        head_dim = need("head_dim")
        vocab = need("vocab_size")
        v_head_dim = int(_get(rec, "v_head_dim") or head_dim)
        tp = int(_get(rec, "tp_size", 1) or 1)
        pp = int(_get(rec, "pp_size", 1) or 1)
        if tp < 1:
            problems.append(f"parallel.tp_size must be >= 1, got {tp}")
            tp = 1
        elif heads % tp:
            problems.append(f"parallel.tp_size={tp} does not divide model.num_attention_heads={heads}; "
                            "choose a tensor-parallel degree that divides the query heads")
        if pp > 1:
            problems.append(f"parallel.pp_size={pp}: pipeline parallelism is not modelled by the pass-time model; "
                            "use parallel.pp_size=1")
        experts = int(_get(rec, "num_experts", 0) or 0)
        moe = None
        if experts:
            top_k = need("num_experts_per_tok")
            width = need("moe_intermediate_size")
            first_dense = int(_get(rec, "first_dense_layers", 0) or 0)
            shared = int(_get(rec, "num_shared_experts", 0) or 0)
            if first_dense:
                need("intermediate_size")
            intermediate = int(_get(rec, "intermediate_size") or 0)
            moe = (experts, top_k, width, shared, first_dense)
        else:
            intermediate = need("intermediate_size")
        arch = str(_get(rec, "attention_arch", "mha") or "mha").lower()
        mla = None
        if arch == "mla":
            kv_lora = need("kv_lora_rank")
            rope = need("qk_rope_head_dim")
            mla = (int(_get(rec, "q_lora_rank", 0) or 0), kv_lora, rope)
            if not problems and rope >= head_dim:
                problems.append(f"model.head_dim={head_dim} must exceed model.qk_rope_head_dim={rope} for MLA "
                                "(head_dim is the query/key width: nope + rope)")
        for f in ("gemm_efficiency", "memory_efficiency", "attention_prefill_efficiency",
                  "attention_decode_efficiency", "allreduce_efficiency"):
            v = hw.get(f)
            if not isinstance(v, (int, float)) or not 0 < float(v) <= 1:
                problems.append(f"hardware.{f} must be in (0, 1], got {v!r}")
        if tp > 1 and not problems:
            link = hw.get("tp_link")
            field = {"nvlink": "nvlink_gbps", "pcie": "h2d_gbps"}.get(link)
            if field is None:
                problems.append(f"hardware.tp_link must be nvlink or pcie, got {link!r}")
            elif not hw.get(field):
                problems.append(f"hardware.{field} is not set for hardware '{name}', needed for the all-reduce "
                                f"of parallel.tp_size={tp} over tp_link={link}")
        if problems:
            raise PassModelError(problems)
        from ..memory.geometry import kv_geometry
        from ..memory.weights import WEIGHT_ITEMSIZE, weight_dtype, weights_per_rank
        try:
            geo = kv_geometry(rec)
            wdtype = weight_dtype(rec)[0]
        except Exception as exc:   # a bad geometry or dtype field: the memory layer names it
            raise PassModelError(str(exc)) from None
        itemsize = WEIGHT_ITEMSIZE.get(str(wdtype).lower(), 2.0)
        per_rank = weights_per_rank(rec).bytes
        if per_rank is None:
            raise PassModelError("model.num_parameters is not set; the weight bytes per GPU need it: choose a "
                                 "model preset that has it (e.g. model=llama3_1_8b) or set model.num_parameters")
        model = cls(tp=tp, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                    v_head_dim=v_head_dim, intermediate=intermediate, vocab=vocab,
                    kv_bytes_per_token=geo.bytes_per_token, weight_bytes_per_gpu=per_rank,
                    weight_itemsize=itemsize, hardware=hw, mla=mla, moe=moe,
                    qk_norm=str(_get(rec, "model_type", "")) in QK_NORM_MODEL_TYPES,
                    name=str(_get(rec, "model_path", "model")))
        span = hw.get("prefill_attention_span") or "new"
        if span not in ("new", "full_sequence"):
            raise PassModelError(f"hardware.prefill_attention_span must be new or full_sequence, got {span!r}")
        if span == "full_sequence":
            model.attn_pairs = PassModel.full_sequence_pairs
        return model

    # ------------------------------------------------------------------ the model
    @staticmethod
    def attn_pairs(cached: int, new: int) -> int:
        """Causal (query, key) pairs of ``new`` tokens after ``cached`` ones."""
        return new * cached + new * (new + 1) // 2

    @staticmethod
    def full_sequence_pairs(cached: int, new: int) -> int:
        """The pairs a backend computes when it runs causal attention over the whole sequence,
        cached prefix included (its queries padded to the full length): SGLang's ``torch_native``
        backend (``_run_sdpa_forward_extend``) does, so a cached prefix saves it no attention.
        Measured on the CPU engine: 256 new tokens over 2,048 cached take 63 ms where 2,048
        fresh ones take 77 ms (docs/validate.md)."""
        n = cached + new
        return n * (n + 1) // 2

    def step_s(self, new_tokens: int, prefill_attn_pairs: int, decode_seqs: int, decode_kv_tokens: int,
               prefill_seqs: Optional[int] = None) -> float:
        """Seconds of ONE forward pass.

        ``new_tokens``: tokens computed (prefill tokens + one per decode sequence);
        ``prefill_attn_pairs``: sum of :meth:`attn_pairs` over the prefill sequences;
        ``decode_seqs`` / ``decode_kv_tokens``: decode sequences and the sum of their contexts;
        ``prefill_seqs``: prefill sequences (rows of the LM head); unset: one if the pass
        computes any prefill token."""
        m = new_tokens
        if m == decode_seqs and not prefill_attn_pairs and not prefill_seqs and m > 0:
            # a decode-only pass (most passes of a simulation): the terms that depend on the batch
            # size alone are looked up; the sums run in step_s's order, so the result is the same float
            terms = self._decode_memo.get(m)
            if terms is None:
                terms = self._decode_terms(m)
            t, occ_factor, per_seq = terms
            x = decode_kv_tokens * self._dec_kv_s * occ_factor + per_seq + self._dec_layer_s
            y = decode_kv_tokens * self._dec_flop_s
            if y > x:
                x = y
            t += x if x > self._attn_floor else self._attn_floor
            return t * self.time_scale      # the general path's return, for this pass
        if m <= 0:
            return 0.0
        if prefill_seqs is None:
            prefill_seqs = 1 if m > decode_seqs else 0
        # every term that depends on the token count alone: one piecewise-linear lookup
        i = bisect_right(self._pw_breaks, m)
        t = self._pw_slope[i] * m + self._pw_icept[i]
        if self._moe is not None:
            moe = self._moe_memo.get(m)
            if moe is None:
                moe = self._moe_memo[m] = self._moe_s(m)
            t += moe
        rows = prefill_seqs + decode_seqs
        c, w, a = self._lm
        x = c * (rows + self._lm_half)
        y = w + a * rows
        t += x if x > y else y
        if prefill_attn_pairs:
            x = (prefill_attn_pairs + self._attn_extra_pairs * (m - decode_seqs)) * self._attn_pair_s
            t += (x if x > self._attn_floor else self._attn_floor) + self._attn_layer_s
        if decode_seqs:
            occ = self._dec_split_seqs if decode_seqs < self._dec_split_below else decode_seqs
            x = decode_kv_tokens * self._dec_kv_s * (1.0 + self._dec_half_seqs / occ) \
                + decode_seqs * self._dec_seq_s + self._dec_layer_s
            y = decode_kv_tokens * self._dec_flop_s
            if y > x:
                x = y
            t += x if x > self._attn_floor else self._attn_floor
        return t * self.time_scale

    def scaled(self, factor: float) -> "PassModel":
        """This model with every pass ``factor`` times as long (a server role's overhead that the
        kernels do not show, e.g. a disaggregated server's KV traffic); ``self`` when 1."""
        if factor == 1.0:
            return self
        other = copy.copy(self)
        other.time_scale = self.time_scale * float(factor)
        return other

    def _decode_terms(self, n: int) -> Tuple[float, float, float]:
        """What a decode-only pass of ``n`` sequences adds before its KV read, computed exactly
        as :meth:`step_s` computes it (same operations, same order), memoised per ``n``."""
        i = bisect_right(self._pw_breaks, n)
        t = self._pw_slope[i] * n + self._pw_icept[i]
        if self._moe is not None:
            moe = self._moe_memo.get(n)
            if moe is None:
                moe = self._moe_memo[n] = self._moe_s(n)
            t += moe
        c, w, a = self._lm
        x = c * (n + self._lm_half)
        y = w + a * n
        t += x if x > y else y
        occ = self._dec_split_seqs if n < self._dec_split_below else n
        terms = (t, 1.0 + self._dec_half_seqs / occ, n * self._dec_seq_s)
        self._decode_memo[n] = terms
        return terms

    def _token_terms(self, m: float) -> float:
        """GEMMs (not the LM head or routed experts), all-reduce, element-wise kernels and
        the pass overhead for ``m`` tokens: what ``step_s`` reads from the piecewise table."""
        floor = self._floor
        t = self._overhead
        for count, c, w, a, _cls, h in self._gemm_consts:
            t += count * max(c * (m + h), w + a * m, floor)
        if self._has_ar:
            t += self._allreduce_s(m)
        return t + m * self._elem_per_token + self._elem_fixed

    def _allreduce_s(self, m: float) -> float:
        """Both all-reduces of every layer for ``m`` tokens: the measured table interpolated
        linearly (flat below its first point, along its last segment past the end), else the ring."""
        knots = self._ar_knots
        if knots is None:
            return self._ar_fixed + m * self._ar_per_token
        if m <= knots[0][0]:
            return knots[0][1]
        for (x0, y0), (x1, y1) in zip(knots, knots[1:]):
            if m <= x1:
                break
        return y0 + (y1 - y0) * (m - x0) / (x1 - x0)

    def _build_piecewise(self) -> None:
        """Each term of :meth:`_token_terms` is a max of lines in ``m``, so their sum is linear
        between the points where any term changes regime: find those, then store each
        interval's slope and intercept (exact, not an approximation)."""
        floor = self._floor
        points = set()
        for _count, c, w, a, _cls, h in self._gemm_consts:
            if c != a:
                points.add((w - c * h) / (c - a))
            if c:
                points.add((floor - c * h) / c)
            if a:
                points.add((floor - w) / a)
        if self._ar_knots:
            points.update(x for x, _ in self._ar_knots)
        breaks = sorted(x for x in points if x > 0)
        edges = [0.0] + breaks + [(breaks[-1] if breaks else 0.0) + 3.0]
        slopes, icepts = [], []
        for lo, hi in zip(edges[:-1], edges[1:]):
            x1, x2 = lo + (hi - lo) / 3.0, lo + 2.0 * (hi - lo) / 3.0
            y1, y2 = self._token_terms(x1), self._token_terms(x2)
            slope = (y2 - y1) / (x2 - x1)
            slopes.append(slope)
            icepts.append(y1 - slope * x1)
        self._pw_breaks = breaks
        self._pw_slope = slopes
        self._pw_icept = icepts

    def _moe_s(self, m: int) -> float:
        experts, top_k, layers, comp_per_token, w_per_expert, act_per_token = self._moe
        distinct = experts * (1.0 - (1.0 - top_k / experts) ** m)
        x = comp_per_token * (m + self._half)
        y = w_per_expert * distinct + act_per_token * m
        x = x if x > y else y
        return layers * (x if x > self._floor else self._floor)

    def prefill_s(self, seqs: Iterable[Tuple[int, int]]) -> float:
        """One pass prefilling every ``(cached_tokens, new_tokens)`` sequence (no chunking)."""
        new = pairs = n = 0
        for cached, fresh in seqs:
            new += fresh
            pairs += fresh * cached + fresh * (fresh + 1) // 2
            n += 1
        return self.step_s(new, pairs, 0, 0, prefill_seqs=n)

    def decode_s(self, context_lens: Iterable[int]) -> float:
        """One decode step for a batch whose sequences hold ``context_lens`` tokens of KV."""
        lens = list(context_lens)
        return self.step_s(len(lens), 0, len(lens), sum(lens))

    def breakdown(self, new_tokens: int, prefill_attn_pairs: int = 0, decode_seqs: int = 0,
                  decode_kv_tokens: int = 0, prefill_seqs: Optional[int] = None) -> Dict[str, float]:
        """Seconds per operation class of the pass :meth:`step_s` times (they sum to it)."""
        out = {"gemm": 0.0, "moe": 0.0, "lm_head": 0.0, "attention_prefill": 0.0, "attention_decode": 0.0,
               "allreduce": 0.0, "elementwise": 0.0, "overhead": 0.0}
        m = new_tokens
        if m <= 0:
            return out
        if prefill_seqs is None:
            prefill_seqs = 1 if m > decode_seqs else 0
        out["overhead"] = self._overhead
        for count, c, w, a, cls, h in self._gemm_consts:
            out[cls] += count * max(c * (m + h), w + a * m, self._floor)
        if self._moe is not None:
            out["moe"] += self._moe_s(m)
        rows = prefill_seqs + decode_seqs
        c, w, a = self._lm
        out["lm_head"] = max(c * (rows + self._lm_half), w + a * rows)
        if prefill_attn_pairs:
            out["attention_prefill"] = max(
                (prefill_attn_pairs + self._attn_extra_pairs * (m - decode_seqs)) * self._attn_pair_s,
                self._attn_floor) + self._attn_layer_s
        if decode_seqs:
            occ = self._dec_split_seqs if decode_seqs < self._dec_split_below else decode_seqs
            out["attention_decode"] = max(decode_kv_tokens * self._dec_kv_s * (1.0 + self._dec_half_seqs / occ)
                                          + decode_seqs * self._dec_seq_s + self._dec_layer_s,
                                          decode_kv_tokens * self._dec_flop_s, self._attn_floor)
        if self._has_ar:
            out["allreduce"] = self._allreduce_s(m)
        out["elementwise"] = m * self._elem_per_token + self._elem_fixed
        if self.time_scale != 1.0:
            out["role_overhead"] = sum(out.values()) * (self.time_scale - 1.0)
        return out

    def __repr__(self) -> str:
        return (f"PassModel({self.name!r} on {self.hardware_name!r}, tp={self.tp}, "
                f"weights/GPU={self.weight_bytes_per_gpu / GB:.2f} GB, KV/token/GPU={self.kv_bytes_per_token:.0f} B)")
