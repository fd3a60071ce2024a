"""Rules of the ``disagg`` namespace: PD roles, transfer backends, encoder disaggregation."""
from __future__ import annotations

import json
from pathlib import Path

from ..rulebook import Resolving, rule
from .model_facts import architecture_known, skip_unjudged

_DCP_DECODE_BACKENDS = ("mooncake", "nixl", "mori", "ascend", "fake")
_ENCODER_ARCHS = (
    "Qwen2VLForConditionalGeneration", "Qwen3VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "Qwen3OmniMoeForConditionalGeneration",
    "Qwen2AudioForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration", "Dots3NoteForCausalLM",
    "KimiVLForConditionalGeneration", "KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "MiMoV2ForCausalLM", "Glm5NextForConditionalGeneration", "MiniMaxM3SparseForConditionalGeneration",
    "MuseSparkForConditionalGeneration",
)
_LANGUAGE_MODEL_ONLY_ARCHS = (
    "DeepseekV4ForCausalLM", "MuseGlimmerForConditionalGeneration", "Cosmos3ForConditionalGeneration",
    "Cosmos3EdgeForConditionalGeneration",
)


@rule(9, "X-RS")
def response_store_needs_colocation(cfg: Resolving) -> None:
    if cfg.enable_response_store and cfg.mode != "null":
        cfg.error("enable_response_store", f"cannot store responses on a PD {cfg.mode} server; keep it off in PD mode")


