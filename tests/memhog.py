"""Occupy real host memory in a child process while a test runs.

Sizing must not depend on what else holds memory right now.  ``hold_memory(12 * GiB)``
starts a child that maps the bytes and writes one byte per page (so the kernel really
backs them: they show up in the child's RSS and leave MemAvailable), waits until that is
done, and stops the child on exit.  When less is free than asked for, it holds what it
safely can (leaving ``margin`` for the test itself) and says so with a warning and in
``Hog.note``: the test still runs, it is never skipped silently.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import warnings
from dataclasses import dataclass

from sglang_hydra.memory.hostmem import meminfo_available_bytes
from sglang_hydra.utils.procs import stop_process

GiB = 1024 ** 3
PAGE = 4096

_CHILD = r"""
import mmap, sys
n = int(sys.argv[1])
m = mmap.mmap(-1, max(n, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
step = 1 << 30
for start in range(0, n, step):          # one byte per page, a GiB at a time
    end = min(n, start + step)
    count = len(range(start, end, 4096))
    m[start:end:4096] = b"\x01" * count
sys.stdout.write("ready\n"); sys.stdout.flush()
sys.stdin.read()                          # hold until the parent closes stdin or stops us
"""


@dataclass
class Hog:
    requested: int
    held: int
    pid: int
    note: str = ""

    def rss_bytes(self) -> int:
        """The child's resident memory now (what it really holds)."""
        with open(f"/proc/{self.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


@contextlib.contextmanager
def hold_memory(nbytes: int, *, margin: int = 3 * GiB, timeout: float = 120.0):
    """Hold ``nbytes`` (fewer if that much is not free, with a warning) for the ``with`` body."""
    free = meminfo_available_bytes()
    held = max(0, min(int(nbytes), free - margin))
    held -= held % PAGE
    note = ""
    if held < nbytes:
        note = (f"memhog: asked to hold {nbytes / GiB:.1f} GiB but only {free / GiB:.1f} GiB is available; "
                f"holding {held / GiB:.1f} GiB (keeping {margin / GiB:.0f} GiB for the test)")
        warnings.warn(note, stacklevel=3)
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(held)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        import select
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        if ready:
            line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"memhog child did not come up holding {held / GiB:.1f} GiB (exit {proc.poll()})")
        yield Hog(int(nbytes), held, proc.pid, note)
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
        stop_process(proc)
