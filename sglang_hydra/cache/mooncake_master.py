"""Processes around the ``mooncake`` storage backend: a ``mooncake_master`` on a free
loopback port, an optional process that holds the pool memory (segment holder), and the CLI
``python -m sglang_hydra.cache.mooncake_master --serve``.

Kept apart from the backend (:mod:`sglang_hydra.cache.storage_mooncake`), which only talks
to a running master; this module imports the backend's helpers, never the other way round.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Optional, Sequence

from ..utils.ports import free_port
from ..utils.procs import stop_process
from .storage import StorageError
from .storage_mooncake import master_binary, parse_segment_size

__all__ = ["MooncakeMaster", "main"]


# ------------------------------------------------------------------------------ master helper
def _die_with_parent():   # runs in the child between fork and exec (Linux)
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except Exception:
        pass


def _port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


class MooncakeMaster:
    """A ``mooncake_master`` on a free loopback port, optionally with a process holding pool memory.

    ``with MooncakeMaster(segment_size=...) as m: ...`` starts the master (and, when
    ``segment_size`` > 0, a small "holder" process that mounts that much memory, so clients can run
    with ``global_segment_size=0`` and the data outlives them); both are stopped on exit and die
    with this process (``PR_SET_PDEATHSIG``; Linux sends it when the *thread* that started them
    exits, so start from a long-lived thread). ``m.address`` is the ``MOONCAKE_MASTER`` value,
    ``m.extra_config()`` a ready ``hicache_storage_backend_extra_config`` dict.
    """

    def __init__(self, port: int = 0, host: str = "127.0.0.1", segment_size: int = 0,
                 lease_ttl_ms: Optional[int] = None, eviction_high_watermark_ratio: Optional[float] = None,
                 eviction_ratio: Optional[float] = None, extra_args: Sequence[str] = (),
                 startup_timeout: float = 15.0, log_dir: Optional[str] = None, keep_log: bool = False):
        self.host, self.port = host, int(port)
        self.segment_size = parse_segment_size(segment_size)
        self.lease_ttl_ms, self.extra_args = lease_ttl_ms, list(extra_args)
        self.hwm, self.eviction_ratio = eviction_high_watermark_ratio, eviction_ratio
        self.startup_timeout = startup_timeout
        self.log_dir, self.keep_log = log_dir, keep_log
        self.proc: Optional[subprocess.Popen] = None
        self.holder: Optional[subprocess.Popen] = None
        self.log_path = ""
        self.startup_seconds = 0.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def extra_config(self, **kw) -> Dict[str, Any]:
        cfg = {"master_server_address": self.address, "protocol": "tcp", "local_hostname": self.host,
               "metadata_server": "P2PHANDSHAKE"}
        cfg.update(kw)
        return cfg

    def _log_tail(self, n: int = 15) -> str:
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return ""

    def start(self) -> "MooncakeMaster":
        binary = master_binary()
        t0 = time.perf_counter()
        fd, self.log_path = tempfile.mkstemp(prefix="mooncake_master_", suffix=".log", dir=self.log_dir)
        os.close(fd)
        for attempt in range(3):
            port = self.port or free_port(self.host)
            args = [binary, f"--rpc_port={port}", f"--rpc_address={self.host}",
                    f"--metrics_port={free_port(self.host)}", f"--metrics_host={self.host}",
                    "--enable_metric_reporting=false"]
            if self.lease_ttl_ms is not None:
                args.append(f"--default_kv_lease_ttl={int(self.lease_ttl_ms)}")
            if self.hwm is not None:
                args.append(f"--eviction_high_watermark_ratio={self.hwm}")
            if self.eviction_ratio is not None:
                args.append(f"--eviction_ratio={self.eviction_ratio}")
            args += self.extra_args
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         preexec_fn=_die_with_parent)
            log.close()
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline and self.proc.poll() is None and not _port_open(self.host, port):
                time.sleep(0.02)
            if self.proc.poll() is None and _port_open(self.host, port):
                self.port = port
                break
            stop_process(self.proc, grace_s=5.0)
            self.proc = None
            if self.port:         # a fixed port: do not retry elsewhere
                break
        if self.proc is None:
            raise StorageError(f"mooncake_master did not start on {self.host}:{self.port or '(free port)'}; "
                               f"log {self.log_path}:\n{self._log_tail()}")
        try:
            if self.segment_size > 0:
                self._start_holder()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - t0
        return self

    def _start_holder(self) -> None:
        cmd = [sys.executable, "-c", _HOLDER, self.address, str(self.segment_size), self.host]
        log = open(self.log_path, "ab")
        env = dict(os.environ)
        env.setdefault("MC_LOG_LEVEL", "WARNING")
        self.holder = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                       env=env, preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + self.startup_timeout + 10
        line = b""
        while time.monotonic() < deadline and self.holder.poll() is None:
            r, _, _ = select.select([self.holder.stdout], [], [], 0.1)
            if r:
                line = self.holder.stdout.readline()
                break
        if not line.startswith(b"READY"):
            raise StorageError(f"the Mooncake segment holder did not come up ({line.decode(errors='replace').strip()}); "
                               f"log {self.log_path}:\n{self._log_tail()}")

    def stop(self) -> None:
        if self.holder is not None and self.holder.poll() is None:
            self.holder.kill()      # the pool goes with the master; no clean unmount needed
            self.holder.wait(5)
        if self.holder is not None and self.holder.stdout:
            self.holder.stdout.close()
        self.holder = None
        stop_process(self.proc, grace_s=5.0)
        self.proc = None
        if self.log_path and not self.keep_log:
            try:
                os.remove(self.log_path)
            except OSError:
                pass

    def __enter__(self) -> "MooncakeMaster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


#: the pool-holder process: mounts a segment, prints READY, unmounts on SIGTERM/SIGINT (no torch import)
_HOLDER = r"""
import os, signal, sys, threading
from mooncake.store import MooncakeDistributedStore
master, size, host = sys.argv[1], int(sys.argv[2]), sys.argv[3]
st = MooncakeDistributedStore()
rc = st.setup(host, "P2PHANDSHAKE", size, 16 << 20, "tcp", "", master)
if rc != 0:
    print("FAILED setup rc=%d" % rc, flush=True)
    sys.exit(1)
