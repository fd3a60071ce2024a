#!/usr/bin/env python
"""Host <-> device KV page transfer benchmark, every layout × io backend.

For each layout and io backend: back up N random device pages to N random host pages
(all layers in one call) and load them back (one call per layer, as load-back does), and
report GB/s plus the ratio to the ceiling measured in the same run on the same number of
bytes: on CPU a contiguous ``torch`` copy, on CUDA a pinned-host <-> device ``cudaMemcpy``
(``Tensor.copy_``) in the same direction.  Medians of ``--reps`` repetitions.

    python scripts/bench_transfer.py                      # CPU, direct (+ kernel fallback rows)
    python scripts/bench_transfer.py --device cuda        # GPU: kernel vs pinned cudaMemcpy
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


def timed(fn, dev, reps, warmup=1):
    for _ in range(warmup):
        fn()
    sync(dev)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def ceiling(nbytes, dev, reps, direction):
    """Seconds for one contiguous copy of ``nbytes`` (same direction on CUDA)."""
    if dev.type == "cuda":
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        host.fill_(1)
        gpu.fill_(2)
        if direction == "load":
            return timed(lambda: gpu.copy_(host, non_blocking=True), dev, reps)
        return timed(lambda: host.copy_(gpu, non_blocking=True), dev, reps)
    a = torch.empty(nbytes, dtype=torch.uint8)
    b = torch.empty(nbytes, dtype=torch.uint8)
    a.fill_(1)
    b.fill_(2)
    return timed(lambda: b.copy_(a), dev, reps)


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
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch default)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    from rich.console import Console
    from rich.table import Table

    console = Console(width=200)
    table = Table(title=f"KV page transfer on {dev.type} ({torch.get_num_threads()} threads): "
                        f"{args.pages} random pages, L={args.layers} H={args.kv_heads} D={args.head_dim} "
                        f"{args.dtype}/{args.kv_cache_dtype}, median of {args.reps}")
    for col in ("page", "layout", "io", "MB/call", "backup GB/s", "x ceil", "load GB/s", "x ceil", "ceiling GB/s (b/l)"):
        table.add_column(col, justify="right" if col not in ("layout", "io") else "left")
    notes = set()
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
        nbytes = n * geo.bytes_per_page
        ceil_b = nbytes / ceiling(nbytes, dev, args.reps, "backup") / 1e9
        ceil_l = nbytes / ceiling(nbytes, dev, args.reps, "load") / 1e9
        for layout in args.layouts.split(","):
            hpool = HostKVPool(geo, layout, ps * n * 2, pin_memory=dev.type == "cuda")
            for io in args.io.split(","):
                eff, note = effective_io(io, str(dev))
                if note and eff != io:
                    notes.add(note)
                x = make_transfer(dpool, hpool, io, eff, note)
                hp = torch.randperm(hpool.page_num, generator=gen)[:n]
                dp = torch.randperm(dpool.num_pages, generator=gen)[:n] + 1
                tb = timed(lambda: x.backup(hp, dp), dev, args.reps)
                tl_ = timed(lambda: [x.load(hp, dp, layer=l) for l in range(geo.layers)], dev, args.reps)
                # correctness spot check: what went out comes back
                raw = {k: dpool.canonical(k).view(torch.uint8) for k in dpool.buffers}  # bytes: NaN-safe
                ref = {k: raw[k][:, dp].clone() for k in raw}
                x.backup(hp, dp)
                for k in dpool.buffers:
                    dpool.canonical(k)[:, dp] = 0
                x.load(hp, dp)
                sync(dev)
                ok = all(torch.equal(raw[k][:, dp], ref[k]) for k in raw)
                gb_b, gb_l = nbytes / tb / 1e9, nbytes / tl_ / 1e9
                io_txt = io if eff == io else f"{io}->{eff}"
                table.add_row(str(ps), layout, io_txt + ("" if ok else " MISMATCH"), f"{nbytes / 1e6:.1f}",
                              f"{gb_b:.2f}", f"{gb_b / ceil_b:.2f}", f"{gb_l:.2f}", f"{gb_l / ceil_l:.2f}",
                              f"{ceil_b:.1f}/{ceil_l:.1f}")
            hpool.close()
        dpool.close()
    console.print(table)
    for n_ in sorted(notes):
        console.print(f"note: {n_}")


if __name__ == "__main__":
    main()
