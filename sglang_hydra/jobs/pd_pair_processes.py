"""Run a prefill/decode pair as two local processes and summarise it (``job=pd_pair``, benchmarks).

:func:`run_pair` spawns the prefill (``run_prefill``) and, once its bootstrap server is up, the
decode (``run_decode``) on 127.0.0.1 with a free bootstrap port, collects both
:class:`~sglang_hydra.disagg.workers.SideResult` s over a queue and reduces them to a
:class:`PairResult`. :func:`summary_rows` turns either kind of result into the rows of the
terminal table the jobs print; the per-request lists go to files, never to the terminal.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue as queue_mod
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from sglang_hydra.disagg.workers import DEFAULT_HOST, PlainBufferShape, SideResult, run_decode, run_prefill
from sglang_hydra.disagg.registry import resolve_backend_name
from sglang_hydra.utils.envflags import env_str
from sglang_hydra.utils.ports import free_port
from sglang_hydra.utils.procs import stop_processes
from sglang_hydra.workload.metrics import nearest_rank

logger = logging.getLogger("sglang_hydra.jobs.pd_pair_processes")


def percentile(xs: Sequence[float], q: float) -> Optional[float]:
    """The ``q``-th percentile (nearest rank, the replay's one definition); None when empty."""
    return nearest_rank(sorted(xs), q / 100.0) if xs else None


@dataclass
class PairResult:
    backend: str
    requests: int
    pages_per_request: int
    succeeded: int
    failed: int
    p50_ms: Optional[float]
    p99_ms: Optional[float]
    gbps: Optional[float]
    pages_moved: int
    bytes_moved: int
    checksum_checked: int
    checksum_mismatches: int
    failures: List[Tuple[int, str]]
    prefill: Optional[SideResult]
    decode: Optional[SideResult]
    wall_s: float
    errors: List[str] = field(default_factory=list)
    checksum_enabled: bool = False
    verify: bool = False
    verified_checked: int = 0
    verified_ok: int = 0

    @property
    def unchecked(self) -> int:
        """Transferred requests that should have been checked (checksum or bytes) but were not."""
        missing = 0
        if self.checksum_enabled:
            missing = max(missing, self.succeeded - self.checksum_checked)
        if self.verify:
            missing = max(missing, self.succeeded - self.verified_checked)
        return missing

    @property
    def ok(self) -> bool:
        return not self.failed and not self.errors and not self.unchecked

    def summary(self) -> str:
        def f(x, fmt):
            return "n/a" if x is None else format(x, fmt)
        checksum = (f"{self.checksum_checked - self.checksum_mismatches}/{self.checksum_checked}"
                    if self.checksum_enabled else "off")
        verified = f"{self.verified_ok}/{self.verified_checked}" if self.verify else "off"
        return (f"backend={self.backend} requests={self.requests} pages/request={self.pages_per_request} "
                f"ok={self.succeeded} failed={self.failed} P50={f(self.p50_ms, '.2f')}ms "
                f"P99={f(self.p99_ms, '.2f')}ms throughput={f(self.gbps, '.3f')}GB/s "
                f"pages={self.pages_moved} bytes={self.bytes_moved} checksum ok={checksum} "
                f"verified ok={verified}")


def summarize(backend: str, requests: int, pages_per_request: int, prefill: Optional[SideResult],
              decode: Optional[SideResult], wall_s: float, errors: List[str], *, checksum_enabled: bool = False,
              verify: bool = False) -> PairResult:
    reqs = decode.requests if decode else []
    ok = [r for r in reqs if r.ok]
    lat = [r.latency_s * 1000 for r in ok if r.latency_s is not None]
    moved = sum(r.bytes for r in ok)
    gbps = moved / decode.transfer_s / 1e9 if decode and decode.transfer_s > 0 and moved else None
    checked = [r for r in reqs if r.checksum is not None]
    verified = [r for r in reqs if r.verified is not None]
    failures = [(r.room, r.reason or r.status) for r in reqs if not r.ok]
    if decode is None:
        failures = [(-1, e) for e in errors]
    return PairResult(backend=backend, requests=requests, pages_per_request=pages_per_request,
                      succeeded=len(ok), failed=requests - len(ok), p50_ms=percentile(lat, 50),
                      p99_ms=percentile(lat, 99), gbps=gbps, pages_moved=sum(r.pages for r in ok),
                      bytes_moved=moved, checksum_checked=len(checked),
                      checksum_mismatches=sum(1 for r in checked if r.checksum is False),
                      failures=failures, prefill=prefill, decode=decode, wall_s=wall_s, errors=errors,
                      checksum_enabled=checksum_enabled, verify=verify, verified_checked=len(verified),
                      verified_ok=sum(1 for r in verified if r.verified))


# ------------------------------------------------------------------------------------ child processes
def _rebuild_record(values: Dict[str, Any]):
    from sglang_hydra.config.record import ServerArgs
    return ServerArgs(**values)


def _child_logging(role: str) -> None:
    level = env_str("SGLANG_HYDRA_DISAGG_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO),
                        format=f"%(asctime)s [{role}] %(name)s %(levelname)s: %(message)s")


def _prefill_entry(values, env, kwargs, q, stop=None) -> None:
    os.environ.update(env)
    _child_logging("prefill")
    try:
        record = _rebuild_record(values)
        res = run_prefill(record, ready=lambda ep: q.put(("ready", "prefill", ep)), stop=stop, **kwargs)
        q.put(("result", "prefill", res.to_dict()))
    except BaseException as e:
        logging.getLogger(__name__).exception("prefill failed")
        q.put(("error", "prefill", f"{type(e).__name__}: {e}"))


def _decode_entry(values, env, kwargs, q) -> None:
    os.environ.update(env)
    _child_logging("decode")
    try:
        record = _rebuild_record(values)
        res = run_decode(record, **kwargs)
        q.put(("result", "decode", res.to_dict()))
    except BaseException as e:
        logging.getLogger(__name__).exception("decode failed")
        q.put(("error", "decode", f"{type(e).__name__}: {e}"))


def _wait_ready(q, pre, deadline: float) -> None:
    """Block until the prefill's bootstrap server is up (or it failed / the pair timed out)."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("prefill did not come up before the pair timeout")
        try:
            kind, role, payload = q.get(timeout=min(left, 0.5))
        except queue_mod.Empty:
            if not pre.is_alive():
                raise RuntimeError(f"prefill process exited early (exit code {pre.exitcode})")
            continue
        if kind == "ready":
            return
        if kind == "error":
            raise RuntimeError(f"prefill failed to start: {payload}")


def run_pair(record, *, requests: int, pages_per_request: int, timeout: float = 120.0,
             geometry: Optional[PlainBufferShape] = None, verify: bool = True, max_inflight: int = 8,
             room_base: int = 1, env: Optional[Dict[str, str]] = None, host: str = DEFAULT_HOST,
             warmup: int = 0, fill: bool = True) -> PairResult:
    """Run prefill and decode as two spawned processes on ``host`` with free ports.

    ``warmup`` requests run first and are left out of the numbers; ``fill=False`` skips writing
    the test pattern on prefill (benchmarks; then pass ``verify=False`` too).
    """
    room_base = max(room_base, warmup + 1)
    backend = resolve_backend_name(record.disaggregation_transfer_backend)
    values = record.to_dict()
    env = dict(env or {})
    if backend == "mooncake" and record.disaggregation_transfer_backend == "mooncake_tcp":
        env.setdefault("MC_FORCE_TCP", "1")
    port = free_port(host)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    t0 = time.monotonic()
    deadline = t0 + timeout
    errors: List[str] = []
    results: Dict[str, SideResult] = {}
    pre = dec = None
    decode_done = ctx.Event()   # set once decode answered: prefill then fails the rooms never asked for
    try:
        if backend != "fake":
            pv = dict(values, disaggregation_mode="prefill")
            pre = ctx.Process(target=_prefill_entry, name="pd-prefill", daemon=True, args=(
                pv, env, dict(requests=requests, pages_per_request=pages_per_request, host=host,
                              bootstrap_port=port, room_base=room_base, geometry=geometry,
                              max_inflight=max(32, 2 * max_inflight), fill=fill, warmup=warmup,
                              timeout=max(1.0, deadline - time.monotonic() - 2)), q, decode_done))
            pre.start()
            _wait_ready(q, pre, deadline)
        dv = dict(values, disaggregation_mode="decode")
        dec = ctx.Process(target=_decode_entry, name="pd-decode", daemon=True, args=(
            dv, env, dict(prefill_addr=f"{host}:{port}" if pre else None, requests=requests,
                          pages_per_request=pages_per_request, host=host, room_base=room_base,
                          geometry=geometry, max_inflight=max_inflight, verify=verify, warmup=warmup,
                          timeout=max(1.0, deadline - time.monotonic() - 2)), q))
        dec.start()
        _collect(q, {"prefill": pre, "decode": dec}, results, errors, deadline, timeout, decode_done)
    except (TimeoutError, RuntimeError) as e:
        errors.append(str(e))
    finally:
        for p in (dec, pre):
            if p is not None:
                p.join(timeout=max(0.0, min(5.0, deadline + 5 - time.monotonic())))
        stop_processes([dec, pre])
        q.close()
    res = summarize(backend, requests, pages_per_request, results.get("prefill"), results.get("decode"),
                    time.monotonic() - t0, errors,
                    checksum_enabled=bool(getattr(record, "disaggregation_enable_kv_checksum", False)),
                    verify=bool(verify and backend != "fake"))
    logger.info("pd pair: %s", res.summary())
    return res


def _collect(q, procs: Dict[str, Any], results: Dict[str, SideResult], errors: List[str], deadline: float,
             timeout: float, decode_done=None) -> None:
    """Read results and errors from ``q`` until every started side has answered or died.

    Once decode has answered (or failed), ``decode_done`` is set: the prefill stops waiting for
    rooms decode will never ask for, instead of waiting out the pair's timeout.
    """
    expected = {name for name, p in procs.items() if p is not None}
    while expected - set(results) - {e.split(":")[0] for e in errors}:
        left = deadline - time.monotonic()
        if left <= 0:
            errors.append("timeout: pair did not finish within %.1fs" % timeout)
            return
        try:
            kind, role, payload = q.get(timeout=min(left, 0.5))
        except queue_mod.Empty:
            for name, p in procs.items():
                if p is not None and not p.is_alive() and name not in results and \
                        not any(e.startswith(name) for e in errors):
                    try:  # the result may still be in the pipe
                        kind, role, payload = q.get(timeout=1.0)
                    except queue_mod.Empty:
                        errors.append(f"{name}: process exited with code {p.exitcode} without a result")
                        continue
                    break
            else:
                continue
        if kind == "result":
            results[role] = SideResult.from_dict(payload)
        elif kind == "error":
            errors.append(f"{role}: {payload}")
        if role == "decode" and decode_done is not None:
            decode_done.set()


# ------------------------------------------------------------------------------------ terminal tables
def side_rows(side: SideResult, *, checksum: bool = True, verify: bool = True) -> List[Tuple[str, str]]:
    """The summary of one side as (label, value) rows; a check that is off says "off", not 0/0."""
    ok = [r for r in side.requests if r.ok]
    lat = [r.latency_s * 1000 for r in ok if r.latency_s is not None]
    moved = sum(r.bytes for r in ok)
    gbps = moved / side.transfer_s / 1e9 if side.transfer_s > 0 and moved else None
    cs_ok, cs_n = side.check_counts("checksum")
    v_ok, v_n = side.check_counts("verified")

    def f(x, spec):
        return "n/a" if x is None else format(x, spec)
    return [("role", side.role), ("backend", side.backend), ("requests", str(len(side.requests))),
            ("succeeded", str(side.succeeded)), ("failed", str(side.failed)),
            ("checksum ok / checked", f"{cs_ok}/{cs_n}" if checksum else "off"),
            ("bytes verified ok / checked", f"{v_ok}/{v_n}" if verify else "off"),
            ("P50 / P99 ms", f"{f(percentile(lat, 50), '.2f')} / {f(percentile(lat, 99), '.2f')}"),
            ("throughput GB/s", f(gbps, ".3f")), ("wall s", f"{side.wall_s:.2f}"),
            ("pages in use after", str(side.pages_in_use_after)),
            ("pages still held (quarantined)", str(side.quarantined_pages)),
            ("allocator", side.allocator_error or "ok")]


def render_rows(rows: Sequence[Tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
