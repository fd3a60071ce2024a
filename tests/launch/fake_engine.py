"""A test double of SGLang's ``/generate`` for the client and ``job=validate``: streaming
server-sent events, ``meta_info`` as SGLang fills it, and a prefix cache of whole pages.

It is not SGLang: the real engine is checked by the ``reference`` tests.  What it gives the
fast tests is an engine whose answers are known in advance:

* ``cached_tokens``: the longest prefix of whole ``--page-size`` pages seen before, capped at
  ``len - 1`` rounded down to a page (as SGLang reports it); nothing is ever evicted;
* time: each request sleeps ``--prefill-ms`` before its first token, then ``--decode-ms``
  per further token; requests are served one at a time (a lock), so concurrency queues;
* ``--weight-version`` is echoed in every answer (how job=validate names the server).

Run as ``python fake_engine.py --port P [--page-size 16] ...``; ``/health`` and ``/flush_cache``
answer as SGLang's do.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--prefill-ms", type=float, default=5.0)
    p.add_argument("--decode-ms", type=float, default=2.0)
    p.add_argument("--weight-version", default="default")
    args = p.parse_args(argv)
    pages = set()
    lock = threading.Lock()
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def _json(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                self._json(200, {})
            elif self.path == "/served":
                self._json(200, {"served": served[0]})
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            if self.path == "/flush_cache":
                pages.clear()
                self._json(200, {})
                return
            if self.path != "/generate":
                self._json(404, {"error": "not found"})
                return
            ids = body["input_ids"]
            n = int(body["sampling_params"]["max_new_tokens"])
            ps = args.page_size
            with lock:
                served[0] += 1
                hit = 0
                keys = [tuple(ids[:k + ps]) for k in range(0, len(ids) - ps + 1, ps)]
                for key in keys:
                    if key not in pages:
                        break
                    hit += ps
                hit = min(hit, (len(ids) - 1) // ps * ps)
                pages.update(keys)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                time.sleep(args.prefill_ms / 1000.0)
                for i in range(1, n + 1):
                    if i > 1:
                        time.sleep(args.decode_ms / 1000.0)
                    meta = {"prompt_tokens": len(ids), "completion_tokens": i, "cached_tokens": hit,
                            "weight_version": args.weight_version, "e2e_latency": 0.0}
                    self.wfile.write(b"data: " + json.dumps({"output_ids": [7] * i, "meta_info": meta}).encode()
                                     + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()


def started(*flags: str):
    """Start this double on a free loopback port (a context manager yielding its URL); it is
    stopped on exit.  ``flags``: its command-line options, e.g. ``"--decode-ms", "10"``."""
    import contextlib
    import subprocess
    import sys

    from sglang_hydra.jobs.engine_client import get_json
    from sglang_hydra.utils.ports import free_port

    @contextlib.contextmanager
    def run():
        port = free_port()
        proc = subprocess.Popen([sys.executable, __file__, "--port", str(port), *flags])
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    get_json(url, "/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            proc.wait(10)
    return run()
