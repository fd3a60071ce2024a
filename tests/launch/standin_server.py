"""A stand-in for ``python -m sglang.launch_server`` so the launch supervision runs without GPUs.

It accepts the same command line (unknown flags are ignored), binds ``--host``/``--port`` (and, on
the prefill side, the bootstrap port too, so port clashes are real), answers ``/health`` and
records what it was given and what it served under ``$STANDIN_RECORD_DIR`` (one JSON-lines file per
role).  ``/generate``-style POSTs are answered with a small JSON completion, so a request can go
through a real ``sglang-router``.

Behaviour per role, from ``STANDIN_MODES="prefill=hang,decode=crash"`` (role ``server`` when no
``--disaggregation-mode`` is given; unnamed roles are ``healthy``):

* ``healthy``: healthy at once, serves until SIGTERM/SIGINT, then exits 0;
* ``slow``: answers 503 on /health for ``STANDIN_SLOW_S`` seconds first (default 1.0);
* ``hang``: binds the port but never becomes healthy;
* ``crash``: becomes healthy, then exits with ``STANDIN_CRASH_CODE`` (default 3) once the file
  ``STANDIN_CRASH_FILE`` exists (or, without it, after ``STANDIN_CRASH_AFTER_S`` seconds, default 0.3);
* ``stubborn``: healthy, but ignores SIGTERM and SIGINT (only SIGKILL ends it).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _args(argv):
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--disaggregation-mode", default="null")
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    p.add_argument("--model-path", default=None)
    known, _ = p.parse_known_args(argv)
    return known


def _modes() -> dict:
    out = {}
    for part in os.environ.get("STANDIN_MODES", "").split(","):
        if "=" in part:
            role, mode = part.split("=", 1)
            out[role.strip()] = mode.strip()
    return out


class _Recorder:
    def __init__(self, role: str):
        d = os.environ.get("STANDIN_RECORD_DIR")
        self.path = os.path.join(d, f"{role}.jsonl") if d else None
        self.lock = threading.Lock()

    def write(self, **event) -> None:
        if not self.path:
            return
        with self.lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(event) + "\n")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _args(argv)
    role = args.disaggregation_mode if args.disaggregation_mode != "null" else "server"
    mode = _modes().get(role, "healthy")
    rec = _Recorder(role)
    started = time.monotonic()
    stop = threading.Event()

    def on_signal(signum, _frame):
        rec.write(event="signal", signum=signum)
        stop.set()

    # before anything is recorded or served: a stop request never finds the defaults in place
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN if mode == "stubborn" else on_signal)
    slow_s = float(os.environ.get("STANDIN_SLOW_S", "1.0"))

    def healthy() -> bool:
        if mode == "hang":
            return False
        if mode == "slow":
            return time.monotonic() - started >= slow_s
        return True

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # one line per request on stdout, like a server log
            print(f"{role} {getattr(self, 'command', '?')} {getattr(self, 'path', '?')} {fmt % a}", flush=True)

        def _reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path.startswith("/health"):
                self._reply(200 if healthy() else 503, {"ok": healthy()})
            else:
                self._reply(200, {"role": role, "model_path": args.model_path})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {"raw": raw.decode("latin-1")}
            rec.write(event="request", path=self.path, body=body, port=args.port)
            self._reply(200, {"text": f"from {role}", "role": role,
                              "meta_info": {"id": "standin", "finish_reason": {"type": "stop"},
                                            "prompt_tokens": 1, "completion_tokens": 1}})

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    extra = []
    if role == "prefill":  # the bootstrap server lives on the prefill side
        extra.append(ThreadingHTTPServer((args.host, args.disaggregation_bootstrap_port), Handler))
    rec.write(event="start", argv=argv, pid=os.getpid(), mode=mode, port=args.port)
    print(f"standin {role} ({mode}) listening on {args.host}:{args.port}", flush=True)

    for s in [server] + extra:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    if mode == "crash":
        trigger = os.environ.get("STANDIN_CRASH_FILE")
        if trigger:                  # crash when the test says so (deterministic)
            while not os.path.exists(trigger):
                time.sleep(0.05)
        else:
            time.sleep(float(os.environ.get("STANDIN_CRASH_AFTER_S", "0.3")))
        code = int(os.environ.get("STANDIN_CRASH_CODE", "3"))
        print(f"standin {role}: crashing with status {code}", file=sys.stderr, flush=True)
        rec.write(event="crash", code=code)
        os._exit(code)
    while not stop.wait(0.1):
        pass
    for s in [server] + extra:
        s.shutdown()
        s.server_close()
    rec.write(event="exit", code=0)
    return 0


if __name__ == "__main__":
    socket.setdefaulttimeout(10)
    sys.exit(main())
