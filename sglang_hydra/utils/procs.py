"""Stopping child processes: politely first, then for sure, never waiting forever.

Works for ``subprocess.Popen`` and ``multiprocessing.Process`` alike.
"""
from __future__ import annotations

import subprocess
from typing import Any, Iterable, Optional


def _alive(proc: Any) -> bool:
    if isinstance(proc, subprocess.Popen):
        return proc.poll() is None
    return bool(proc.is_alive())


def _wait(proc: Any, timeout: float) -> None:
    if isinstance(proc, subprocess.Popen):
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    else:
        proc.join(timeout)


def stop_process(proc: Optional[Any], grace_s: float = 3.0) -> None:
    """terminate(), wait up to ``grace_s``, then kill() and reap."""
    if proc is None or not _alive(proc):
        if proc is not None:
            _wait(proc, 0.1)
        return
    proc.terminate()
    _wait(proc, grace_s)
    if _alive(proc):
        proc.kill()
        _wait(proc, 5.0)


def stop_processes(procs: Iterable[Optional[Any]], grace_s: float = 3.0) -> None:
    """Signal all first, then wait, so N children take one grace period, not N."""
    procs = [p for p in procs if p is not None]
    for p in procs:
        if _alive(p):
            p.terminate()
    for p in procs:
        _wait(p, grace_s)
    for p in procs:
        stop_process(p, grace_s=0.0)
