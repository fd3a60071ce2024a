#!/usr/bin/env python
"""Benchmark PD KV transfer: 256 MiB moved as requests of 8 and 64 pages, per backend,
against the same backend moving one contiguous 256 MiB buffer (the ceiling) in the same run.

    .venv/bin/python scripts/bench_disagg.py                 # all available backends
    .venv/bin/python scripts/bench_disagg.py --backends zmq --repeats 1
    .venv/bin/python scripts/bench_disagg.py --markdown docs/benchmarks_disagg.md

Each configuration is a fresh prefill + decode process pair on 127.0.0.1 (``run_pair``), with
one warm-up request first. Throughput is bytes moved / (first metadata sent -> last request
done) on the decode side; latency is per request, metadata sent -> Success.
"""
from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from sglang_hydra.config.testing import make_record  # noqa: E402
from sglang_hydra.disagg.pd import KVGeometry, run_pair  # noqa: E402
from sglang_hydra.disagg.registry import backend_available  # noqa: E402

MiB = 1 << 20
# 8 layers x (K, V) x 8 KV heads x 64 dims x bf16, 16-token pages: 16 KiB per buffer, 256 KiB per page
PAGED = dict(num_layers=8, head_num=8, head_dim=64, page_size=16, dtype="bfloat16")


def _geometry_paged(pages_per_request: int, inflight: int) -> KVGeometry:
    return KVGeometry(num_pages=pages_per_request * inflight + 8, **PAGED)


def _geometry_ceiling(total: int) -> KVGeometry:
    # one buffer whose single page is the whole 256 MiB: one request moves it in one entry
    return KVGeometry(num_layers=1, head_num=1, head_dim=total // 2, page_size=1, num_pages=1,
                      dtype="bfloat16", reserve_page0=False, kv_split=False)


def bench_one(backend, geometry, requests, pages, inflight, timeout):
    rec = make_record(disaggregation_transfer_backend=backend, page_size=geometry.page_size)
    r = run_pair(rec, requests=requests, pages_per_request=pages, geometry=geometry, verify=False, fill=False,
                 warmup=1, max_inflight=inflight, timeout=timeout,
                 env={"SGLANG_HYDRA_DISAGG_LOG_LEVEL": "WARNING", "GLOG_minloglevel": "2"})
    if r.failed or r.errors:
        raise RuntimeError(f"{backend} pages={pages}: {r.failed} failed, errors={r.errors[:2]} {r.failures[:2]}")
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="zmq,mooncake")
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--pages", default="8,64")
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--markdown", default=None, help="also write the results table to this file")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    total = a.total_mib * MiB
    page_bytes = _geometry_paged(1, 1).bytes_per_page
    rows = []
    for backend in [b for b in a.backends.split(",") if b]:
        if not backend_available(backend):
            print(f"skip {backend}: not available here", flush=True)
            continue
        runs = {}
        for rep in range(a.repeats):
            c = bench_one(backend, _geometry_ceiling(total), 1, 1, 1, a.timeout)
            runs.setdefault("ceiling", []).append(c)
            for pages in [int(p) for p in a.pages.split(",")]:
                n = total // (pages * page_bytes)
                r = bench_one(backend, _geometry_paged(pages, a.inflight), n, pages, a.inflight, a.timeout)
                runs.setdefault(pages, []).append(r)
        ceil_gbps = statistics.median(r.gbps for r in runs["ceiling"])
        for key, rs in runs.items():
            g = statistics.median(r.gbps for r in rs)
            row = dict(backend=backend, shape="1 x 256 MiB contiguous" if key == "ceiling"
                       else f"{rs[0].requests} x {key} pages ({key * page_bytes // MiB} MiB)",
                       gbps=g, gbps_all=[round(r.gbps, 2) for r in rs],
                       p50=statistics.median(r.p50_ms for r in rs), p99=statistics.median(r.p99_ms for r in rs),
                       ratio=g / ceil_gbps, moved=rs[0].bytes_moved)
            rows.append(row)
            print(f"{backend:9s} {row['shape']:28s} {g:6.2f} GB/s (runs {row['gbps_all']})  "
                  f"P50 {row['p50']:8.2f} ms  P99 {row['p99']:8.2f} ms  {row['ratio']:.2f}x ceiling", flush=True)
    if a.markdown:
        lines = ["| backend | requests | GB/s (median) | runs | P50 ms | P99 ms | vs ceiling |",
                 "|---|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['backend']} | {r['shape']} | {r['gbps']:.2f} | {r['gbps_all']} | {r['p50']:.2f} | "
                         f"{r['p99']:.2f} | {r['ratio']:.2f}x |")
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"table written to {a.markdown}  ({platform.node()}, {os.cpu_count()} cpus, "
              f"{time.strftime('%Y-%m-%d')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
