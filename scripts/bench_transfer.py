#!/usr/bin/env python
"""Host <-> device KV page transfer benchmark, every layout × io backend.

For each layout and io backend: back up N random device pages to N random host pages
(all layers in one call) and load them back (one call per layer, as load-back does), and
report GB/s plus the ratio to the ceiling on the same number of bytes: on CPU one
contiguous ``torch`` copy, on CUDA a pinned-host <-> device ``cudaMemcpy``
(``Tensor.copy_``) in the same direction.  The ceiling is re-measured around every
repetition (ceiling, candidate, ceiling, ...) and each repetition's ratio uses the mean of
the ceilings just before and just after it, so load from other processes hits both sides
alike; the table shows medians over ``--reps``.  All buffers (ceiling and pools) are
allocated and touched before any timing, and one untimed warm-up call precedes each series.
``--threads 1,2`` repeats the whole table per torch CPU thread count (ceiling and
candidates always run with the same count).

    python scripts/bench_transfer.py                      # CPU, direct (+ kernel fallback rows)
    python scripts/bench_transfer.py --threads 1,2        # CPU, one table per thread count
    python scripts/bench_transfer.py --device cuda        # GPU: kernel vs pinned cudaMemcpy

Exits 1 when any row fails its round-trip check (``MISMATCH``), so scripts can rely on it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from sglang_hydra.config.testing import make_record  # noqa: E402
from sglang_hydra.memory.build import make_transfer  # noqa: E402
from sglang_hydra.memory.device_pool import DeviceKVPool  # noqa: E402
from sglang_hydra.memory.geometry import kv_geometry  # noqa: E402
from sglang_hydra.memory.host_pool import HostKVPool  # noqa: E402
from sglang_hydra.memory.plan import effective_io  # noqa: E402

MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _clock(fn, dev):
    t0 = time.perf_counter()
    fn()
    sync(dev)
    return time.perf_counter() - t0


def timed(fn, dev, reps, warmup=1):
    for _ in range(warmup):
        fn()
    sync(dev)
    return statistics.median(_clock(fn, dev) for _ in range(reps))


class Ceiling:
    """One contiguous copy of ``nbytes`` in ``direction`` (buffers made and touched once)."""

    def __init__(self, nbytes, dev, direction):
        self.dev = dev
        if dev.type == "cuda":
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            host.fill_(1)
            gpu.fill_(2)
            if direction == "load":
                self.fn = lambda: gpu.copy_(host, non_blocking=True)
            else:
                self.fn = lambda: host.copy_(gpu, non_blocking=True)
        else:
            a = torch.empty(nbytes, dtype=torch.uint8)
            b = torch.empty(nbytes, dtype=torch.uint8)
            a.fill_(1)
            b.fill_(2)
            self.fn = lambda: b.copy_(a)
        self.fn()
        sync(dev)

    def seconds(self):
        return _clock(self.fn, self.dev)


def paired(fn, ceil: Ceiling, dev, reps, warmup=1):
    """(median seconds of ``fn``, median ceiling seconds, median per-rep ratio ceiling/fn).

    Order: ceiling, fn, ceiling, fn, ..., ceiling; rep i is compared with the mean of the
    ceilings measured just before and just after it."""
    for _ in range(warmup):
        fn()
    sync(dev)
    cs = [ceil.seconds()]
    ts = []
    for _ in range(reps):
        ts.append(_clock(fn, dev))
        cs.append(ceil.seconds())
    ratios = [(cs[i] + cs[i + 1]) / 2 / ts[i] for i in range(reps)]
    return statistics.median(ts), statistics.median(cs), statistics.median(ratios)


def pick_pages(pattern, n, host_pages, device_pages, gen):
    """(host page ids, device page ids) for ``pattern``; device page 0 (padding) unused."""
    if pattern == "random":
        return (torch.randperm(host_pages, generator=gen)[:n],
                torch.randperm(device_pages, generator=gen)[:n] + 1)
    h0 = int(torch.randint(0, host_pages - n + 1, (1,), generator=gen))
    hp = torch.arange(h0, h0 + n)
    if pattern == "host-run":     # what the host free list hands out; device pages scattered
        return hp, torch.randperm(device_pages, generator=gen)[:n] + 1
    d0 = int(torch.randint(1, device_pages - n + 2, (1,), generator=gen))
    return hp, torch.arange(d0, d0 + n)


def run_table(args, dev, console):
    from rich.table import Table

    table = Table(title=f"KV page transfer on {dev.type} ({torch.get_num_threads()} threads): "
                        f"{args.pages} {args.pattern} pages, L={args.layers} H={args.kv_heads} D={args.head_dim} "
                        f"{args.dtype}/{args.kv_cache_dtype}, median of {args.reps} paired reps")
    for col in ("page", "layout", "io", "MB/call", "backup GB/s", "x ceil", "load GB/s", "x ceil", "ceiling GB/s (b/l)"):
        table.add_column(col, justify="right" if col not in ("layout", "io") else "left")
    notes = set()
    mismatches = 0
    gen = torch.Generator().manual_seed(0)
    for ps in [int(x) for x in args.page_sizes.split(",")]:
        rec = make_record(page_size=ps, num_hidden_layers=args.layers, num_key_value_heads=args.kv_heads,
                          head_dim=args.head_dim, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
                          max_total_tokens=ps * args.pages * 2, device=dev.type)
        geo = kv_geometry(rec)
        n = args.pages
        dpool = DeviceKVPool(geo, ps * n * 2, dev)
        for buf in dpool.buffers.values():
            buf.view(torch.uint8).copy_(torch.randint(0, 256, buf.view(torch.uint8).shape, dtype=torch.uint8,
                                                      generator=gen).to(dev))
        nbytes = n * geo.bytes_per_page   # bytes one backup (all layers) or one full load moves
        ceil_b = Ceiling(nbytes, dev, "backup")
        ceil_l = Ceiling(nbytes, dev, "load")
        for layout in args.layouts.split(","):
            hpool = HostKVPool(geo, layout, ps * n * 2, pin_memory=dev.type == "cuda")
            for io in args.io.split(","):
                eff, note = effective_io(io, str(dev))
                if note and eff != io:
                    notes.add(note)
                x = make_transfer(dpool, hpool, io, eff, note)
                hp, dp = pick_pages(args.pattern, n, hpool.page_num, dpool.num_pages, gen)
                tb, cb, rb = paired(lambda: x.backup(hp, dp), ceil_b, dev, args.reps)
                tl_, cl, rl = paired(lambda: [x.load(hp, dp, layer=l) for l in range(geo.layers)], ceil_l, dev,
                                     args.reps)
                # correctness spot check: what went out comes back
                raw = {k: dpool.canonical(k).view(torch.uint8) for k in dpool.buffers}  # bytes: NaN-safe
                ref = {k: raw[k][:, dp].clone() for k in raw}
                x.backup(hp, dp)
                for k in dpool.buffers:
                    dpool.canonical(k)[:, dp] = 0
                x.load(hp, dp)
                sync(dev)
                ok = all(torch.equal(raw[k][:, dp], ref[k]) for k in raw)
                mismatches += not ok
                io_txt = io if eff == io else f"{io}->{eff}"
                table.add_row(str(ps), layout, io_txt + ("" if ok else " MISMATCH"), f"{nbytes / 1e6:.1f}",
                              f"{nbytes / tb / 1e9:.2f}", f"{rb:.2f}", f"{nbytes / tl_ / 1e9:.2f}", f"{rl:.2f}",
                              f"{nbytes / cb / 1e9:.1f}/{nbytes / cl / 1e9:.1f}")
            hpool.close()
        dpool.close()
        del ceil_b, ceil_l
    console.print(table)
    for n_ in sorted(notes):
        console.print(f"note: {n_}")
    return mismatches


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--pages", type=int, default=256, help="pages moved per call")
    ap.add_argument("--page-sizes", default="16,64,128")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--layouts", default=",".join(MHA_LAYOUTS))
    ap.add_argument("--io", default="direct,kernel")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pattern", default="random", choices=["random", "host-run", "contiguous"],
                    help="page ids: both random; host a consecutive run, device random; both consecutive")
    ap.add_argument("--threads", default="0",
                    help="torch CPU threads, comma list: one table per count (0: torch default)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    from rich.console import Console

    console = Console(width=200)
    mismatches = 0
    for nt in [int(x) for x in str(args.threads).split(",")]:
        if nt:
            torch.set_num_threads(nt)
        mismatches += run_table(args, dev, console)
    if mismatches:
        console.print(f"FAILED: {mismatches} layout/io rows did not round-trip bit for bit (MISMATCH rows)")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
