import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def mooncake_importable() -> bool:
    from sglang_hydra.disagg.backends.mooncake import mooncake_available
    return mooncake_available()


def nixl_importable() -> bool:
    from sglang_hydra.disagg.backends.nixl import nixl_available
    return nixl_available()


# Every real backend that imports here runs the shared transfer and fault tests.
BACKENDS = ["zmq"] + (["mooncake"] if mooncake_importable() else []) + (["nixl"] if nixl_importable() else [])


@pytest.fixture
def fast_env(monkeypatch):
    """Short timeouts under the reference's variable names, so failures surface in seconds."""
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "0.2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "15")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "15")
    monkeypatch.setenv("SGLANG_HYDRA_DISAGG_BOOTSTRAP_RETRIES", "3")
    monkeypatch.setenv("SGLANG_HYDRA_DISAGG_BOOTSTRAP_BACKOFF", "0.05")
    monkeypatch.setenv("SGLANG_HYDRA_DISAGG_BOOTSTRAP_HTTP_TIMEOUT", "1.0")
    monkeypatch.setenv("SGLANG_HYDRA_DISAGG_PREFILL_SEND_TIMEOUT", "2")
    return monkeypatch


@pytest.fixture
def server():
    """A bootstrap server on a free 127.0.0.1 port, closed after the test."""
    from sglang_hydra.disagg.bootstrap import BootstrapServer
    s = BootstrapServer("127.0.0.1", 0)
    yield s
    s.close()


def http_call(method, url, body=None, headers=None, timeout=5.0):
    """(status, body text) of one HTTP request; an error status is returned, not raised."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def make_rec(backend="zmq", mode="null", checksum=False, **kw):
    from sglang_hydra.config.testing import make_record
    # no decode retraction backup: its host pool is sized from the machine's live free memory,
    # which a test must not depend on (the transfer itself never touches it)
    fields = dict(disaggregation_mode=mode, disaggregation_transfer_backend=backend, page_size=16,
                  max_total_tokens=4096, disaggregation_enable_kv_checksum=checksum,
                  disaggregation_decode_retraction_backup="none")
    fields.update(kw)
    return make_record(**fields)


class Peer:
    """A peer process started from tests/disagg/peer.py; always killed by the test's finally."""

    def __init__(self, *args, env=None, ready_timeout=30.0):
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "peer.py"), *args], cwd=ROOT, env=e,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.ready_timeout = ready_timeout
        self.ready = None

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, tag: str, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"peer did not print {tag} within {timeout}s (rc={self.proc.poll()})")
            try:
                line = self.lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    raise RuntimeError(f"peer exited with {self.proc.returncode} before {tag}")
                continue
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def peers():
    started = []

    def start(*args, **kw):
        p = Peer(*args, **kw)
        started.append(p)
        p.ready = p.expect("READY", p.ready_timeout)
        return p

    yield start
    for p in started:
        p.kill()
