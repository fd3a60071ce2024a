"""Seeded launch shapes for the differential test against the reference engine.

A shape is a legacy command line (plus environment) that both engines resolve.  The
generator mixes the memory/disagg flags with the few flags of other namespaces that their
rules read, biased towards the combinations the rules care about (HiCache on, a PD role,
speculative decoding, page sizes), so a few hundred shapes reach every rule.
"""
from __future__ import annotations

import json
import random
from typing import Any, Dict, List

# A small Llama-like model: both engines read only this file from the directory.
MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "head_dim": 64,
    "intermediate_size": 512, "vocab_size": 32000, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5,
}

# flag -> values to draw from; None means a store_true flag.
HICACHE_FLAGS: Dict[str, Any] = {
    "--hicache-ratio": ["1", "1.5", "2", "3.5"],  # below 1 with HiCache fails at resolve here (M-SZ)
    "--hicache-size": ["0", "1", "8"],
    "--hicache-host-memory-fraction": ["0.5", "0.8", "1.0", "0", "1.5"],
    "--hicache-host-memory-mode": ["cache", "buffer_only"],
    "--hicache-write-policy": ["write_back", "write_through", "write_through_selective"],
    "--hicache-io-backend": ["direct", "kernel", "kernel_ascend"],
    "--hicache-mem-layout": ["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"],
    "--hicache-storage-backend": ["file", "sim", "mooncake", "dynamic", "nixl", "hf3fs"],
    "--hicache-storage-prefetch-policy": ["best_effort", "wait_complete", "timeout"],
    "--hicache-storage-prefetch-retry-poll-interval": ["0", "4"],
    "--hicache-storage-prefetch-retry-max-attempts": ["0", "3"],
}
DISAGG_FLAGS: Dict[str, Any] = {
    "--disaggregation-transfer-backend": ["mooncake", "nixl", "fake", "mooncake_tcp", "ascend", "mori"],
    "--disaggregation-bootstrap-port": ["8998", "9100"],
    "--disaggregation-decode-enable-radix-cache": None,
    "--disaggregation-decode-enable-offload-kvcache": None,
    "--disaggregation-decode-retraction-backup": ["cpu_tensor", "host_pool", "none"],
    "--disaggregation-decode-host-receive-threshold": ["1.0", "0.5"],
    "--disaggregation-decode-allocation-policy": ["early", "prefill_complete"],
    "--disaggregation-decode-extra-slots": ["0", "4"],
    "--disaggregation-decode-polling-interval": ["1", "4"],
    "--num-reserved-decode-tokens": ["512", "128"],
    "--optimistic-prefill-attempts": ["0", "2"],
    "--disaggregation-enable-kv-checksum": None,
    "--enable-pd-role-switch": None,
}
OTHER_FLAGS: Dict[str, Any] = {
    "--radix-eviction-policy": ["lru", "lfu", "slru", "priority", "tlru"],
    "--disable-radix-cache": None,
    "--enable-page-major-kv-layout": None,
    "--enable-unified-memory": None,
    "--enable-session-radix-cache": None,
    "--encoder-transfer-backend": ["auto", "zmq_to_scheduler", "zmq_to_tokenizer", "mooncake"],
    "--page-size": ["1", "16", "64"],
    "--kv-cache-dtype": ["auto", "fp8_e4m3", "bf16"],
    "--speculative-algorithm": ["EAGLE", "NGRAM"],
    "--enable-priority-scheduling": None,
    "--disable-overlap-schedule": None,
    "--enable-deterministic-inference": None,
    "--dcp-size": ["1", "2"],
    "--tp-size": ["1", "2"],
    "--max-total-tokens": ["4096"],
}
# Rarely drawn: each fails most shapes it joins (the encoder roles need a multimodal model).
RARE_FLAGS: Dict[str, Any] = {"--encoder-only": None, "--language-only": None}
ENVIRONMENTS: List[Dict[str, str]] = [{}, {}, {}, {"MC_FORCE_TCP": "1"}]


def _draw(rng: random.Random, pool: Dict[str, Any], k: int) -> List[str]:
    out: List[str] = []
    for flag in rng.sample(sorted(pool), min(k, len(pool))):
        values = pool[flag]
        out += [flag] if values is None else [flag, rng.choice(values)]
    return out


def make_shapes(count: int, seed: int = 0) -> List[Dict[str, Any]]:
    """``count`` shapes (without the model/device prefix), reproducible from ``seed``."""
    rng = random.Random(seed)
    shapes = []
    for _ in range(count):
        argv: List[str] = []
        if rng.random() < 0.6:
            argv.append(rng.choice(["--enable-hierarchical-cache", "--enable-hicache"]))
        if rng.random() < 0.7:
            argv += _draw(rng, HICACHE_FLAGS, rng.randint(0, 4))
        if rng.random() < 0.6:
            mode = rng.choice(["null", "prefill", "decode", "decode"])
            argv += ["--disaggregation-mode", mode]
            argv += _draw(rng, DISAGG_FLAGS, rng.randint(0, 4))
            # A decode server drops its radix cache, which HiCache needs: usually keep it.
            if mode == "decode" and rng.random() < 0.7 and "--disaggregation-decode-enable-radix-cache" not in argv:
                argv.append("--disaggregation-decode-enable-radix-cache")
        argv += _draw(rng, OTHER_FLAGS, rng.choice([0, 0, 1, 1, 2, 3]))
        if rng.random() < 0.03:
            argv += _draw(rng, RARE_FLAGS, 1)
        # Keep clear of rules outside memory/disagg that reject the engine's CPU defaults:
        # tree drafts on pages of more than one token, and deterministic attention.
        if "--speculative-algorithm" in argv and "--page-size" in argv:
            argv[argv.index("--page-size") + 1] = "1"
        if "--enable-deterministic-inference" in argv:
            argv += ["--attention-backend", "triton"]
        shapes.append({"argv": argv, "env": rng.choice(ENVIRONMENTS)})
    return shapes


def write_model_dir(path) -> str:
    """A directory holding only ``config.json`` of the small model; returns its path."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return str(path)


def same_value(ours: Any, ref: Any) -> bool:
    """Equal after JSON normalisation (tuples as lists, 2 == 2.0)."""
    norm = lambda v: json.loads(json.dumps(v, default=repr))  # noqa: E731
    return norm(ours) == norm(ref)
