"""Occupy real host memory in a child process while a test runs.

Sizing must not depend on what else holds memory right now.  ``hold_memory(12 * GiB)``
starts a child that maps the bytes and writes one byte per page (so the kernel really
backs them: they show up in the child's RSS and leave MemAvailable), waits until that is
done, and stops the child on exit.  It holds exactly what it is asked for or fails: when less
is available than ``nbytes`` plus ``margin`` (kept for the test itself), it raises
:class:`NotEnoughMemory` naming both figures, so a small runner fails loudly instead of running
the test under less pressure than its name claims.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
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


class NotEnoughMemory(RuntimeError):
    """The machine cannot hold what the test asked for (the test fails; it must not pass weaker)."""


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
    held = int(nbytes) - int(nbytes) % PAGE
    if free - margin < held:
        raise NotEnoughMemory(f"memhog: asked to hold {nbytes / GiB:.1f} GiB but only {free / GiB:.1f} GiB is "
                              f"available ({margin / GiB:.0f} GiB must stay free for the test); this test needs a "
                              f"machine with at least {(held + margin) / GiB:.1f} GiB available")
    note = ""
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
        hog = Hog(int(nbytes), held, proc.pid, note)
        if hog.rss_bytes() < held - 64 * PAGE:
            raise NotEnoughMemory(f"memhog: the child holds {hog.rss_bytes() / GiB:.2f} GiB resident, "
                                  f"not the {held / GiB:.2f} GiB asked for")
        yield hog
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass
        stop_process(proc)