@rule(23, "D-PD")
def pd_disaggregation(cfg: Resolving) -> None:
    # D-PD1: mooncake_tcp is Mooncake forced onto TCP.
    if cfg.backend == "mooncake_tcp":
        cfg.declare(disaggregation_transfer_backend="mooncake", disaggregation_ib_device=None)
        cfg.info("transfer backend 'mooncake_tcp' runs Mooncake with MC_FORCE_TCP=1 (TCP, no RDMA)")
    # D-PD2: prefill_complete needs a supported setup and optimistic prefill on the prefill side.
    if cfg.disaggregation_decode_allocation_policy == "prefill_complete":
        _check_prefill_complete(cfg)
        if cfg.mode == "prefill" and cfg.optimistic_prefill_attempts == 0:
            cfg.declare(optimistic_prefill_attempts=1)
    # D-PD13 (sglang-hydra): a bootstrap secret must be something to check
    secret = cfg.values.get("disaggregation_bootstrap_secret")
    if secret is not None and not str(secret).strip():
        cfg.error("disaggregation_bootstrap_secret", "is blank; give a non-empty shared secret or leave it unset")
    # D-PD3
    if cfg.mode == "prefill" and cfg.dcp_size > 1:
        cfg.warn("decode context parallelism on a prefill server works only with the same DCP layout on decode "
                 "and rarely speeds prefill up")
    # D-PD4: receiving into the decode host pool.
    thr = cfg.disaggregation_decode_host_receive_threshold
    if not 0 <= thr <= 1:
        cfg.error("disaggregation_decode_host_receive_threshold", f"{thr!r} is outside [0, 1]")
    elif thr < 1:
        if cfg.enable_hisparse or cfg.enable_pd_role_switch:
            cfg.error("disaggregation_decode_host_receive_threshold",
                      "receiving KV into the decode host pool does not work with --enable-hisparse or --enable-pd-role-switch yet")
        elif cfg.disaggregation_decode_retraction_backup == "cpu_tensor":
            cfg.error("disaggregation_decode_retraction_backup",
                      "'cpu_tensor' cannot be used with a host-receive threshold below 1; KV received into host memory "
                      "needs the 'host_pool' backup")
        else:
            if cfg.disaggregation_decode_retraction_backup == "none":
                cfg.warn("an explicit 'none' retraction backup becomes 'host_pool' because the host-receive threshold is below 1")
            cfg.declare(disaggregation_decode_retraction_backup="host_pool")
    # D-PD5
    if cfg.mode == "decode" and cfg.dcp_size > 1 and cfg.backend not in _DCP_DECODE_BACKENDS:
        cfg.error("disaggregation_transfer_backend", f"{cfg.backend!r} cannot feed a decode server with --dcp-size > 1; "
                  f"use one of: {', '.join(_DCP_DECODE_BACKENDS)} (fake only for synthetic benchmarks)")
    # D-PD6 / D-PD7: decode-side radix cache and extra slots.
    if cfg.mode == "decode":
        if cfg.disaggregation_decode_enable_radix_cache:
            if cfg.enable_hisparse:
                cfg.error("disaggregation_decode_enable_radix_cache", "cannot be combined with --enable-hisparse")
            if cfg.backend == "fake":
                cfg.error("disaggregation_decode_enable_radix_cache", "needs real KV; the 'fake' transfer backend moves none")
            if cfg.attn_dp_enabled():
                cfg.warn("experimental: a decode radix cache with DP attention needs prefix-aware routing to pay off")
            if cfg.disable_radix_cache:
                cfg.declare(disable_radix_cache=False, warn="the decode radix cache was requested (experimental)")
            else:
                cfg.declare(disable_radix_cache=False)
        else:
            if not cfg.disable_radix_cache:
                cfg.declare(disable_radix_cache=True, warn="decode servers run without a radix cache unless "
                            "--disaggregation-decode-enable-radix-cache is given")
            else:
                cfg.declare(disable_radix_cache=True)
        if cfg.disaggregation_decode_extra_slots is None:
            mrr = cfg.max_running_requests
            if mrr is None:
                extra = 0
            else:
                per_worker = max(1, mrr // (cfg.dp_size * cfg.attn_dp_size))
                extra = per_worker * 2 if per_worker <= 32 else 0
            cfg.declare(disaggregation_decode_extra_slots=extra)
    # D-PD8
    if cfg.mode == "prefill":
        if cfg.backend == "fake":
            cfg.error("disaggregation_transfer_backend", "a prefill server cannot use 'fake': it only exists on the decode "
                      "side, to benchmark decode without a prefill peer")
        if cfg.getenv_flag("SGLANG_RUST_SERVER"):
            _bootstrap_on_api_port(cfg)
    # D-PD9
    if cfg.mode in ("prefill", "decode") and cfg.getenv_flag("SGLANG_DISAGG_STAGING_BUFFER") \
            and cfg.backend not in ("mooncake", "nixl"):
        cfg.error("disaggregation_transfer_backend", f"SGLANG_DISAGG_STAGING_BUFFER works only with 'mooncake' or "
                  f"'nixl', not {cfg.backend!r}")
    # D-PD10
    if cfg.mode in ("prefill", "decode") and cfg.enable_pd_role_switch:
        missing = []
        if cfg.ep_size > 1:
            missing.append(f"expert parallelism (--ep-size {cfg.ep_size})")
        if cfg.moe_a2a_backend != "none":
            missing.append(f"MoE all-to-all (--moe-a2a-backend {cfg.moe_a2a_backend})")
        if cfg.pp_size > 1:
            missing.append(f"pipeline parallelism (--pp-size {cfg.pp_size})")
        if cfg.attn_dp_enabled() and cfg.enable_dp_attention_local_control_broadcast:
            missing.append("DP attention local control broadcast")
        if cfg.dcp_size > 1:
            missing.append(f"decode context parallelism (--dcp-size {cfg.dcp_size})")
        if cfg.speculative_algorithm is not None:
            missing.append(f"speculative decoding (--speculative-algorithm {cfg.speculative_algorithm})")
        if missing:
            cfg.error("enable_pd_role_switch", "switching roles at runtime does not rebuild the state of: "
                      + ", ".join(missing) + "; drop those options or the role switch")


def _check_prefill_complete(cfg: Resolving) -> None:
    """D-PD12: what prefill_complete allocation cannot run with yet."""
    v = cfg.values
    thr = v["disaggregation_decode_host_receive_threshold"]
    reasons = []
    if cfg.mode not in ("prefill", "decode"):
        reasons.append("aggregated serving")
    if cfg.backend != "mooncake":
        reasons.append("transfer backends other than Mooncake")
    if v["pp_size"] != 1 or v["attn_cp_size"] != 1 or v["dcp_size"] != 1:
        reasons.append("pipeline or attention context parallelism")
    if v["tp_size"] != (v["dp_size"] if v["enable_dp_attention"] else 1):
        reasons.append("attention tensor parallelism above 1")
    if v["enable_pdmux"] or v["decoupled_spec_role"] != "null":
        reasons.append("PD multiplexing or decoupled speculation")
    if v["enable_pd_role_switch"]:
        reasons.append("runtime PD role switching")
    if v["encoder_only"] or v["language_only"]:
        reasons.append("encoder disaggregation")
    if v["enable_hisparse"]:
        reasons.append("HiSparse")
    if isinstance(thr, (int, float)) and thr < 1:
        reasons.append("decode host KV buffering")
    if cfg.mode == "decode" and (v["disaggregation_decode_enable_radix_cache"] or v["enable_hierarchical_cache"]):
        reasons.append("a decode radix cache or decode HiCache")
    if cfg.mode == "prefill" and v["enable_hierarchical_cache"] and (
            v["hicache_storage_backend"] is not None or v["hicache_write_policy"] != "write_back"):
        reasons.append("prefill HiCache other than host-only write_back")
    if cfg.getenv_flag("SGLANG_DISAGG_STAGING_BUFFER"):
        reasons.append("staging buffers (SGLANG_DISAGG_STAGING_BUFFER)")
    if cfg.getenv_flag("SGLANG_RUST_SERVER"):
        reasons.append("the Rust bootstrap registry (SGLANG_RUST_SERVER)")
    if reasons:
        cfg.error("disaggregation_decode_allocation_policy",
                  "'prefill_complete' cannot be used yet with: " + "; ".join(reasons))


def _bootstrap_on_api_port(cfg: Resolving) -> None:
    """D-PD11: with the Rust front end the KV registry shares the HTTP api port."""
    if cfg.backend not in ("mooncake", "nixl", "mori", "fake", "ascend"):
        cfg.info(f"backend {cfg.backend} keeps its own bootstrap server on port {cfg.disaggregation_bootstrap_port}")
        return
    bp, port = cfg.disaggregation_bootstrap_port, cfg.port
    if bp not in (8998, port):
        cfg.error("disaggregation_bootstrap_port", f"{bp} conflicts with --port {port}: with SGLANG_RUST_SERVER the "
                  "bootstrap registry is served on the api port; drop --disaggregation-bootstrap-port")
    elif bp != port:
        cfg.declare(disaggregation_bootstrap_port=port)


@rule(67, "D-SPEC")
def speculative_algorithm(cfg: Resolving) -> None:
    alg = cfg.speculative_algorithm
    if alg is not None:
        norm = str(alg).upper()
        if norm == "NEXTN":
            norm = "EAGLE"
        if norm != alg:
            cfg.declare(speculative_algorithm=norm)
        alg = norm
    if cfg.mode == "decode" and cfg.disaggregation_decode_enable_radix_cache and alg not in (None, "DSPARK", "EAGLE", "EAGLE3"):
        cfg.error("disaggregation_decode_enable_radix_cache", f"does not work with speculative algorithm {alg} "
                  "(allowed: EAGLE, EAGLE3, DSPARK)")
    if cfg.enable_pdmux and alg == "UNO":
        cfg.error("enable_pdmux", "UNO tree speculative decoding does not support PD multiplexing yet")
    if alg == "DSPARK" and cfg.pp_size != 1 and cfg.mode != "prefill":
        cfg.error("pp_size", "DSPARK with pipeline parallelism needs a PD prefill server; elsewhere use --pp-size 1")


@rule(73, "D-ENC")
def encoder_disaggregation(cfg: Resolving) -> None:
    arch = cfg.architecture
    arch_known = architecture_known(cfg)   # else `arch` is the tiny stand-in: judge nothing by it
    # D-ENC1
    if cfg.language_model_only:
        for name, flag in (("encoder_only", "--encoder-only"), ("language_only", "--language-only"),
                           ("enable_prefix_mm_cache", "--enable-prefix-mm-cache"),
                           ("enable_broadcast_mm_inputs_process", "--enable-broadcast-mm-inputs-process"),
                           ("mm_enable_dp_encoder", "--mm-enable-dp-encoder")):
            if cfg.values[name]:
                cfg.error("language_model_only", f"cannot be combined with {flag}")
        if not arch_known:
            skip_unjudged(cfg, "whether the model supports --language-model-only (and on a PD server)")
        else:
            if cfg.mode != "null" and cfg.model_type != "deepseek_v41":
                cfg.error("language_model_only", "cannot be used on a PD prefill or decode server")
            if arch not in _LANGUAGE_MODEL_ONLY_ARCHS:
                cfg.error("language_model_only", f"{arch} is not supported; supported: {', '.join(_LANGUAGE_MODEL_ONLY_ARCHS)}")
    # D-ENC2
    if cfg.enable_prefix_mm_cache and not cfg.encoder_only:
        cfg.error("enable_prefix_mm_cache", "only works on an encoder server (--encoder-only)")
    if cfg.encoder_only and cfg.language_only:
        cfg.error("encoder_only", "--encoder-only and --language-only exclude each other")
    if cfg.encoder_only and cfg.mode != "null":
        cfg.error("encoder_only", "an encoder server cannot also be a PD prefill or decode server")
    # D-ENC3
    if cfg.language_only and not cfg.encoder_urls:
        cfg.info("--language-only without --encoder-urls: encoders must register through the encoder bootstrap server")
    # D-ENC4: RDMA device list for Mooncake.
    if (cfg.backend == "mooncake" and cfg.mode in ("prefill", "decode")) or cfg.encoder_transfer_backend == "mooncake":
        _validate_ib_devices(cfg)
    # D-ENC5
    if cfg.encoder_transfer_backend == "auto":
        chosen = "zmq_to_tokenizer" if arch == "KimiK3ForConditionalGeneration" and cfg.tp_size > 1 else "zmq_to_scheduler"
        cfg.declare(encoder_transfer_backend=chosen)
    # D-ENC6 / D-ENC7
    if (cfg.encoder_only or cfg.language_only) and not arch_known:
        skip_unjudged(cfg, "whether encoder disaggregation (--encoder-only/--language-only) supports the model")
    elif (cfg.encoder_only or cfg.language_only) and arch not in _ENCODER_ARCHS:
        cfg.error("encoder_only" if cfg.encoder_only else "language_only",
                  f"encoder disaggregation does not support {arch}; supported families: Qwen2-VL/Qwen3-VL/Qwen3.5, "
                  "InternS2, Qwen2-Audio, Qwen2.5-Omni/Qwen3-Omni, Dots3-Note, Kimi, MiMo-V2, GLM5-Next, MiniMax-M3, MuseSpark")
    if arch == "MuseSparkForConditionalGeneration" and cfg.language_only and cfg.enable_adaptive_dispatch_to_encoder:
        cfg.error("enable_adaptive_dispatch_to_encoder", "Muse language-only servers have no local encoder to dispatch to")


def _validate_ib_devices(cfg: Resolving) -> None:
    value = cfg.disaggregation_ib_device
    if value is None:
        cfg.warn("no RDMA devices given for Mooncake; it will discover them itself")
        return
    field = "disaggregation_ib_device"
    if not str(value).strip():
        cfg.error(field, "is blank; give device names (mlx5_0,mlx5_1) or a GPU-to-device JSON mapping")
        return
    sysfs = Path(cfg.env.get("SGLANG_HYDRA_IB_SYSFS", "/sys/class/infiniband"))
    if not sysfs.is_dir():
        cfg.error(field, f"{value!r} names RDMA devices but {sysfs} does not exist (no InfiniBand driver); "
                  "leave it unset for TCP")
        return
    available = sorted(p.name for p in sysfs.iterdir())
    if not available:
        cfg.error(field, f"{value!r} names RDMA devices but {sysfs} lists none")
        return
    text = str(value).strip()
    groups = {}
    if text.endswith(".json") or text.startswith("{"):
        try:
            mapping = json.loads(Path(text).read_text() if text.endswith(".json") else text)
        except FileNotFoundError:
            cfg.error(field, f"file {text} does not exist")
            return
        except ValueError:
            cfg.error(field, f"{text!r} is not valid JSON")
            return
        if not isinstance(mapping, dict) or not mapping:
            cfg.error(field, "the JSON form must be a non-empty object mapping GPU ids to device lists")
            return
        for k, v in mapping.items():
            if not str(k).isdigit() or not isinstance(v, str):
                cfg.error(field, "JSON keys must be GPU ids (digits) and values device-list strings")
                return
            groups[f"GPU {k}"] = (str(k), v)
    else:
        groups["all GPUs"] = (None, text)
    result = {}
    for ctx, (key, devs) in groups.items():
        names = [d.strip() for d in devs.split(",") if d.strip()]
        if not names:
            cfg.error(field, f"no devices given for {ctx}")
            return
        uniq = list(dict.fromkeys(names))
        if len(uniq) != len(names):
            cfg.warn(f"duplicate RDMA devices for {ctx} reduced to {','.join(uniq)}")
        bad = [d for d in uniq if d not in available]
        if bad:
            cfg.error(field, f"unknown RDMA devices for {ctx}: {', '.join(bad)}; available: {', '.join(available)}")
            return
        result[key] = ",".join(uniq)
    normalized = result[None] if None in result else json.dumps(result, separators=(",", ":"))
    if normalized != value:
        cfg.declare(disaggregation_ib_device=normalized)


@rule(82, "D-OPT")
def optimistic_prefill(cfg: Resolving) -> None:
    if cfg.optimistic_prefill_attempts > 0 and cfg.mode == "prefill":
        if cfg.pp_size > 1:
            cfg.declare(optimistic_prefill_attempts=0, warn="optimistic prefill does not support pipeline parallelism")
        elif cfg.enable_hierarchical_cache:
            storage, policy = cfg.hicache_storage_backend, cfg.hicache_write_policy
            ok = (storage is None and policy in ("write_back", "write_through")) or (
                storage is not None and cfg.hicache_host_memory_mode == "buffer_only" and policy == "write_through")
            if not ok:
                cfg.declare(optimistic_prefill_attempts=0, warn="optimistic prefill supports host-only write_back/"
                            "write_through HiCache, or buffer_only storage with write_through")
    if cfg.disaggregation_decode_allocation_policy == "prefill_complete" and cfg.mode == "prefill" \
            and cfg.optimistic_prefill_attempts <= 0:
        cfg.error("disaggregation_decode_allocation_policy", "'prefill_complete' needs optimistic prefill, which this "
                  "cache configuration turned off")
