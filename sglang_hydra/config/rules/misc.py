"""Rules of the ``model``, ``device``, ``schedule`` and ``exec`` namespaces that decide
whether caching can run at all (geometry from a checkpoint, device detection, page size,
and every writer of ``disable_radix_cache``)."""
from __future__ import annotations

import functools
import json
from pathlib import Path

from ..rulebook import Resolving, rule

# Geometry keys of an HF config.json and the model fields they fill.
_HF_KEYS = {
    "num_hidden_layers": "num_hidden_layers",
    "num_key_value_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "v_head_dim": "v_head_dim",
    "kv_lora_rank": "kv_lora_rank",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "max_position_embeddings": "max_position_embeddings",
    "model_type": "model_type",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_attention_heads",
    # shapes the pass-time model costs (sglang_hydra.perf)
    "intermediate_size": "intermediate_size",
    "vocab_size": "vocab_size",
    "n_routed_experts": "num_experts",
    "num_experts": "num_experts",
    "num_experts_per_tok": "num_experts_per_tok",
    "moe_intermediate_size": "moe_intermediate_size",
    "n_shared_experts": "num_shared_experts",
    "first_k_dense_replace": "first_dense_layers",
    "q_lora_rank": "q_lora_rank",
}
_RADIX_SAFE_DETERMINISTIC = ("ascend", "fa3", "fa4", "triton")
_RADIX_OFF_ARCHS = {
    "WhisperForConditionalGeneration": "Whisper is an encoder-decoder model",
    "EmbeddingGemma2Model": "EmbeddingGemma2 runs without prefix reuse",
    "EmbeddingGemmaModel": "EmbeddingGemma runs without prefix reuse",
}


