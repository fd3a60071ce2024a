"""Workloads for cache replays: Mooncake trace reader, synthetic generator, replay."""
from .trace import (
    BLOCK_SIZE, Request, Trace, TraceError, default_trace_path, iter_trace, load_trace,
    parse_line, write_trace,
)
from .synthetic import SyntheticConfig, generate_conversations
from .replay import (
    DEFAULT_PREFILL_US_PER_TOKEN, DEFAULT_TAIL_THRESHOLD_TOKENS, REPLAY_MODES, ReplayResult,
    replay,
)

__all__ = [
    "BLOCK_SIZE", "Request", "Trace", "TraceError", "default_trace_path", "iter_trace",
    "load_trace", "parse_line", "write_trace", "SyntheticConfig", "generate_conversations",
    "DEFAULT_PREFILL_US_PER_TOKEN", "DEFAULT_TAIL_THRESHOLD_TOKENS", "REPLAY_MODES",
    "ReplayResult", "replay",
]
