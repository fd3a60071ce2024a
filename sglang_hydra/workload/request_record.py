"""One line per request: what the replay predicts for each request, in the units a client measures.

``job=replay job.per_request=true`` writes these lines to ``requests.jsonl``; ``job=validate``
writes the same fields for what a real engine served, so a prediction and a measurement are
compared field by field.  Keeping the record in one place keeps the two sides' names and units
the same: times in milliseconds from the request's own arrival (the moment a client sends it),
tokens as counts.

Fields:

``index``           position of the request in the replayed trace (after the context check)
``arrival_ms``      when it arrives, from the first arrival
``input_tokens``    prompt tokens; ``output_tokens`` tokens generated
``cached_tokens``   prompt tokens served from the prefix cache at the request's (last) admission,
                    all tiers; ``device_cached_tokens`` / ``host_cached_tokens`` /
                    ``storage_cached_tokens`` split it by tier
``ttft_ms``         arrival to first output token
``tpot_ms``         mean gap between later output tokens, ``(e2e - ttft) / (output - 1)``; null
                    for one-token outputs
``e2e_ms``          arrival to last output token
``worker``          the server (``agg0``; prefill server in PD) and ``engine`` the engine inside
                    it (``agg0.1``: data-parallel rank 1); ``decode_worker`` in PD
``retractions``     times the request was sent back to the waiting queue
``finished``        false when the run stopped before the request finished (times are null)
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Optional

__all__ = ["REQUEST_FIELDS", "predicted_requests", "write_jsonl", "read_jsonl", "server_of"]

REQUEST_FIELDS = ("index", "arrival_ms", "input_tokens", "output_tokens", "cached_tokens", "device_cached_tokens",
                  "host_cached_tokens", "storage_cached_tokens", "ttft_ms", "tpot_ms", "e2e_ms", "worker", "engine",
                  "decode_worker", "retractions", "finished")


def server_of(engine_name: Optional[str]) -> Optional[str]:
    """The server an engine belongs to: ``agg0.1`` (server 0, data-parallel rank 1) -> ``agg0``."""
    if engine_name is None:
        return None
    return engine_name.rsplit(".", 1)[0]


def _ms(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1000.0


def predicted_requests(result) -> List[Dict[str, Any]]:
    """One record per request of a :class:`~sglang_hydra.workload.deployment.SimResult`, in
    trace order."""
    reqs = sorted(result.requests, key=lambda s: s.idx)
    first = min((s.arrival_s for s in reqs), default=0.0)
    out = []
    for s in reqs:
        done = s.finish_s is not None and s.first_token_s is not None
        ttft = s.first_token_s - s.arrival_s if done else None
        e2e = s.finish_s - s.arrival_s if done else None
        tpot = (s.finish_s - s.first_token_s) / (s.output_len - 1) if done and s.output_len > 1 else None
        engine = getattr(s.engine, "name", None)
        decode = getattr(s.decode_engine, "name", None)
        out.append({
            "index": s.idx,
            "arrival_ms": (s.arrival_s - first) * 1000.0,
            "input_tokens": s.input_len,
            "output_tokens": s.output_len,
            "cached_tokens": s.device_hit + s.host_hit + s.storage_hit,
            "device_cached_tokens": s.device_hit,
            "host_cached_tokens": s.host_hit,
            "storage_cached_tokens": s.storage_hit,
            "ttft_ms": _ms(ttft),
            "tpot_ms": _ms(tpot),
            "e2e_ms": _ms(e2e),
            "worker": server_of(engine),
            "engine": engine,
            "decode_worker": server_of(decode),
            "retractions": s.retractions,
            "finished": done,
        })
    return out


def write_jsonl(rows: Iterable[Dict[str, Any]]) -> str:
    """The rows as JSON lines (keys in :data:`REQUEST_FIELDS` order first)."""
    lines = []
    for row in rows:
        ordered = {k: row[k] for k in REQUEST_FIELDS if k in row}
        ordered.update({k: v for k, v in row.items() if k not in ordered})
        lines.append(json.dumps(ordered))
    return "\n".join(lines) + ("\n" if lines else "")


def read_jsonl(text: str) -> List[Dict[str, Any]]:
    """Rows written by :func:`write_jsonl`."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]