@rule(0, "model-geometry")
def geometry_from_checkpoint(cfg: Resolving) -> None:
    """A local checkpoint's config.json overrides preset geometry the user did not set."""
    if not str(cfg.model_path or "").strip():
        cfg.error("model_path", "is empty; give a Hugging Face id, a checkpoint directory or a preset name")
        return
    path = Path(str(cfg.model_path))
    cj = path / "config.json"
    if not path.is_dir():
        return
    if not cj.is_file():
        cfg.error("model_path", f"{str(path)!r} is a directory without config.json; point it at a checkpoint or use a preset name")
        return
    try:
        hf = json.loads(cj.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        cfg.error("model_path", f"cannot read {cj}: {exc}")
        return
    if not isinstance(hf, dict):
        cfg.error("model_path", f"{cj} does not hold a JSON object")
        return
    text = hf.get("text_config") if isinstance(hf.get("text_config"), dict) else hf
    found = {}
    for hk, field in _HF_KEYS.items():
        if text.get(hk) is not None:
            found[field] = text[hk]
    if "num_key_value_heads" not in found and text.get("num_attention_heads"):
        found["num_key_value_heads"] = text["num_attention_heads"]
    if "head_dim" not in found and text.get("hidden_size") and text.get("num_attention_heads"):
        found["head_dim"] = text["hidden_size"] // text["num_attention_heads"]
    from ..model_size import estimate_num_parameters
    # None where config.json cannot say: the tiny defaults must not pass for this model's size
    found["num_parameters"] = estimate_num_parameters(text)
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        found.setdefault(key, None)
    archs = hf.get("architectures") or []
    if archs:
        found["architecture"] = archs[0]
    if found.get("kv_lora_rank"):
        found["attention_arch"] = "mla"
    elif "kv_lora_rank" in _HF_KEYS and "attention_arch" not in cfg.explicit:
        found["attention_arch"] = "mha"
    if text.get("sliding_window") and text.get("layer_types"):
        found["hybrid"] = "swa"
    fill = {k: v for k, v in found.items() if k not in cfg.explicit}
    if fill:
        cfg.declare(**fill)


@rule(0.5, "model-geometry")
def note_stand_in_model(cfg: Resolving) -> None:
    """Say once when the record's architecture and geometry are the tiny stand-in's."""
    from .model_facts import architecture_known, geometry_known, unknown_model_hint
    unknown = [w for w, known in (("architecture", architecture_known(cfg)), ("KV geometry", geometry_known(cfg)))
               if not known]
    if unknown:
        cfg.info(f"the record's {' and '.join(unknown)} fields are the tiny preset's defaults, standing in: "
                 f"{unknown_model_hint(cfg.model_path, unknown[0])}; checks that depend on them are skipped")


@rule(21, "device-default")
def detect_device(cfg: Resolving) -> None:
    """Unset device: cuda when a GPU is visible, else cpu; any ':N' index is dropped."""
    dev = cfg.device
    if dev is None:
        dev = "cuda" if _gpu_visible(cfg.env) else "cpu"
    dev = str(dev).split(":", 1)[0]
    if dev != cfg.device:
        cfg.declare(device=dev)


def _gpu_visible(env) -> bool:
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and cvd.strip() in ("", "-1"):
        return False
    gpus = Path("/proc/driver/nvidia/gpus")
    return gpus.is_dir() and any(gpus.iterdir())


@rule(24, "X-POD")
def prefill_only_without_kv(cfg: Resolving) -> None:
    """Prefill-only serving without a KV cache: the preconditions of the engine's no-op KV pool."""
    if not cfg.prefill_only_disable_kv_cache:
        return
    f = "prefill_only_disable_kv_cache"
    if not cfg.is_embedding:
        cfg.error(f, "is only supported for embedding models for now (add --is-embedding); other prefill-only "
                  "workloads still read or write the paged KV cache")
    if cfg.kv_cache_dtype in ("nvfp4", "fp4_mx_block16", "mxfp8"):
        cfg.error(f, f"cannot be combined with --kv-cache-dtype {cfg.kv_cache_dtype}: that pool keeps its own "
                  "scale buffers or allocation path, which the no-op pool does not provide")
    if cfg.chunked_prefill_size != -1:
        cfg.error(f, f"needs --chunked-prefill-size -1 (got {cfg.chunked_prefill_size!r}) so that each request is "
                  "prefilled in one pass and no chunk has to read KV back from the pool")
    if cfg.attn_cp_size > 1:
        cfg.error(f, "cannot be combined with --attn-cp-size > 1: context-parallel attention writes KV into the "
                  "pool, which the no-op pool refuses")
    if cfg.enable_prefill_cp:
        cfg.error(f, "cannot be combined with --enable-prefill-cp: prefill context parallelism stages KV through "
                  "the paged cache")
    if not cfg.disable_radix_cache:
        cfg.error("prefill_only_disable_kv_cache", "needs --disable-radix-cache: with no KV kept, the radix "
                  "cache would point at slots holding no data")
    if cfg.enable_hisparse:
        cfg.error("prefill_only_disable_kv_cache", "cannot be combined with --enable-hisparse, which needs its "
                  "own pool family rather than the no-op KV pool")


@rule(46, "X-POD")
def prefill_only_backend(cfg: Resolving) -> None:
    """Prefill-only serving without a KV cache runs only on the FlashAttention prefill backends.

    Checked once the device rules have picked a backend; a backend still unset here is chosen by
    the engine from the GPU it runs on, so it is left to the engine."""
    if not cfg.prefill_only_disable_kv_cache:
        return
    backend = cfg.prefill_attention_backend or cfg.attention_backend
    if backend is not None and backend not in ("fa3", "fa4"):
        cfg.error("prefill_only_disable_kv_cache", f"needs the FlashAttention prefill backend (fa3 or fa4), but the "
                  f"prefill attention backend is {backend!r}")


@rule(30, "X-NPU")
def npu_hicache_defaults(cfg: Resolving) -> None:
    """On Ascend NPUs the host tier always uses the NPU copy kernels and an NPU layout."""
    if cfg.device != "npu":
        return
    host_tier = (cfg.enable_hierarchical_cache or cfg.disaggregation_decode_enable_offload_kvcache
                 or (cfg.mode == "decode" and cfg.disaggregation_decode_retraction_backup in (None, "host_pool")))
    if host_tier:
        cfg.declare(hicache_io_backend="kernel_ascend",
                    hicache_mem_layout="page_first_kv_split" if cfg.use_mla() else "page_first_direct")


@rule(30, "X-CPU")
def cpu_attention_default(cfg: Resolving) -> None:
    """On a CPU device with no attention backend given, pick the one that runs there.

    The reference first names ``intel_amx`` on x86 and later falls back to ``torch_native``
    when the host lacks AMX tiles or the sgl-kernel CPU ops; both steps are folded into
    one here.  The choice matters to the memory rules: page-major layouts accept only
    some backends (M-PM).
    """
    if cfg.device != "cpu" or cfg.attention_backend is not None:
        return
    backend = "intel_amx" if _has_intel_amx() else "torch_native"
    cfg.declare(attention_backend=backend)


@functools.lru_cache(maxsize=1)
def _has_intel_amx() -> bool:
    """Probed once per process: every CPU record would otherwise re-read /proc/cpuinfo."""
    import importlib.util
    import platform

    if platform.machine().lower() in ("aarch64", "arm64"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return " amx_tile" in flags and importlib.util.find_spec("sgl_kernel") is not None


@rule(34, "X-DRC")
def radix_off_for_model(cfg: Resolving) -> None:
    why = _RADIX_OFF_ARCHS.get(cfg.architecture)
    if why and not cfg.disable_radix_cache:
        cfg.declare(disable_radix_cache=True, warn=f"prefix caching is turned off: {why}")


@rule(38, "X-DRC")
def radix_off_for_determinism(cfg: Resolving) -> None:
    if not cfg.enable_deterministic_inference:
        return
    backend = cfg.attention_backend or cfg.prefill_attention_backend or cfg.decode_attention_backend or "triton"
    if backend not in _RADIX_SAFE_DETERMINISTIC and not cfg.disable_radix_cache:
        cfg.declare(disable_radix_cache=True, warn=f"deterministic inference on the {backend} attention backend "
                    "cannot reuse prefixes yet (works with: " + ", ".join(_RADIX_SAFE_DETERMINISTIC) + ")")


@rule(47, "page-size-default")
def default_page_size(cfg: Resolving) -> None:
    if cfg.page_size is None:
        vectorized = cfg.device == "hip" and cfg.env.get("SGLANG_AITER_KV_CACHE_LAYOUT") == "vectorized_5d"
        cfg.declare(page_size=64 if cfg.device == "musa" or vectorized else 1)


@rule(51, "X-DRC")
def radix_off_for_multi_item_scoring(cfg: Resolving) -> None:
    if cfg.enable_mis and not cfg.disable_radix_cache:
        cfg.declare(disable_radix_cache=True, warn="multi-item scoring (--enable-mis) needs the radix cache off")


@rule(79, "X-DLLM")
def diffusion_llm(cfg: Resolving) -> None:
    if not cfg.dllm_algorithm:
        return
    if not cfg.disable_radix_cache:
        for name, label in (("enable_hierarchical_cache", "the hierarchical cache"), ("enable_lmcache", "LMCache"),
                            ("enable_flexkv", "FlexKV")):
            if cfg.values[name]:
                cfg.declare(**{name: False}, warn=f"{label} is turned off for diffusion LLM inference")
    if cfg.mode != "null":
        cfg.declare(disaggregation_mode="null", warn="diffusion LLM inference cannot run disaggregated")


# Settings the engine reads as JSON text only once the model loads (the flag takes a plain
# string); a typo there would pass every check and fail at server start.
_JSON_OBJECT_TEXT = ("json_model_override_args", "model_loader_extra_config", "kv_events_config")


@rule(2, "X-JSON")
def json_text_settings(cfg: Resolving) -> None:
    """Settings given as JSON text."""
    for name in _JSON_OBJECT_TEXT:
        text = cfg.values[name]
        if text is None:
            continue
        try:
            data = json.loads(text) if isinstance(text, str) else text
        except ValueError as exc:
            cfg.error(name, f"{_short(text)!r} is not valid JSON ({exc}); give a JSON object such as "
                      "'{\"key\": 1}' (the engine parses it when the model loads)")
            continue
        if not isinstance(data, dict):
            cfg.error(name, f"{_short(text)!r} is JSON but not an object; give a JSON object such as '{{\"key\": 1}}'")


def _short(text, limit: int = 60) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."
