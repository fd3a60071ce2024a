"""Timeouts and knobs read from the environment, under the reference engine's names.

Names starting with ``SGLANG_DISAGGREGATION_`` / ``SGLANG_MOONCAKE_`` / ``SGLANG_TEST_`` are the
reference's; the few ``SGLANG_HYDRA_DISAGG_*`` ones are this project's additions (bounded
bootstrap retries and fault-injection hooks used by the tests).
"""
from __future__ import annotations

import os
from dataclasses import dataclass


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {name}={raw!r} is not a number") from e


def _int(name: str, default: int) -> int:
    return int(_float(name, default))


def _bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class DisaggEnv:
    bootstrap_timeout: float = 300.0          # SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
    waiting_timeout: float = 300.0            # SGLANG_DISAGGREGATION_WAITING_TIMEOUT
    heartbeat_interval: float = 5.0           # SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL
    heartbeat_max_failure: int = 2            # SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE
    zmq_send_timeout: float = 1.0             # SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT
    engine_init_timeout: float = 60.0         # SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT
    queue_size: int = 4                       # SGLANG_DISAGGREGATION_QUEUE_SIZE
    mooncake_max_batch: int = 0               # SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES
    failure_prob: float = 0.0                 # SGLANG_TEST_DISAGG_FAILURE_PROB
    checksum_mismatch_prob: float = 0.0       # SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB
    bootstrap_retries: int = 5                # SGLANG_HYDRA_DISAGG_BOOTSTRAP_RETRIES
    bootstrap_http_timeout: float = 5.0       # SGLANG_HYDRA_DISAGG_BOOTSTRAP_HTTP_TIMEOUT
    bootstrap_backoff: float = 0.25           # SGLANG_HYDRA_DISAGG_BOOTSTRAP_BACKOFF
    prefill_send_timeout: float = 30.0        # SGLANG_HYDRA_DISAGG_PREFILL_SEND_TIMEOUT
    test_transfer_delay: float = 0.0          # SGLANG_HYDRA_TEST_DISAGG_TRANSFER_DELAY

    @classmethod
    def from_env(cls) -> "DisaggEnv":
        return cls(
            bootstrap_timeout=_float("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0),
            waiting_timeout=_float("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0),
            # the reference clamps the interval to >= 2 s; we allow shorter ones so tests stay fast
            heartbeat_interval=max(0.05, _float("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0)),
            heartbeat_max_failure=max(1, _int("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)),
            zmq_send_timeout=_float("SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT", 1.0),
            engine_init_timeout=_float("SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT", 60.0),
            queue_size=max(1, _int("SGLANG_DISAGGREGATION_QUEUE_SIZE", 4)),
            mooncake_max_batch=_int("SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES", 0),
            failure_prob=_float("SGLANG_TEST_DISAGG_FAILURE_PROB", 0.0),
            checksum_mismatch_prob=_float("SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB", 0.0),
            bootstrap_retries=max(1, _int("SGLANG_HYDRA_DISAGG_BOOTSTRAP_RETRIES", 5)),
            bootstrap_http_timeout=_float("SGLANG_HYDRA_DISAGG_BOOTSTRAP_HTTP_TIMEOUT", 5.0),
            bootstrap_backoff=_float("SGLANG_HYDRA_DISAGG_BOOTSTRAP_BACKOFF", 0.25),
            prefill_send_timeout=_float("SGLANG_HYDRA_DISAGG_PREFILL_SEND_TIMEOUT", 30.0),
            test_transfer_delay=_float("SGLANG_HYDRA_TEST_DISAGG_TRANSFER_DELAY", 0.0),
        )
