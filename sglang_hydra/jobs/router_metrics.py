"""The router's own count of requests per worker, read from its Prometheus endpoint.

sglang-router 0.3.2 exports, per worker URL, the outcome of every request it sent there
(``smg_worker_cb_outcomes_total{worker="<url>", outcome="success"|"failure"}``, the circuit
breaker's counters).  Summed over outcomes that is how many requests the router sent to each
worker: what a prediction of the router's choices is compared with.
"""
from __future__ import annotations

import re
import urllib.request
from typing import Dict

#: the counter that counts requests per worker (one series per worker and outcome)
WORKER_COUNTER = "smg_worker_cb_outcomes_total"

_SAMPLE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def parse_worker_counts(text: str, counter: str = WORKER_COUNTER) -> Dict[str, int]:
    """Requests per worker URL from a Prometheus text exposition (every outcome summed)."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or m["name"] != counter:
            continue
        labels = {lm["key"]: lm["value"] for lm in _LABEL.finditer(m["labels"] or "")}
        worker = labels.get("worker") or labels.get("worker_url") or labels.get("url")
        if worker is None:
            continue
        out[worker.rstrip("/")] = out.get(worker.rstrip("/"), 0) + int(float(m["value"]))
    return out


def router_worker_counts(metrics_url: str, timeout: float = 5.0) -> Dict[str, int]:
    """The router's requests per worker URL, read now from ``metrics_url`` (``.../metrics``)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(metrics_url, timeout=timeout) as resp:
        return parse_worker_counts(resp.read().decode("utf-8", "replace"))
