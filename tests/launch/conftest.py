"""Helpers for job=launch tests: the real CLI in a subprocess, stand-in servers, free loopback ports."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_hydra.utils.ports import free_port
from sglang_hydra.utils.procs import stop_process

HERE = Path(__file__).resolve().parent
STANDIN = ["job.server_module=standin_server"]


def router_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("sglang_router") is not None


class Launch:
    """One ``sglang-hydra ... job=launch`` run, its output files and the stand-ins it started."""

    def __init__(self, tmp_path: Path, args, modes: str = "", extra_env=None):
        self.dir = tmp_path
        self.records = tmp_path / "records"
        self.records.mkdir(exist_ok=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
                   STANDIN_RECORD_DIR=str(self.records), STANDIN_MODES=modes, PYTHONUNBUFFERED="1",
                   **(extra_env or {}))
        self.out_path, self.err_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        self._out, self._err = open(self.out_path, "wb"), open(self.err_path, "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "sglang_hydra", *args, "job=launch"], cwd=tmp_path,
                                     env=env, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL)

    @property
    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for_output(self, text: str, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.stdout:
            if self.proc.poll() is not None:
                raise AssertionError(f"launch ended ({self.proc.returncode}) before {text!r}:\n{self.stdout}\n{self.stderr}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout} s:\n{self.stdout}\n{self.stderr}")
            time.sleep(0.1)

    def wait(self, timeout: float = 90.0) -> int:
        return self.proc.wait(timeout=timeout)

    def events(self, role: str):
        path = self.records / f"{role}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def standin_pids(self):
        return [e["pid"] for p in self.records.glob("*.jsonl") for e in map(json.loads, p.read_text().splitlines())
                if e["event"] == "start"]

    def close(self) -> None:
        """Stop the launch and anything it left running (by the pids the stand-ins recorded)."""
        stop_process(self.proc, grace_s=10.0)
        for pid in self.standin_pids():
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self._out.close()
        self._err.close()


def pid_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.fixture
def launch(tmp_path):
    runs = []

    def start(args, modes: str = "", extra_env=None, name: str = "run"):
        d = tmp_path / name
        d.mkdir()
        run = Launch(d, list(args), modes, extra_env)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.close()


@pytest.fixture
def ports():
    """Distinct free loopback ports."""
    def take(n):
        out = set()
        while len(out) < n:
            out.add(free_port())
        return list(out)
    return take
