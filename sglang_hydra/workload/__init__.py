"""Workloads: the Mooncake trace reader, the synthetic generator, the deployment simulation
(:mod:`.deployment`) and the rules' cache counts computed with it (:func:`replay`)."""
from .trace import (
    BLOCK_SIZE, Request, Trace, TraceError, default_trace_path, iter_trace, load_trace,
    parse_line, write_trace,
)
from .synthetic import SyntheticConfig, generate_conversations
from .replay import DEFAULT_TAIL_THRESHOLD_TOKENS, REPLAY_MODES, ReplayResult, replay

__all__ = [
    "BLOCK_SIZE", "Request", "Trace", "TraceError", "default_trace_path", "iter_trace",
    "load_trace", "parse_line", "write_trace", "SyntheticConfig", "generate_conversations",
    "DEFAULT_TAIL_THRESHOLD_TOKENS", "REPLAY_MODES",
    "ReplayResult", "replay",
]