stop = threading.Event()
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
print("READY", flush=True)
while not stop.wait(0.5):
    pass
st.close()
os._exit(0)
"""


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_hydra.cache.mooncake_master",
                                 description="Run a Mooncake master for the 'mooncake' HiCache storage backend.")
    ap.add_argument("--serve", action="store_true", help="start a master (and a pool holder) until Ctrl-C")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="master RPC port (0: a free one)")
    ap.add_argument("--segment-size", default="0",
                    help="bytes of pool memory held by a separate process (e.g. 1gb); 0: clients bring their own")
    ap.add_argument("--lease-ttl-ms", type=int, default=None)
    a = ap.parse_args(argv)
    if not a.serve:
        ap.print_help()
        return 2
    with MooncakeMaster(port=a.port, host=a.host, segment_size=a.segment_size, lease_ttl_ms=a.lease_ttl_ms,
                        keep_log=True) as m:
        seg = 0 if m.segment_size else "1gb"
        print(f"mooncake master on {m.address} (log {m.log_path})", flush=True)
        print(f"  export MOONCAKE_MASTER={m.address} MOONCAKE_PROTOCOL=tcp MOONCAKE_GLOBAL_SEGMENT_SIZE={seg}")
        print(f"  or hicache_storage_backend_extra_config='{json.dumps(m.extra_config(global_segment_size=seg))}'",
              flush=True)
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(0.5):
            if m.proc is None or m.proc.poll() is not None:
                print("mooncake_master exited", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
