#!/usr/bin/env python
"""The best raw loopback copy on this machine: plain memcpy between two processes via shared memory.

A backend's own ceiling (its bytes moved as one big request) says how close the paged requests
come to what *that backend* can do; this number says how close any of them comes to what the
machine can do at all. Two ways of crossing from one process to another are timed:

* **direct** (one memcpy per byte, like a one-sided write): the writer copies its source buffer
  chunk by chunk straight into a shared segment that *is* the reader's destination; the
  reader only waits until the last chunk is visible;
* **ring** (two memcpys per byte, like a socket): the writer copies into a ring of shared
  slots, the reader copies each slot out into its own buffer, the two overlapping.

Every buffer is touched before timing (a warm-up round), so no first-write page faults are
counted. The best repeat of the best shape is the ceiling.

    .venv/bin/python scripts/loopback_ceiling.py                  # 256 MiB, 3 repeats
    .venv/bin/python scripts/loopback_ceiling.py --total-mib 64 --repeats 2 --json

From Python: ``from loopback_ceiling import loopback_ceiling; loopback_ceiling(64 << 20)["gbps"]``
(``scripts/`` on ``sys.path``).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time
from multiprocessing import shared_memory
from typing import Dict, List, Sequence, Tuple

import numpy as np

MiB = 1 << 20
# (chunk bytes, slots): slots 0 = direct into the destination; else a ring (chunk 0 = the whole buffer)
SHAPES: Tuple[Tuple[int, int], ...] = ((16 * MiB, 0), (4 * MiB, 0), (0, 1), (4 * MiB, 4), (1 * MiB, 8))


def _span(chunk: int, slots: int, total: int) -> int:
    return total if slots == 0 else slots * chunk


def _writer(shm_name: str, total: int, chunk: int, slots: int, rounds: int, empty, full, go) -> None:
    shm = shared_memory.SharedMemory(name=shm_name)
    try:
        ring = np.ndarray((_span(chunk, slots, total),), dtype=np.uint8, buffer=shm.buf)
        src = np.full(total, 7, dtype=np.uint8)
        for _ in range(rounds):
            go.wait()
            go.clear()
            for i, off in enumerate(range(0, total, chunk)):
                n = min(chunk, total - off)
                empty.acquire()
                s = off if slots == 0 else (i % slots) * chunk
                np.copyto(ring[s:s + n], src[off:off + n])
                full.release()
        del ring
    finally:
        shm.close()


def rounds_of(repeats: int) -> int:
    return repeats + 1          # the first round is a warm-up (touches every page on both sides)


def _one_shape(total: int, chunk: int, slots: int, repeats: int, timeout: float) -> List[float]:
    chunk = min(chunk or total, total)
    ctx = mp.get_context("spawn")
    shm = shared_memory.SharedMemory(create=True, size=_span(chunk, slots, total))
    # direct: the writer never waits for the reader (nothing is reused)
    empty, full, go = ctx.Semaphore(slots or (total // chunk + 1) * rounds_of(repeats)), ctx.Semaphore(0), ctx.Event()
    rounds = rounds_of(repeats)
    proc = ctx.Process(target=_writer, args=(shm.name, total, chunk, slots, rounds, empty, full, go), daemon=True)
    proc.start()
    out: List[float] = []
    try:
        ring = np.ndarray((_span(chunk, slots, total),), dtype=np.uint8, buffer=shm.buf)
        ring[:] = 0
        dst = ring if slots == 0 else np.zeros(total, dtype=np.uint8)
        for r in range(rounds):
            t0 = time.perf_counter()
            go.set()
            for i, off in enumerate(range(0, total, chunk)):
                n = min(chunk, total - off)
                if not full.acquire(timeout=timeout):
                    raise TimeoutError(f"loopback writer stalled (chunk {chunk}, slots {slots})")
                if slots:
                    s = (i % slots) * chunk
                    np.copyto(dst[off:off + n], ring[s:s + n])
                empty.release()
            elapsed = time.perf_counter() - t0
            if r:
                out.append(total / elapsed / 1e9)
            if slots == 0 and r < rounds - 1:
                dst[:] = 0   # the next round must write it again (still touched)
        if dst[-1] != 7:
            raise RuntimeError("loopback copy did not deliver the data")
        del ring
    finally:
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        shm.close()
        shm.unlink()
    return out


def loopback_ceiling(total_bytes: int = 256 * MiB, repeats: int = 3, shapes: Sequence[Tuple[int, int]] = SHAPES,
                     timeout: float = 60.0) -> Dict[str, object]:
    """Best GB/s of a process-to-process copy of ``total_bytes`` through shared memory.

    Returns ``{"gbps": best, "shape": (chunk, slots) of the best, "runs": {shape label: [GB/s...]}}``.
    """
    runs: Dict[str, List[float]] = {}
    best, best_shape = 0.0, None
    for chunk, slots in shapes:
        label = (f"direct {chunk // MiB} MiB" if slots == 0
                 else f"ring {'whole' if not chunk else f'{chunk // MiB} MiB'} x {slots}")
        runs[label] = [round(x, 3) for x in _one_shape(total_bytes, chunk, slots, repeats, timeout)]
        top = max(runs[label])
        if top > best:
            best, best_shape = top, label
    return {"gbps": best, "shape": best_shape, "total_bytes": total_bytes, "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    res = loopback_ceiling(a.total_mib * MiB, a.repeats)
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        for label, v in res["runs"].items():
            print(f"{label:20s} GB/s per repeat {v}")
        print(f"loopback ceiling: {res['gbps']:.2f} GB/s ({res['shape']}, {a.total_mib} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
