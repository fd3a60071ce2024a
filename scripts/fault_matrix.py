#!/usr/bin/env python
"""The fault matrix: prefill/decode and the storage tier across a real (namespaced) link, under faults.

    python scripts/fault_matrix.py            # every fault x backend (docs/reliability.md)
    python scripts/fault_matrix.py --quick    # the subset CI runs (<= 5 min on 2 cores)

Each PD case puts the prefill in network namespace ``a`` (198.18.0.1) and the decode in ``b``
(198.18.0.2), joined by a veth pair (``sglang_hydra.utils.netns``), runs a batch of requests
with KV checksums and byte verification on, injects the fault, then checks that:

* no corrupted KV was accepted (every Success carries a matching checksum and verified bytes),
* no page is leaked (``pages_in_use_after == 0`` and nothing quarantined, on every survivor),
* every failed request has a reason,
* every wait ended within its bound (nothing hung),
* the survivor serves a fresh batch afterwards, all verified (recovered).

The storage cases run HiCache with an L3 tier: the Mooncake Store with its master in namespace
``a`` and the client in ``b`` (master killed and restarted while HiCache reads and writes), and
the file tier on a size-limited tmpfs (full disk) and with one page file corrupted on disk.

It prints one row per fault and backend and ends with ``N/M faults survived``; exit 0 only when
every case survived, 1 otherwise, 2 when this machine cannot build namespaces (not root, no
``ip``/``tc``/``nft``), naming what is missing. Peers are this same script run with ``--peer``.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

TAG = "@@ "            # peers print their protocol lines with this prefix (everything else is log)
PAGE_TOKENS = 16
# 4 layers x K/V x 16 tokens x 4 heads x 64 dims x bf16 = 64 KiB per page; 1024 pages = 64 MiB a side
GEOMETRY = dict(num_layers=4, head_num=4, head_dim=64, page_size=PAGE_TOKENS, num_pages=1024)
PAGES_PER_REQUEST = 16     # 1 MiB per request
PAGE_BYTES = 2 * GEOMETRY["num_layers"] * PAGE_TOKENS * GEOMETRY["head_num"] * GEOMETRY["head_dim"] * 2
PORT = 18998               # bootstrap port inside namespace a (namespaces have their own port space)

# The reference's own keys (docs/reliability.md explains each value).
PEER_ENV = {
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "1.0",
    "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "20",
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "20",
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "15",
    "SGLANG_HYDRA_DISAGG_PREFILL_SEND_TIMEOUT": "5",
    "SGLANG_HYDRA_DISAGG_BOOTSTRAP_RETRIES": "3",
    "SGLANG_HYDRA_DISAGG_BOOTSTRAP_BACKOFF": "0.2",
    "SGLANG_HYDRA_DISAGG_BOOTSTRAP_HTTP_TIMEOUT": "1.0",
    "SGLANG_HYDRA_DISAGG_LOG_LEVEL": "WARNING",
    "MC_LOG_LEVEL": "ERROR",
    "GLOG_minloglevel": "2",
    "PYTHONUNBUFFERED": "1",
}
BATCH_TIMEOUT = 60.0       # the decode's run deadline for one batch
WARMUP_ROOM = 1_000_000
WAIT_MARGIN = 20.0         # the matrix waits this much longer before calling it a hang


# ====================================================================================== peers
def _emit(kind: str, body: Any) -> None:
    sys.stdout.write(f"{TAG}{kind} {json.dumps(body, default=str)}\n")
    sys.stdout.flush()


def _record(backend: str, mode: str):
    from sglang_hydra.config.testing import make_record
    return make_record(disaggregation_mode=mode, disaggregation_transfer_backend=backend, page_size=PAGE_TOKENS,
                       max_total_tokens=4096, disaggregation_enable_kv_checksum=True,
                       disaggregation_decode_retraction_backup="none")


def _commands():
    """stdin lines as JSON objects; EOF reads as quit (the matrix went away)."""
    for line in sys.stdin:
        line = line.strip()
        if line:
            yield json.loads(line)
    yield {"cmd": "quit"}


def peer_bootstrap(a) -> int:
    from sglang_hydra.disagg.bootstrap import BootstrapServer
    srv = BootstrapServer(a.host, a.port)
    _emit("READY", {"bootstrap": f"{a.host}:{srv.port}"})
    for _ in _commands():
        break
    srv.close()
    return 0


def peer_prefill(a) -> int:
    import dataclasses

    from sglang_hydra.disagg.workers import PlainBufferShape, PrefillWorker
    from sglang_hydra.disagg.registry import backend_classes

    classes = backend_classes(a.backend)
    if a.external_bootstrap:      # the bootstrap server is its own process (killed on its own)
        classes = dataclasses.replace(classes, bootstrap_server=None)
    w = PrefillWorker(_record(a.backend, "prefill"), host=a.host, bootstrap_port=a.port,
                      geometry=PlainBufferShape(**GEOMETRY), classes=classes)
    stop = threading.Event()
    out: Dict[str, Any] = {}
    th = threading.Thread(target=lambda: out.setdefault("res", w.serve(None, stop=stop)), daemon=True)
    th.start()
    _emit("READY", {"bootstrap": w.bootstrap_addr})
    for cmd in _commands():
        if cmd["cmd"] == "stats":
            _emit("STATS", {"pages_in_use": w.allocator.used})
        elif cmd["cmd"] == "quit":
            break
    stop.set()
    th.join(timeout=BATCH_TIMEOUT)
    res = out.get("res")
    body = {"hung": th.is_alive()}
    if res is not None:
        body.update(pages_in_use_after=res.pages_in_use_after, allocator_error=res.allocator_error,
                    requests=[dict(room=r.room, status=r.status, reason=r.reason) for r in res.requests])
    else:
        body.update(pages_in_use_after=w.allocator.used)
    w.close()
    _emit("DONE", body)
    return 0


def peer_decode(a) -> int:
    from sglang_hydra.disagg.workers import DecodeWorker, PlainBufferShape

    w = DecodeWorker(_record(a.backend, "decode"), host=a.host, geometry=PlainBufferShape(**GEOMETRY))
    _emit("READY", {})
    busy: List[threading.Thread] = []

    def fetch(cmd):
        res = w.fetch(cmd["prefill"], cmd["rooms"], cmd["pages"], timeout=cmd["timeout"], max_inflight=8)
        _emit("RESULT", dict(transfer_s=res.transfer_s, pages_in_use_after=res.pages_in_use_after,
                                 quarantined=res.quarantined_pages,
                                 requests=[dict(room=r.room, status=r.status, reason=r.reason, bytes=r.bytes,
                                                checksum=r.checksum, verified=r.verified)
                                           for r in res.requests]))

    for cmd in _commands():
        if cmd["cmd"] == "fetch":   # on a thread, so "stats" is answered while requests are in flight
            busy[:] = [t for t in busy if t.is_alive()]
            busy.append(threading.Thread(target=fetch, args=(cmd,), daemon=True))
            busy[-1].start()
        elif cmd["cmd"] == "stats":
            _emit("STATS", {"pages_in_use": w.allocator.used})
        elif cmd["cmd"] == "quit":
            break
    for t in busy:
        t.join(timeout=BATCH_TIMEOUT)
    held = w.drain_quarantine()
    body = dict(pages_in_use_after=w.allocator.used, quarantined=held, releases=len(w.releases))
    w.close()
    _emit("DONE", body)
    return 0


# ====================================================================================== matrix side
class Peer:
    """A peer process in a namespace, talked to over stdin/stdout (protocol lines start with TAG)."""

    def __init__(self, lab, side: str, role: str, backend: str, extra: List[str] = (), env: Dict[str, str] = None):
        e = dict(os.environ, **PEER_ENV, **(env or {}))
        e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
        argv = [sys.executable, os.path.abspath(__file__), "--peer", role, "--backend", backend,
                "--host", lab.addr[side], "--port", str(PORT), *extra]
        self.role = role
        self.proc = lab.spawn(side, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=e)
        self.lines: "queue.Queue[tuple]" = queue.Queue()
        self.log: List[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if line.startswith(TAG):
                kind, _, body = line[len(TAG):].partition(" ")
                self.lines.put((kind, json.loads(body)))
            else:
                self.log.append(line)
                del self.log[:-40]

    def expect(self, kind: str, timeout: float) -> Optional[Any]:
        """The body of the next ``kind`` line, or None (timed out or the peer died)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                k, body = self.lines.get(timeout=min(left, 0.2))
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    return None
                continue
            if k == kind:
                return body

    def send(self, **cmd) -> None:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def kill9(self) -> None:
        """SIGKILL the peer itself (the python process inside ``ip netns exec``)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)

    def quit(self, timeout: float) -> Optional[Any]:
        self.send(cmd="quit")
        body = self.expect("DONE", timeout)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill9()
        return body

    def tail(self, n: int = 8) -> str:
        return "\n".join(self.log[-n:])


@dataclass
class Row:
    fault: str
    backend: str
    ok: int = 0
    failed: int = 0
    leaked: Optional[int] = 0
    corrupt: int = 0
    detect_s: Optional[float] = None
    recovered: bool = False
    mbps: Optional[float] = None
    problems: List[str] = field(default_factory=list)
    reasons: Dict[str, int] = field(default_factory=dict)

    @property
    def survived(self) -> bool:
        return self.recovered and not self.problems and self.leaked == 0 and self.corrupt == 0


def _account(row: Row, result: Optional[dict], what: str) -> int:
    """Add one decode batch to ``row``; returns its successes (0 when the batch never answered)."""
    if result is None:
        row.problems.append(f"{what}: no result (the decode hung or died)")
        return 0
    ok = 0
    for r in result["requests"]:
        if r["status"] == "Success":
            if r["checksum"] is not True or r["verified"] is not True:
                row.corrupt += 1
            ok += 1
        else:
            reason = (r["reason"] or "").strip()
            if not reason:
                row.problems.append(f"{what}: room {r['room']} failed without a reason")
            key = re.sub(r"\d+(\.\d+)*(:\d+)?", "N", reason.split(": ")[0])[:60] or "?"
            row.reasons[key] = row.reasons.get(key, 0) + 1
    row.ok += ok
    row.failed += len(result["requests"]) - ok
    return ok


def _rooms(start: int, n: int) -> List[int]:
    return list(range(start, start + n))


def _fetch(decode: Peer, prefill_addr: str, rooms: List[int]) -> None:
    decode.send(cmd="fetch", prefill=prefill_addr, rooms=rooms, pages=PAGES_PER_REQUEST, timeout=BATCH_TIMEOUT)


def _wait_pages_free(prefill: Peer, timeout: float) -> Optional[float]:
    """Seconds until the prefill holds no pages (its rooms all settled), None if never."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        prefill.send(cmd="stats")
        st = prefill.expect("STATS", 5)
        if st is None:
            return None
        if st["pages_in_use"] == 0:
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def _wait_pages_held(peer: Peer, timeout: float) -> int:
    """Pages ``peer`` holds once it holds any (0 if it never did within ``timeout``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        peer.send(cmd="stats")
        st = peer.expect("STATS", 5)
        if st is None:
            return 0
        if st["pages_in_use"] > 0:
            time.sleep(0.3)
            return st["pages_in_use"]
        time.sleep(0.05)
    return 0


def _peer_env(lab, side: str, backend: str) -> Dict[str, str]:
    if backend == "nixl":   # across namespaces: UCX over TCP on the veth (CMA would bypass the link)
        return {"UCX_TLS": "tcp", "UCX_NET_DEVICES": lab.dev[side]}
    return {}


def run_pd_case(fault: str, backend: str, n: int) -> Row:
    from sglang_hydra.utils.netns import NetLab

    row = Row(fault, backend)
    t_case = time.monotonic()
    with NetLab() as lab:
        peers: List[Peer] = []

        def start(side, role, extra=()):
            p = Peer(lab, side, role, backend, list(extra), env=_peer_env(lab, side, backend))
            peers.append(p)
            if p.expect("READY", 60) is None:
                raise RuntimeError(f"{role} did not come up:\n{p.tail()}")
            return p

        shaped = fault in ("link_down_3s", "kill_decode", "kill_prefill", "kill_bootstrap")
        if fault == "loss_1pct":
            lab.set_loss(1)
        if fault == "rate_200mbit" or shaped:   # a slow link keeps transfers in flight for the fault
            lab.set_rate(200)
        boot = start("a", "bootstrap") if fault == "kill_bootstrap" else None
        pre = start("a", "prefill", ["--external-bootstrap"] if boot else [])
        dec = start("b", "decode")
        addr = f"{lab.addr['a']}:{PORT}"
        # warm-up (not counted): connections, registrations and first-touch page faults, so the
        # measured batch's throughput is the link's, not the handshake's
        _fetch(dec, addr, _rooms(WARMUP_ROOM, 4))
        if dec.expect("RESULT", BATCH_TIMEOUT + WAIT_MARGIN) is None:
            raise RuntimeError(f"warm-up batch got no answer:\n{dec.tail()}")
        _fetch(dec, addr, _rooms(1, n))
        next_room = n + 1
        if fault in ("clean", "loss_1pct", "rate_200mbit"):
            res = dec.expect("RESULT", BATCH_TIMEOUT + WAIT_MARGIN)
            _account(row, res, "batch")
            if res and res["transfer_s"] > 0:
                row.mbps = sum(r["bytes"] for r in res["requests"]) / res["transfer_s"] / 1e6
            if res and row.failed:
                row.problems.append(f"{row.failed} request(s) failed on a link that only slows down")
        else:
            # inject once the prefill holds pages of this batch (transfers in flight; 1 MiB at 25 MB/s each)
            inflight = _wait_pages_held(dec, 15)
            if not inflight:
                row.problems.append("no transfer was in flight when the fault was due")
            t_fault = time.monotonic()
            if fault == "link_down_3s":
                lab.link_down()
                time.sleep(3.0)
                lab.link_up()
                res = dec.expect("RESULT", BATCH_TIMEOUT + WAIT_MARGIN)
                row.detect_s = time.monotonic() - t_fault
                _account(row, res, "batch")
            elif fault == "kill_decode":
                dec.kill9()
                peers.remove(dec)
                row.detect_s = _wait_pages_free(pre, BATCH_TIMEOUT)
                if row.detect_s is None:
                    row.problems.append("prefill kept pages of the dead decode's rooms")
                dec = start("b", "decode")
            elif fault == "kill_prefill":
                pre.kill9()
                peers.remove(pre)
                res = dec.expect("RESULT", BATCH_TIMEOUT + WAIT_MARGIN)
                row.detect_s = time.monotonic() - t_fault
                _account(row, res, "batch")
                pre = start("a", "prefill")
            elif fault == "kill_bootstrap":
                boot.kill9()
                peers.remove(boot)
                res = dec.expect("RESULT", BATCH_TIMEOUT + WAIT_MARGIN)
                row.detect_s = time.monotonic() - t_fault
                _account(row, res, "batch")
                boot = start("a", "bootstrap")
            lab.clear_shaping()
            _fetch(dec, addr, _rooms(next_room, n))
            res = dec.expect("RESULT", BATCH_TIMEOUT + WAIT_MARGIN)
            rec_ok = _account(row, res, "recovery batch")
            row.recovered = res is not None and rec_ok == n
            if not row.recovered:
                row.problems.append(f"recovery batch: {rec_ok}/{n} ok")
            if fault in ("kill_bootstrap", "link_down_3s"):   # a decode that never saw the prefill before
                fresh = start("b", "decode")
                _fetch(fresh, addr, _rooms(next_room + n, n))
                res = fresh.expect("RESULT", BATCH_TIMEOUT + WAIT_MARGIN)
                fresh_ok = _account(row, res, "fresh decode batch")
                if fresh_ok != n:
                    row.recovered = False
                    row.problems.append(f"fresh decode after the fault: {fresh_ok}/{n} ok")
                done = fresh.quit(BATCH_TIMEOUT)
                if done is None or done["pages_in_use_after"] + done["quarantined"]:
                    row.problems.append(f"fresh decode leaked or hung: {done}")
        if fault in ("clean", "loss_1pct", "rate_200mbit"):
            row.recovered = row.ok == n
        # the KV really crossed the veth link (not a same-host shortcut such as UCX's CMA copy)
        moved = (row.ok + 4) * PAGES_PER_REQUEST * PAGE_BYTES   # + the 4 warm-up requests
        sent = lab.stats("a").get("tx_bytes", 0)
        if sent < 0.9 * moved:
            row.problems.append(f"only {sent} bytes left the prefill's namespace for {moved} bytes of KV moved")
        leaked = 0
        for p in (dec, pre):
            done = p.quit(BATCH_TIMEOUT)
            if done is None:
                row.problems.append(f"{p.role} did not shut down cleanly:\n{p.tail()}")
                row.leaked = None
                continue
            held = done.get("pages_in_use_after", 0) + done.get("quarantined", 0)
            if done.get("hung"):
                row.problems.append(f"{p.role}: serve loop did not stop")
            if done.get("allocator_error"):
                row.problems.append(f"{p.role} allocator: {done['allocator_error']}")
            if p is pre and fault == "kill_decode":   # the survivor's view of the dead decode's rooms
                lost = [r for r in done.get("requests", []) if r["status"] != "Success" and r["room"] <= n]
                _account(row, {"requests": [dict(r, checksum=None, verified=None, bytes=0) for r in lost]},
                         "prefill")
            leaked += held
        if row.leaked is not None:
            row.leaked = leaked
        if boot is not None:
            boot.quit(10)
    if time.monotonic() - t_case > 3 * (BATCH_TIMEOUT + WAIT_MARGIN):
        row.problems.append("the case ran past its bound")
    return row


# ---------------------------------------------------------------------------------- storage cases
def peer_master(a) -> int:
    from sglang_hydra.cache.mooncake_master import MooncakeMaster
    with MooncakeMaster(port=a.port, host=a.host, segment_size="64mb") as m:
        _emit("READY", {"address": m.address})
        for _ in _commands():
            break
    return 0


def _hicache(storage, n_pages_device: int = 2):
    from sglang_hydra.cache.hicache import HiCache
    from sglang_hydra.config.testing import make_record
    from sglang_hydra.memory import build_memory

    rec = make_record(enable_hierarchical_cache=True, hicache_ratio=2.0, max_total_tokens=n_pages_device * PAGE_TOKENS,
                      page_size=PAGE_TOKENS, hicache_write_policy="write_through", hicache_io_backend="direct")
    return HiCache(build_memory(rec), write_policy="write_through", storage=storage, prefetch_threshold=PAGE_TOKENS)


def _hicache_round(c, base: int) -> Dict[str, int]:
    """Serve two prefixes, push them out of device and host, serve them again (from L3 when it has
    them); returns the stat deltas that matter."""
    from sglang_hydra.cache.storage import page_hashes
    before = dict(c.stats)
    a = page_hashes([(base,), (base + 1,)])
    c.serve(a)
    for k in range(2, 12, 2):
        c.serve(page_hashes([(base + k,), (base + k + 1,)]))
    c.serve(a)
    c.check_invariants()
    return {k: c.stats.get(k, 0) - before.get(k, 0) for k in c.stats}


def peer_l3client(a) -> int:
    """HiCache on the Mooncake Store (master in the other namespace): rounds until told to quit."""
    import warnings
    from sglang_hydra.cache.storage import StorageConfig
    from sglang_hydra.cache.storage_mooncake import MooncakeStore

    warnings.simplefilter("ignore")
    extra = {"master_server_address": a.master, "protocol": "tcp", "local_hostname": a.host,
             "global_segment_size": 0, "retry_interval": 0.5}
    st = MooncakeStore(StorageConfig(model_name="fault-matrix", extra_config=extra))
    c = _hicache(st)
    _emit("READY", {})
    base = 1000
    for cmd in _commands():
        if cmd["cmd"] == "round":
            t0 = time.monotonic()
            try:
                d = _hicache_round(c, base)
                err = None
            except Exception as e:   # a round must never crash on an L3 fault
                d, err = {}, f"{type(e).__name__}: {e}"
            base += 100
            _emit("ROUND", dict(delta=d, error=err, seconds=time.monotonic() - t0))
        elif cmd["cmd"] == "quit":
            break
    body = dict(host_pages_in_use=_host_used(c), stats=c.stats)
    st.close()
    _emit("DONE", body)
    return 0


def _host_used(c) -> int:
    """Host-pool pages in use that no tree node owns (leaked by a failed L3 read or write)."""
    ps = c.hpool.page_size
    in_use = c.hpool.size // ps - c.hpool.available_size() // ps
    owned = sum(1 for n in c.nodes.values() if getattr(n, "host", None) is not None)
    return in_use - owned


def _account_l3_fault(row: Row, healthy: Dict[str, int], rounds: List[Dict[str, int]]) -> int:
    """Add the pages the fault rounds lost to ``row.failed``, each counted once against a healthy
    round of the same requests: pages the round did not write to L3 beyond the healthy round's
    (``storage_write_skipped_pages``: failed writes and skipped ones alike), and the L3 hits the
    healthy round had that this one did not (reads that found nothing or came back short: pages
    recomputed instead).  No loss at all means the fault was never exercised: a problem.  Returns
    the pages counted."""
    lost = 0
    for d in rounds:
        unwritten = max(0, d.get("storage_write_skipped_pages", 0) - healthy.get("storage_write_skipped_pages", 0))
        if unwritten:
            row.reasons["L3 write not done"] = row.reasons.get("L3 write not done", 0) + unwritten
            lost += unwritten
        missed = max(0, healthy.get("storage_hit_pages", 0) - d.get("storage_hit_pages", 0))
        if missed:
            row.reasons["L3 hit lost: recomputed"] = row.reasons.get("L3 hit lost: recomputed", 0) + missed
            lost += missed
    row.failed += lost
    if rounds and not lost:
        row.problems.append("the fault rounds lost no L3 read or write (the case tested nothing)")
    return lost


def run_master_restart(n_rounds: int) -> Row:
    from sglang_hydra.utils.netns import NetLab
    row = Row("master_restart", "mooncake-store")
    with NetLab() as lab:
        env: Dict[str, str] = {}

        def start(side, role, extra=()):
            p = Peer(lab, side, role, "mooncake", list(extra), env=env)
            if p.expect("READY", 60) is None:
                raise RuntimeError(f"{role} did not come up:\n{p.tail()}")
            return p

        master = start("a", "master")
        client = start("b", "l3client", ["--master", f"{lab.addr['a']}:{PORT}"])

        def round_(what):
            client.send(cmd="round")
            r = client.expect("ROUND", 60)
            if r is None:
                row.problems.append(f"{what}: the client hung or died")
                return None
            if r["error"]:
                row.problems.append(f"{what}: {r['error']}")
            d = r["delta"]
            row.corrupt += d.get("verify_mismatch_pages", 0)
            return d

        def used_l3(d):   # wrote pages to L3 and read them back from it, all verified
            return bool(d) and d.get("storage_write_pages", 0) > 0 and d.get("storage_hit_pages", 0) > 0 \
                and d.get("verify_mismatch_pages", 0) == 0

        healthy = None
        for i in range(n_rounds):
            d = round_("before")
            if not used_l3(d):
                row.problems.append(f"round before the fault did not use L3: {d}")
            healthy = d
            row.ok += 1
        client.send(cmd="round")              # the master dies while this round reads and writes L3
        t0 = time.monotonic()
        master.kill9()
        r = client.expect("ROUND", 60)
        during = None
        if r is None:
            row.problems.append("the round during the master kill hung")
        else:
            if r["error"]:
                row.problems.append(f"during the master kill: {r['error']}")
            during = r["delta"]
            row.corrupt += during.get("verify_mismatch_pages", 0)
        d = round_("master down")              # must answer (misses / skipped writes), nothing corrupt
        row.detect_s = time.monotonic() - t0
        if healthy is not None:
            _account_l3_fault(row, healthy, [x for x in (during, d) if x is not None])
        master = start("a", "master")
        ok_after = 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            d = round_("after restart")
            if used_l3(d):
                ok_after += 1
                if ok_after >= 2:
                    break
        row.recovered = ok_after >= 2
        done = client.quit(30)
        row.leaked = None if done is None else done["host_pages_in_use"]
        master.quit(15)
    return row


def run_file_tier(fault: str) -> Row:
    """HiCache on the file tier: a full disk (a 256 KiB tmpfs) or one page file corrupted on disk.

    Full disk: writes that do not fit fail (counted), HiCache keeps serving from device/host and
    whatever did reach the disk reads back verified. Corrupt page: serving the same prefix again
    must turn that page into a miss (recomputed), never into KV accepted from disk.
    """
    import tempfile
    import warnings
    from sglang_hydra.cache.storage import FileStorage, StorageConfig

    row = Row(fault, "file")
    mnt = tempfile.mkdtemp(prefix="shx-fm-")
    size = "256k" if fault == "disk_full" else "16m"
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", mnt], check=True, timeout=10)
    try:
        warnings.simplefilter("ignore")
        st = FileStorage(StorageConfig(model_name="fm", extra_config={"file_storage_path": mnt}))
        c = _hicache(st)
        t0 = time.monotonic()
        if fault == "disk_full":
            for i in range(6):
                d = _hicache_round(c, 1000 + 100 * i)
                row.ok += 1
                row.corrupt += d.get("verify_mismatch_pages", 0)
            row.failed = st.stats["set_fail"]
            row.reasons["disk full: page not written"] = row.failed
            row.detect_s = time.monotonic() - t0
            if not row.failed:
                row.problems.append("the disk never filled up (the case tested nothing)")
            d = _hicache_round(c, 9000)          # still serving; what reached the disk reads back verified
            row.corrupt += d.get("verify_mismatch_pages", 0)
            row.recovered = st.stats["get_hit"] > 0 and row.corrupt == 0
            if not st.stats["get_hit"]:
                row.problems.append("nothing was read back from the file tier")
        else:
            _hicache_round(c, 1000)
            row.ok += 1
            files = sorted(os.path.join(r, f) for r, _, fs in os.walk(mnt) for f in fs)
            victim = files[0]
            with open(victim, "r+b") as f:
                f.seek(os.path.getsize(victim) // 2)
                b = f.read(1)
                f.seek(-1, 1)
                f.write(bytes([b[0] ^ 0xFF]))
            hits = st.stats["get_hit"]
            d = _hicache_round(c, 1000)          # the same prefixes again: the corrupt page is a miss
            row.corrupt += d.get("verify_mismatch_pages", 0)
            row.failed = st.stats["corrupt"]
            row.detect_s = time.monotonic() - t0
            row.reasons["corrupt page on disk: miss"] = row.failed
            if row.failed != 1:
                row.problems.append(f"{row.failed} corrupt page(s) detected, 1 was damaged")
            from sglang_hydra.cache.storage import check_page_file
            if os.path.exists(victim) and check_page_file(victim):   # rewritten by write-through is fine
                row.problems.append("the corrupt page file was left on disk")
            d = _hicache_round(c, 5000)
            row.recovered = st.stats["get_hit"] > hits and d.get("verify_mismatch_pages", 0) == 0
        c.check_invariants()
        row.leaked = _host_used(c)
        st.close()
    except Exception as e:
        row.problems.append(f"{type(e).__name__}: {e}")
    finally:
        subprocess.run(["umount", "-l", mnt], timeout=10)
        os.rmdir(mnt)
    return row


# ====================================================================================== main
PD_FAULTS = ["clean", "loss_1pct", "rate_200mbit", "link_down_3s", "kill_decode", "kill_prefill", "kill_bootstrap"]
QUICK_PD = {"zmq": [f for f in PD_FAULTS if f != "rate_200mbit"], "mooncake": ["loss_1pct", "kill_prefill"],
            "nixl": ["loss_1pct"]}


def _available_backends() -> List[str]:
    out = ["zmq"]
    try:
        from sglang_hydra.disagg.backends.mooncake import mooncake_available
        if mooncake_available():
            out.append("mooncake")
    except Exception:
        pass
    try:
        from sglang_hydra.disagg.backends.nixl import nixl_available
        if nixl_available():
            out.append("nixl")
    except Exception:
        pass
    return out


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_table(rows: List[Row]) -> None:
    head = ("fault", "backend", "ok/failed", "leaked pages", "corrupt accepted", "detect s", "recovered",
            "MB/s")
    lines = [head] + [(r.fault, r.backend, f"{r.ok}/{r.failed}", _fmt(r.leaked, "d"), str(r.corrupt),
                       _fmt(r.detect_s, ".1f"), "yes" if r.survived else "NO", _fmt(r.mbps, ".0f"))
                      for r in rows]
    w = [max(len(str(l[i])) for l in lines) for i in range(len(head))]
    for l in lines:
        print("  ".join(str(c).ljust(w[i]) for i, c in enumerate(l)).rstrip())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the CI subset")
    ap.add_argument("--backends", default=None, help="comma list (default: every one that imports)")
    ap.add_argument("--faults", default=None, help="comma list of fault names")
    ap.add_argument("--requests", type=int, default=None, help="requests per batch")
    ap.add_argument("--peer", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="zmq", help=argparse.SUPPRESS)
    ap.add_argument("--host", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=PORT, help=argparse.SUPPRESS)
    ap.add_argument("--master", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--external-bootstrap", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.peer:
        import logging
        logging.basicConfig(level=logging.WARNING, format=f"[{a.peer}] %(name)s %(levelname)s: %(message)s")
        return {"prefill": peer_prefill, "decode": peer_decode, "bootstrap": peer_bootstrap,
                "master": peer_master, "l3client": peer_l3client}[a.peer](a)

    from sglang_hydra.utils.netns import missing_requirements
    missing = missing_requirements()
    if missing:
        for m in missing:
            print(f"fault_matrix: missing {m}", file=sys.stderr)
        return 2
    backends = _available_backends()
    if a.backends:
        wanted = [b.strip() for b in a.backends.split(",") if b.strip()]
        bad = [b for b in wanted if b not in backends]
        if bad:
            print(f"fault_matrix: --backends: {','.join(bad)} not available here (available: "
                  f"{','.join(backends)})", file=sys.stderr)
            return 2
        backends = wanted
    n = a.requests or (12 if a.quick else 32)
    cases = []
    for b in backends:
        for f in (QUICK_PD.get(b, []) if a.quick else PD_FAULTS):
            cases.append(("pd", f, b))
    storage = ["disk_full", "page_corrupt"]
    if "mooncake" in backends:
        storage.append("master_restart")
    if a.quick:
        storage = [s for s in storage if s != "master_restart"] + (["master_restart"] if "mooncake" in backends
                                                                   else [])
    cases += [("storage", f, None) for f in storage]
    if a.faults:
        keep = {f.strip() for f in a.faults.split(",")}
        cases = [c for c in cases if c[1] in keep]
    rows: List[Row] = []
    t0 = time.monotonic()
    for kind, fault, backend in cases:
        t = time.monotonic()
        try:
            if kind == "pd":
                row = run_pd_case(fault, backend, n)
            elif fault == "master_restart":
                row = run_master_restart(2)
            else:
                row = run_file_tier(fault)
        except Exception as e:
            row = Row(fault, backend or "storage", problems=[f"{type(e).__name__}: {e}"])
        print(f"[{time.monotonic() - t:5.1f}s] {row.fault:<14} {row.backend:<14} "
              f"{'survived' if row.survived else 'FAILED'} {row.reasons or ''}", flush=True)
        for p in row.problems:
            print(f"    problem: {p}", flush=True)
        rows.append(row)
    print()
    print_table(rows)
    survived = sum(r.survived for r in rows)
    print(f"\n{survived}/{len(rows)} faults survived ({time.monotonic() - t0:.0f} s)")
    return 0 if survived == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
