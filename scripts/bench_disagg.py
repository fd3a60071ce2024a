#!/usr/bin/env python
"""Benchmark PD KV transfer: 256 MiB moved as requests of 8 and 64 pages, per backend,
against the same backend moving one contiguous 256 MiB buffer (the ceiling) in the same run, and
against the machine's best raw loopback copy (``scripts/loopback_ceiling.py``: memcpy between two
processes through shared memory, measured once at start-up with the same total size).

    .venv/bin/python scripts/bench_disagg.py                 # all available backends
    .venv/bin/python scripts/bench_disagg.py --backends zmq --repeats 1
    .venv/bin/python scripts/bench_disagg.py --backends mooncake,mooncake-sync --repeats 3
    .venv/bin/python scripts/bench_disagg.py --markdown docs/benchmarks_disagg.md

``--engine-micro`` skips the PD layer and times the bare Mooncake engine between two processes
(256 MiB, registered host buffers, warm): the reference's ``batch_transfer_sync_write``, batches
posted with ``batch_transfer_async_write`` and waited for with ``get_batch_transfer_status``, and
single writes posted with ``transfer_submit_write`` and polled with ``transfer_check_status``.

``mooncake-sync`` is the mooncake backend with ``SGLANG_HYDRA_MOONCAKE_SYNC_BATCH=1``: one
``batch_transfer_sync_write`` per request, the reference's call, for comparison; its ceiling is
measured the same way. The ``ratio/run`` column divides each repeat's paged throughput by the
ceiling of the same repeat (measured right before it), which is less exposed to the load of a
shared machine than the ratio of the medians.

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
from sglang_hydra.disagg.workers import PlainBufferShape  # noqa: E402
from sglang_hydra.disagg.registry import backend_available  # noqa: E402
from sglang_hydra.jobs.pd_pair_processes import run_pair  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loopback_ceiling import loopback_ceiling  # noqa: E402

MiB = 1 << 20
# 8 layers x (K, V) x 8 KV heads x 64 dims x bf16, 16-token pages: 16 KiB per buffer, 256 KiB per page
PAGED = dict(num_layers=8, head_num=8, head_dim=64, page_size=16, dtype="bfloat16")


def _geometry_paged(pages_per_request: int, inflight: int) -> PlainBufferShape:
    return PlainBufferShape(num_pages=pages_per_request * inflight + 8, **PAGED)


def _geometry_ceiling(total: int) -> PlainBufferShape:
    # one buffer whose single page is the whole 256 MiB: one request moves it in one entry
    return PlainBufferShape(num_layers=1, head_num=1, head_dim=total // 2, page_size=1, num_pages=1,
                      dtype="bfloat16", reserve_page0=False, kv_split=False)


# label -> (backend, extra environment of both processes)
VARIANTS = {"mooncake-sync": ("mooncake", {"SGLANG_HYDRA_MOONCAKE_SYNC_BATCH": "1"})}
TUNABLES = ("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "MC_TCP_LANES_PER_PEER", "MC_TCP_SLICE_SIZE",
            "MC_TCP_ENABLE_CONNECTION_POOL", "SGLANG_MOONCAKE_MAX_TRANSFER_BATCH_INDICES",
            "SGLANG_HYDRA_DISAGG_MAX_INFLIGHT_TRANSFERS", "SGLANG_DISAGGREGATION_QUEUE_SIZE")


def bench_one(label, geometry, requests, pages, inflight, timeout):
    backend, extra = VARIANTS.get(label, (label, {}))
    rec = make_record(disaggregation_transfer_backend=backend, page_size=geometry.page_size)
    r = run_pair(rec, requests=requests, pages_per_request=pages, geometry=geometry, verify=False, fill=False,
                 warmup=1, max_inflight=inflight, timeout=timeout,
                 env=dict({"SGLANG_HYDRA_DISAGG_LOG_LEVEL": "WARNING", "GLOG_minloglevel": "2"}, **extra))
    if r.failed or r.errors:
        raise RuntimeError(f"{backend} pages={pages}: {r.failed} failed, errors={r.errors[:2]} {r.failures[:2]}")
    return r


# ------------------------------------------------------------------ bare engine micro-benchmark
def _micro_receiver(q, done, total):
    import numpy as np
    from mooncake.engine import TransferEngine
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = np.ones(total, dtype=np.uint8)   # touched: no first-write page faults in the numbers
    assert te.register_memory(buf.ctypes.data, total) == 0
    q.put((f"127.0.0.1:{te.get_rpc_port()}", buf.ctypes.data))
    done.wait()


def _micro_one(te, mode, sess, src, dst, total, entry, inflight):
    n = total // entry
    t0 = time.perf_counter()
    if mode == "sync":          # one batch_transfer_sync_write per `inflight` entries, one after another
        for i in range(0, n, inflight):
            k = min(inflight, n - i)
            rc = te.batch_transfer_sync_write(sess, [src + (i + j) * entry for j in range(k)],
                                              [dst + (i + j) * entry for j in range(k)], [entry] * k)
            assert rc == 0, rc
    elif mode == "async":       # batches of 16 entries, `inflight` batches outstanding
        ids, per = [], 16
        for i in range(0, n, per):
            k = min(per, n - i)
            bid = te.batch_transfer_async_write(sess, [src + (i + j) * entry for j in range(k)],
                                                [dst + (i + j) * entry for j in range(k)], [entry] * k)
            assert bid != 0
            ids.append(bid)
            if len(ids) >= inflight:
                assert te.get_batch_transfer_status([ids.pop(0)]) == 0
        assert not ids or te.get_batch_transfer_status(ids) == 0
    else:                       # "posted": one write per entry, `inflight` outstanding, polled with sleeps
        pend, i = [], 0
        while i < n or pend:
            while i < n and len(pend) < inflight:
                bid = te.transfer_submit_write(sess, src + i * entry, dst + i * entry, entry)
                assert 0 < bid < (1 << 63)
                pend.append(bid)
                i += 1
            still = [b for b in pend if te.transfer_check_status(b) == 0]
            if len(still) == len(pend):
                time.sleep(0.0005)
            pend = still
    return total / (time.perf_counter() - t0) / 1e9


def engine_micro(total: int, repeats: int) -> None:
    import multiprocessing as mp
    import numpy as np
    from mooncake.engine import TransferEngine
    os.environ.setdefault("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "8192")
    ctx = mp.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_micro_receiver, args=(q, done, total), daemon=True)
    p.start()
    sess, dst = q.get(timeout=60)
    te = TransferEngine()
    assert te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    srcbuf = np.full(total, 7, dtype=np.uint8)
    te.register_memory(srcbuf.ctypes.data, total)
    src = srcbuf.ctypes.data
    cases = [("sync", total, 1, "batch_transfer_sync_write 1 x 256 MiB (ceiling, as the reference)"),
             ("posted", total, 1, "transfer_submit_write 1 x 256 MiB, polled"),
             ("sync", MiB, 16, "batch_transfer_sync_write 16 x 1 MiB per call"),
             ("async", MiB, 8, "batch_transfer_async_write 16 x 1 MiB, 8 batches out"),
             ("posted", MiB, 128, "transfer_submit_write 1 MiB, 128 out, polled"),
             ("sync", 128 << 10, 16, "batch_transfer_sync_write 16 x 128 KiB per call"),
             ("posted", 128 << 10, 128, "transfer_submit_write 128 KiB, 128 out, polled"),
             ("posted", 16 << 10, 1024, "transfer_submit_write 16 KiB, 1024 out, polled")]
    _micro_one(te, "sync", sess, src, dst, total, total, 1)   # warm-up: handshake, lanes
    res = {c[3]: [] for c in cases}
    for _ in range(repeats):
        for mode, entry, infl, label in cases:
            res[label].append(_micro_one(te, mode, sess, src, dst, total, entry, infl))
    for label, v in res.items():
        print(f"{label:62s} {statistics.median(v):5.2f} GB/s  runs {[round(x, 2) for x in v]}", flush=True)
    done.set()
    p.join(10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="zmq,mooncake")
    ap.add_argument("--total-mib", type=int, default=256)
    ap.add_argument("--pages", default="8,64")
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--markdown", default=None, help="also write the results table to this file")
    ap.add_argument("--engine-micro", action="store_true", help="time the bare Mooncake engine calls instead")
    ap.add_argument("--no-loopback", action="store_true", help="skip the raw loopback ceiling")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    total = a.total_mib * MiB
    if a.engine_micro:
        engine_micro(total, a.repeats)
        return 0
    page_bytes = _geometry_paged(1, 1).bytes_per_page
    rows = []
    tun = {k: os.environ[k] for k in TUNABLES if k in os.environ}
    print(f"tunables from the environment: {tun or 'none (defaults)'}", flush=True)
    loop = None if a.no_loopback else loopback_ceiling(total, repeats=max(2, a.repeats))
    if loop is not None:
        print(f"loopback ceiling (shared-memory memcpy between processes, {a.total_mib} MiB): {loop['gbps']:.2f} GB/s "
              f"(best ring {loop['shape']}; runs {loop['runs']})", flush=True)
    loop_gbps = loop["gbps"] if loop else None
    for backend in [b for b in a.backends.split(",") if b]:
        if not backend_available(VARIANTS.get(backend, (backend,))[0]):
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
            per_run = [round(r.gbps / c.gbps, 2) for r, c in zip(rs, runs["ceiling"])]
            row = dict(backend=backend, shape=f"1 x {a.total_mib} MiB contiguous" if key == "ceiling"
                       else f"{rs[0].requests} x {key} pages ({key * page_bytes // MiB} MiB)",
                       gbps=g, gbps_all=[round(r.gbps, 2) for r in rs],
                       p50=statistics.median(r.p50_ms for r in rs), p99=statistics.median(r.p99_ms for r in rs),
                       ratio=g / ceil_gbps, per_run=per_run, moved=rs[0].bytes_moved,
                       loop=g / loop_gbps if loop_gbps else None)
            rows.append(row)
            vs_loop = "" if row["loop"] is None else f"  {row['loop']:.2f}x loopback"
            print(f"{backend:13s} {row['shape']:28s} {g:6.2f} GB/s (runs {row['gbps_all']})  "
                  f"P50 {row['p50']:8.2f} ms  P99 {row['p99']:8.2f} ms  {row['ratio']:.2f}x ceiling "
                  f"(per run {per_run}){vs_loop}", flush=True)
    if a.markdown:
        lines = ["| backend | requests | GB/s (median) | runs | P50 ms | P99 ms | vs ceiling | ratio/run "
                 "| vs loopback |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            lp = "n/a" if r["loop"] is None else f"{r['loop']:.2f}x"
            lines.append(f"| {r['backend']} | {r['shape']} | {r['gbps']:.2f} | {r['gbps_all']} | {r['p50']:.2f} | "
                         f"{r['p99']:.2f} | {r['ratio']:.2f}x | {r['per_run']} | {lp} |")
        if loop_gbps:
            lines.append(f"\nloopback ceiling: {loop_gbps:.2f} GB/s (memcpy between processes via shared memory)")
        with open(a.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"table written to {a.markdown}  ({platform.node()}, {os.cpu_count()} cpus, "
              f"{time.strftime('%Y-%m-%d')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
