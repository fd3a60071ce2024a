"""A real client for a running SGLang deployment: streams ``/generate`` and times every token.

Each request is sent as ``input_ids`` (no tokenizer on either side), greedy, with
``ignore_eos`` so it produces exactly the output length asked for, and ``"stream": true`` so
the first token (TTFT) and every later one (ITL) are seen when they arrive.  What the server
says about the request (``cached_tokens``, ``prompt_tokens``, ``completion_tokens``,
``weight_version`` -- which names the server when each is launched with its own -- and
``dp_rank``) is kept next to the client's own clock readings.

Pacing: ``sequential`` sends a request when the previous one has finished; ``scheduled`` sends
each at its given time from the start (the trace's arrival times, or a rate), open loop, each in
its own thread, so a slow server makes requests overlap exactly as it would for real users.
Standard library only (``http.client`` + threads): a thread per in-flight request is plenty
for the hundreds of requests a validation sends.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence
from urllib.parse import urlsplit

__all__ = ["Planned", "Measured", "generate", "run_requests", "flush_cache", "get_json"]


@dataclass
class Planned:
    """One request to send: its token ids, output length and (scheduled pacing) send time."""

    index: int
    input_ids: List[int]
    max_new_tokens: int
    send_at_s: float = 0.0


@dataclass
class Measured:
    """What the client saw of one request (seconds on the client's clock, from the run's start)."""

    index: int
    sent_s: float = 0.0
    first_token_s: Optional[float] = None
    finish_s: Optional[float] = None
    token_times_s: List[float] = field(default_factory=list)   # arrival of each streamed token
    prompt_tokens: Optional[int] = None
    completion_tokens: Optional[int] = None
    cached_tokens: Optional[int] = None
    weight_version: Optional[str] = None
    dp_rank: Optional[int] = None
    server_e2e_s: Optional[float] = None
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_s is not None and self.first_token_s is not None


def _connection(url: str, timeout: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)


def get_json(url: str, path: str, *, timeout: float = 10.0, method: str = "GET", body: Optional[dict] = None) -> Any:
    """One small JSON request; raises ``OSError`` (connection) or ``RuntimeError`` (status)."""
    conn = _connection(url, timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status >= 300:
            raise RuntimeError(f"{method} {url}{path}: HTTP {resp.status}: {raw[:200]!r}")
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode(errors="replace")
    finally:
        conn.close()


def flush_cache(url: str, *, timeout: float = 30.0) -> None:
    """Empty the server's prefix cache (``POST /flush_cache``; SGLang refuses while requests run,
    so it is retried until the server is idle)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            get_json(url, "/flush_cache", method="POST", timeout=timeout)
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def generate(url: str, planned: Planned, *, clock0: float, timeout: float = 600.0) -> Measured:
    """Send one request and stream its answer; errors are kept in ``Measured.error``."""
    m = Measured(planned.index)
    body = {"input_ids": planned.input_ids, "stream": True,
            "sampling_params": {"max_new_tokens": int(planned.max_new_tokens), "temperature": 0.0,
                                "ignore_eos": True}}
    data = json.dumps(body).encode()
    conn = _connection(url, timeout)
    try:
        m.sent_s = time.perf_counter() - clock0
        conn.request("POST", "/generate", body=data, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            m.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
            return m
        seen = 0
        last_meta: Dict[str, Any] = {}
        while True:
            line = resp.readline()
            if not line:
                break
            now = time.perf_counter() - clock0
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                m.error = str(chunk["error"])[:300]
                return m
            meta = chunk.get("meta_info") or {}
            last_meta = meta
            count = meta.get("completion_tokens")
            if count is None:
                count = len(chunk.get("output_ids") or ())
            for _ in range(max(0, int(count) - seen)):
                m.token_times_s.append(now)
            seen = max(seen, int(count))
        if not m.token_times_s:
            m.error = "the stream ended without a token"
            return m
        m.first_token_s = m.token_times_s[0]
        m.finish_s = m.token_times_s[-1]
        m.prompt_tokens = last_meta.get("prompt_tokens")
        m.completion_tokens = last_meta.get("completion_tokens")
        m.cached_tokens = last_meta.get("cached_tokens")
        m.weight_version = last_meta.get("weight_version")
        m.dp_rank = last_meta.get("dp_rank")
        m.server_e2e_s = last_meta.get("e2e_latency")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        m.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return m


def run_requests(url: str, plan: Sequence[Planned], *, pacing: str = "sequential", timeout: float = 600.0,
                 on_done: Optional[Callable[[Measured], None]] = None,
                 stop: Optional[threading.Event] = None) -> List[Measured]:
    """Send ``plan`` to ``url`` (``sequential`` or ``scheduled`` pacing, see the module doc) and
    return one :class:`Measured` per request, in plan order.  ``stop`` set: no new request is sent
    (the unsent ones come back with ``error='not sent'``)."""
    if pacing not in ("sequential", "scheduled"):
        raise ValueError(f"pacing must be sequential or scheduled, got {pacing!r}")
    results: List[Optional[Measured]] = [None] * len(plan)
    clock0 = time.perf_counter()

    def one(i: int) -> None:
        results[i] = generate(url, plan[i], clock0=clock0, timeout=timeout)
        if on_done is not None:
            on_done(results[i])

    if pacing == "sequential":
        for i in range(len(plan)):
            if stop is not None and stop.is_set():
                break
            one(i)
    else:
        threads = []
        for i, p in enumerate(sorted(range(len(plan)), key=lambda k: plan[k].send_at_s)):
            wait = plan[p].send_at_s - (time.perf_counter() - clock0)
            if stop is not None:
                if stop.wait(max(0.0, wait)):
                    break
            elif wait > 0:
                time.sleep(wait)
            t = threading.Thread(target=one, args=(p,), daemon=True)
            t.start()
            threads.append(t)
        for t in threads:
            t.join(timeout + 5.0)
    return [r if r is not None else Measured(plan[i].index, error="not sent") for i, r in enumerate(results)]
