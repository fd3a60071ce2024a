"""Timeouts and knobs read from the environment, under the reference engine's names.

Names starting with ``SGLANG_DISAGGREGATION_`` / ``SGLANG_MOONCAKE_`` / ``SGLANG_TEST_`` are the
reference's (its two ``SGLANG_TEST_*`` fault injections are part of the reference engine's own
surface, so they stay here); the ``SGLANG_HYDRA_DISAGG_*`` ones are this project's additions.
Every variable is parsed by :mod:`sglang_hydra.utils.envflags`: a value that is not a number or
a boolean raises an error naming the variable instead of silently meaning "off".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sglang_hydra.utils.envflags import env_flag, env_float, env_str

SECRET_ENV = "SGLANG_HYDRA_DISAGG_BOOTSTRAP_SECRET"


def _int(name: str, default: int) -> int:
    return int(env_float(name, default))


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
    deferred_release: bool = True             # SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE
    deferred_release_timeout: float = 30.0    # SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT
    failure_prob: float = 0.0                 # SGLANG_TEST_DISAGG_FAILURE_PROB
    checksum_mismatch_prob: float = 0.0       # SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB
    bootstrap_retries: int = 5                # SGLANG_HYDRA_DISAGG_BOOTSTRAP_RETRIES
    bootstrap_http_timeout: float = 5.0       # SGLANG_HYDRA_DISAGG_BOOTSTRAP_HTTP_TIMEOUT
    bootstrap_backoff: float = 0.25           # SGLANG_HYDRA_DISAGG_BOOTSTRAP_BACKOFF
    bootstrap_secret: Optional[str] = None    # SGLANG_HYDRA_DISAGG_BOOTSTRAP_SECRET (the record's field wins)
    prefill_send_timeout: float = 30.0        # SGLANG_HYDRA_DISAGG_PREFILL_SEND_TIMEOUT
    max_inflight_transfers: int = 16          # SGLANG_HYDRA_DISAGG_MAX_INFLIGHT_TRANSFERS

    @classmethod
    def from_env(cls) -> "DisaggEnv":
        return cls(
            bootstrap_timeout=env_float("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0),
            waiting_timeout=env_float("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0),
            # the reference clamps the interval to >= 2 s; we allow shorter ones so tests stay fast
            heartbeat_interval=max(0.05, env_float("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0)),
            heartbeat_max_failure=max(1, _int("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2)),
            zmq_send_timeout=env_float("SGLANG_DISAGGREGATION_ZMQ_SEND_TIMEOUT", 1.0),
            engine_init_timeout=env_float("SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT", 60.0),
            queue_size=max(1, _int("SGLANG_DISAGGREGATION_QUEUE_SIZE", 4)),
            mooncake_max_batch=_int("SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES", 0),
            deferred_release=env_flag("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", True),
            deferred_release_timeout=env_float("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT", 30.0),
            failure_prob=env_float("SGLANG_TEST_DISAGG_FAILURE_PROB", 0.0),
            checksum_mismatch_prob=env_float("SGLANG_TEST_DISAGG_KV_CHECKSUM_MISMATCH_PROB", 0.0),
            bootstrap_retries=max(1, _int("SGLANG_HYDRA_DISAGG_BOOTSTRAP_RETRIES", 5)),
            bootstrap_http_timeout=env_float("SGLANG_HYDRA_DISAGG_BOOTSTRAP_HTTP_TIMEOUT", 5.0),
            bootstrap_backoff=env_float("SGLANG_HYDRA_DISAGG_BOOTSTRAP_BACKOFF", 0.25),
            bootstrap_secret=env_str(SECRET_ENV),
            prefill_send_timeout=env_float("SGLANG_HYDRA_DISAGG_PREFILL_SEND_TIMEOUT", 30.0),
            max_inflight_transfers=max(1, _int("SGLANG_HYDRA_DISAGG_MAX_INFLIGHT_TRANSFERS", 16)),
        )
