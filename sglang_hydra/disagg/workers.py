"""The two roles of a prefill/decode pair, as long-lived workers and plain functions.

* :class:`PrefillWorker` / :func:`run_prefill` - stand up the bootstrap server and the prefill KV
  manager, then serve requests: fill each request's pages, wait for decode's destination pages,
  transfer, free.
* :class:`DecodeWorker` / :func:`run_decode` - look up the prefill through its bootstrap server,
  register buffers, then for each request allocate pages, send their indices, wait for the
  terminal state, verify the bytes, free. The pages of a *failed* request whose indices prefill
  already had are not freed until the receiver says that is safe (prefill acknowledged, or is
  lost) or the deferred-release timeout passed: a late one-sided write must never land in pages
  that a later request owns (see ``decode_side.py``). Once the prefill is lost (heartbeat) or
  unreachable, no further request is issued to it: the run ends with those requests failed.

Tests use the workers directly to keep one side alive while the other is killed; the
two-process harness the jobs use lives in ``sglang_hydra.jobs.pd_pair_processes``. Request ``i`` of a
run has bootstrap room ``room_base + i`` on both sides. A worker takes ``classes`` (the
backend's classes, default: from the registry) and ``is_device`` (which KV tensors count as
device memory), so tests can substitute either.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from sglang_hydra.utils.envflags import env_flag

from .base import BackendClasses
from .buffers import (KVBufferSource, PageAllocator, TensorKVBuffers, allocator_for, buffers_from_memory,
                      kv_args_from_source, on_device)
from .decode_side import PeerConfigError
from .envs import DisaggEnv
from .registry import backend_classes, resolve_backend_name
from .states import TERMINAL, KVPoll

logger = logging.getLogger("sglang_hydra.disagg.workers")
DEFAULT_HOST = "127.0.0.1"
STAGING_ENV = "SGLANG_HYDRA_DISAGG_HOST_STAGING"


# ------------------------------------------------------------------------------------ results
@dataclass
class RequestResult:
    room: int
    status: str
    pages: int
    bytes: int
    latency_s: Optional[float] = None
    reason: Optional[str] = None
    checksum: Optional[bool] = None   # None: not checked
    verified: Optional[bool] = None   # byte-for-byte comparison on decode (None: not checked)
    release: Optional[str] = None     # decode, failed requests: "now" or "deferred" (pages quarantined)

    @property
    def ok(self) -> bool:
        return self.status == "Success"


@dataclass
class SideResult:
    role: str
    backend: str
    endpoints: Dict[str, Any]
    registration: Dict[str, Any]
    requests: List[RequestResult] = field(default_factory=list)
    wall_s: float = 0.0
    transfer_s: float = 0.0
    allocator_error: Optional[str] = None
    pages_in_use_after: int = 0
    quarantined_pages: int = 0   # decode: pages of failed requests still held for late writes

    @property
    def succeeded(self) -> int:
        return sum(r.ok for r in self.requests)

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.requests)

    def check_counts(self, attr: str) -> Tuple[int, int]:
        """``(passed, checked)`` of ``"checksum"`` or ``"verified"`` over the requests."""
        checked = [getattr(r, attr) for r in self.requests if getattr(r, attr) is not None]
        return sum(1 for v in checked if v), len(checked)

    def first_failures(self, n: int = 5) -> List[Tuple[int, str]]:
        return [(r.room, r.reason or r.status) for r in self.requests if not r.ok][:n]

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "SideResult":
        d = dict(d)
        d["requests"] = [RequestResult(**r) for r in d.get("requests", [])]
        return cls(**d)


# ------------------------------------------------------------------------------------ KV memory
@dataclass(frozen=True)
class PlainBufferShape:
    """Shape and page count of plain KV buffers for a side that should not build the record's
    memory pools (benchmarks and tests choose it); by default a side uses ``build_memory(record)``,
    whose rows follow the model's :class:`~sglang_hydra.memory.geometry.KVGeometry`."""
    num_layers: int
    head_num: int
    head_dim: int
    page_size: int
    num_pages: int
    dtype: str = "bfloat16"
    reserve_page0: bool = True
    kv_split: bool = True

    def build(self) -> TensorKVBuffers:
        return TensorKVBuffers(num_layers=self.num_layers, num_pages=self.num_pages, page_size=self.page_size,
                               head_num=self.head_num, head_dim=self.head_dim, dtype=getattr(torch, self.dtype),
                               reserve_page0=self.reserve_page0, kinds=("k", "v") if self.kv_split else ("kv",))

    @property
    def bytes_per_page(self) -> int:
        return (2 if self.kv_split else 1) * self.num_layers * self.page_size * self.head_num * \
            self.head_dim * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


def build_kv_source(record, geometry: Optional[PlainBufferShape] = None) -> Tuple[KVBufferSource, Any]:
    """KV buffers + allocator: the real pools from ``sglang_hydra.memory`` when available."""
    if geometry is None:
        from sglang_hydra.memory import build_memory

        memory = build_memory(record)
        source = buffers_from_memory(memory)
        source._memory = memory  # keep the pools alive as long as the source
        return source, allocator_for(memory)
    buf = geometry.build()
    return buf, buf.make_allocator()


def _role_class(classes: BackendClasses, mode: str) -> type:
    return getattr(classes.manager, f"{mode}_cls", classes.manager)


def _kv_side(record, source: Optional[KVBufferSource], allocator, geometry: Optional[PlainBufferShape],
             role_cls: type, is_device: Optional[Callable[[torch.Tensor], bool]]):
    """One side's KV buffers, their page allocator and the backend's KVArgs (given or built)."""
    if source is None:
        source, allocator = build_kv_source(record, geometry)
    if allocator is None:
        allocator = PageAllocator(source.contiguous_buffers()[0][1].shape[0] // source.page_size - 1)
    args = kv_args_from_source(source, kv_cache_dtype=str(record.kv_cache_dtype),
                               ib_device=record.disaggregation_ib_device,
                               device_memory=bool(getattr(role_cls, "device_memory", False)),
                               backend=str(record.disaggregation_transfer_backend),
                               staging=env_flag(STAGING_ENV, True), is_device=is_device or on_device)
    return source, allocator, args


def _pattern(room: int, buf: int, nbytes: int) -> torch.Tensor:
    k = (nbytes + 7) // 8
    x = (torch.arange(k, dtype=torch.int64) + (room * 1_000_003 + buf * 7_919 + 1)) * 6364136223846793005
    x = x ^ (x >> 29)
    return x.view(torch.uint8)[:nbytes]


def _page_rows(args, b: int) -> torch.Tensor:
    """Buffer ``b`` where the KV really lives (the device buffer when staged), one row per page."""
    t = (args.source_tensors or args.tensors)[b]
    return t.reshape(-1).view(torch.uint8).view(-1, args.kv_item_lens[b])


def fill_pages(args, pages: Sequence[int], room: int) -> None:
    for b, il in enumerate(args.kv_item_lens):
        rows = _page_rows(args, b)
        idx = torch.as_tensor(list(pages), dtype=torch.long, device=rows.device)
        rows[idx] = _pattern(room, b, len(pages) * il).view(len(pages), il).to(rows.device)


def check_pages(args, pages: Sequence[int], room: int) -> bool:
    for b, il in enumerate(args.kv_item_lens):
        rows = _page_rows(args, b)
        idx = torch.as_tensor(list(pages), dtype=torch.long, device=rows.device)
        if not torch.equal(rows[idx].cpu(), _pattern(room, b, len(pages) * il).view(len(pages), il)):
            return False
    return True


def _check_allocator(alloc) -> Optional[str]:
    fn = getattr(alloc, "check_invariants", None)
    if fn is None:
        return None
    try:
        fn()
    except AssertionError as e:
        return str(e) or "allocator invariant violated"
    return None


def _finish(res: "SideResult", allocator, t0: float, first_send, last_done) -> "SideResult":
    """Timing and allocator health of one side's run, filled in the same way for both roles."""
    res.wall_s = time.monotonic() - t0
    res.transfer_s = (last_done - first_send) if (first_send and last_done) else 0.0
    res.allocator_error = _check_allocator(allocator)
    res.pages_in_use_after = getattr(allocator, "used", 0)
    return res


def _registration(args) -> Dict[str, Any]:
    return {"buffers": len(args.kv_data_ptrs), "total_bytes": sum(args.kv_data_lens),
            "item_lens": sorted(set(args.kv_item_lens)), "page_size": args.page_size,
            "bytes_per_page": sum(args.kv_item_lens), "memory": args.memory_kind,
            "staged": args.staging is not None}


# ------------------------------------------------------------------------------------ prefill
class PrefillWorker:
    def __init__(self, record, *, host: str = DEFAULT_HOST, bootstrap_port: Optional[int] = None,
                 source: Optional[KVBufferSource] = None, allocator=None,
                 geometry: Optional[PlainBufferShape] = None, env: Optional[DisaggEnv] = None,
                 classes: Optional[BackendClasses] = None,
                 is_device: Optional[Callable[[torch.Tensor], bool]] = None):
        name = resolve_backend_name(record.disaggregation_transfer_backend)
        if name == "fake":
            raise AssertionError("Prefill server does not support 'fake' as the transfer backend")
        self.backend = name
        classes = classes or backend_classes(name)
        self.source, self.allocator, self.args = _kv_side(record, source, allocator, geometry,
                                                          _role_class(classes, "prefill"), is_device)
        port = record.disaggregation_bootstrap_port if bootstrap_port is None else bootstrap_port
        env = env or DisaggEnv.from_env()
        from .manager import bootstrap_secret_of
        self.server = None
        if classes.bootstrap_server is not None:
            self.server = classes.bootstrap_server(host, int(port), secret=bootstrap_secret_of(record, env))
            port = self.server.port
        self.bootstrap_addr = f"{host}:{port}"
        try:
            self.mgr = classes.manager(self.args, "prefill", record, host=host, bootstrap_port=int(port), env=env)
            self.mgr.register_to_bootstrap()
        except BaseException:
            if self.server is not None:
                self.server.close()
            raise
        self.classes = classes
        logger.info("role=prefill backend=%s bootstrap=http://%s control=tcp://%s buffers=%s",
                    name, self.bootstrap_addr, self.mgr.endpoint, _registration(self.args))

    def endpoints(self) -> Dict[str, Any]:
        ep = {"bootstrap": f"http://{self.bootstrap_addr}", "control": f"tcp://{self.mgr.endpoint}"}
        if hasattr(self.mgr, "mc_session"):
            ep["mooncake_session"] = self.mgr.mc_session
        return ep

    def serve(self, rooms: Optional[Sequence[int]] = None, *, pages_per_request: Optional[int] = None,
              max_inflight: int = 32, timeout: Optional[float] = None, stop: Optional[threading.Event] = None,
              fill: bool = True, idle_timeout: Optional[float] = None) -> SideResult:
        """Serve ``rooms`` (or, with ``rooms=None``, whatever decode asks for until ``stop``/idle)."""
        reactive = rooms is None
        if not reactive and not pages_per_request:
            raise ValueError("pages_per_request is required when rooms are given")
        pending = deque(rooms or [])
        seen = set(pending)
        inflight: Dict[int, list] = {}
        res = SideResult("prefill", self.backend, self.endpoints(), _registration(self.args))
        t0 = time.monotonic()
        deadline = t0 + timeout if timeout else None
        last_activity = t0
        first_send = last_done = None
        mgr = self.mgr
        while True:
            now = time.monotonic()
            if reactive:
                for room, info in list(mgr.transfer_infos.items()):
                    if room not in seen:
                        seen.add(room)
                        pending.append((room, len(info.dst_pages)))
            if stop is not None and stop.is_set() and not reactive:
                # decode is done: the rooms it never asked for will never be asked for
                self._give_up(pending, inflight, res, pages_per_request, "decode ended its run without "
                              "asking for this room")
            if not pending and not inflight:
                if not reactive or (stop is not None and stop.is_set()):
                    break
                if idle_timeout is not None and now - last_activity > idle_timeout:
                    break
            elif stop is not None and stop.is_set() and not inflight:
                break
            if deadline is not None and now > deadline:
                self._give_up(pending, inflight, res, pages_per_request, "prefill run deadline exceeded",
                              sent_too=True)
                deadline = None  # let the loop collect them once
            while pending and len(inflight) < max_inflight:
                item = pending[0]
                room, npages = item if isinstance(item, tuple) else (item, pages_per_request)
                pages = self.allocator.alloc(npages)
                if pages is None and not inflight:
                    # nothing in flight will free a page: this request can never fit, so fail it
                    # now instead of waiting out the run's timeout
                    pending.popleft()
                    reason = (f"{npages} KV pages do not fit in this prefill's pool "
                              f"({self.allocator.available()} free)")
                    logger.error("[prefill] room %d: %s", room, reason)
                    if reactive:
                        mgr.reject(room, reason)
                        seen.discard(room)
                    res.requests.append(RequestResult(room=room, status="Failed", pages=npages, bytes=0,
                                                      reason=reason))
                    continue
                if pages is None:
                    break
                pending.popleft()
                sender = self.classes.sender(mgr, self.bootstrap_addr, room)
                sender.init(npages)
                if fill:
                    fill_pages(self.args, pages, room)
                if self.args.staging is not None:   # device KV: the backend reads the pinned host copy
                    self.args.staging.to_host(pages)
                inflight[room] = [sender, pages, False, None]
                last_activity = time.monotonic()
            version = mgr.status.version()
            changed = False
            for room in list(inflight):
                sender, pages, sent, ts = inflight[room]
                st = sender.poll()
                if st == KVPoll.WaitingForInput and not sent:
                    inflight[room][2] = True
                    inflight[room][3] = time.monotonic()
                    first_send = first_send or inflight[room][3]
                    sender.send(pages)
                    changed = True
                elif st in TERMINAL:
                    done = time.monotonic()
                    last_done = done
                    reason = None if st == KVPoll.Success else mgr.failure_reasons.get(room, "failed")
                    res.requests.append(RequestResult(
                        room=room, status=st.name, pages=len(pages),
                        bytes=len(pages) * sum(self.args.kv_item_lens) if st == KVPoll.Success else 0,
                        latency_s=(done - ts) if ts else None, reason=reason))
                    self.allocator.free(pages)
                    sender.clear()
                    del inflight[room]
                    if reactive:
                        seen.discard(room)
                    last_activity = done
                    changed = True
            if not changed:
                mgr.status.wait_for_change(version, 0.02)
        return _finish(res, self.allocator, t0, first_send, last_done)

    def _give_up(self, pending: deque, inflight: Dict[int, list], res: SideResult, pages_per_request,
                 reason: str, sent_too: bool = False) -> None:
        """Fail the rooms not started (``pending``) and those whose pages were never sent (or all
        of ``inflight`` with ``sent_too``); the serve loop then collects the failed ones."""
        for item in pending:
            room, npages = item if isinstance(item, tuple) else (item, pages_per_request)
            res.requests.append(RequestResult(room=room, status="Failed", pages=npages or 0, bytes=0,
                                              reason=reason))
        pending.clear()
        for room, (sender, pages, sent, ts) in inflight.items():
            if sent_too or not sent:
                self.mgr.fail(room, reason)

    def close(self) -> None:
        try:
            self.mgr.close()
        finally:
            if self.server is not None:
                self.server.close()


# ------------------------------------------------------------------------------------ decode
@dataclass
class _Held:
    """Pages of a failed request kept out of the allocator until no late write can land."""
    room: int
    recv: Any
    pages: List[int]
    since: float
    deadline: float


class DecodeWorker:
    def __init__(self, record, *, host: str = DEFAULT_HOST, source: Optional[KVBufferSource] = None,
                 allocator=None, geometry: Optional[PlainBufferShape] = None, env: Optional[DisaggEnv] = None,
                 classes: Optional[BackendClasses] = None, is_device: Optional[Callable[[torch.Tensor], bool]] = None):
        name = resolve_backend_name(record.disaggregation_transfer_backend)
        self.backend = name
        self.classes = classes or backend_classes(name)
        self.source, self.allocator, self.args = _kv_side(record, source, allocator, geometry,
                                                          _role_class(self.classes, "decode"), is_device)
        self.mgr = self.classes.manager(self.args, "decode", record, host=host, env=env)
        self.fake = name == "fake"
        self.quarantine: List[_Held] = []
        self.releases: List[Tuple[int, str, float]] = []   # (room, "confirmed" | "timeout", seconds held)
        logger.info("role=decode backend=%s control=%s buffers=%s", name,
                    "none (fake)" if self.fake else f"tcp://{self.mgr.endpoint}", _registration(self.args))

    def endpoints(self) -> Dict[str, Any]:
        if self.fake:
            return {}
        ep = {"control": f"tcp://{self.mgr.endpoint}"}
        if hasattr(self.mgr, "mc_session"):
            ep["mooncake_session"] = self.mgr.mc_session
        return ep

    # ---------------------------------------------------------------- deferred release
    @staticmethod
    def _release_safe(recv) -> bool:
        fn = getattr(recv, "is_abort_release_safe", None)
        return True if fn is None else bool(fn())

    def _release_timeout(self) -> float:
        return float(getattr(self.mgr, "deferred_release_timeout", 30.0))

    def release_quarantined(self) -> int:
        """Free the held pages that became safe (or whose hold timed out); returns pages freed."""
        if not self.quarantine:
            return 0
        now = time.monotonic()
        keep, freed = [], 0
        for h in self.quarantine:
            safe = self._release_safe(h.recv)
            if safe or now >= h.deadline:
                if not safe:
                    logger.warning("[decode] room %d: no confirmation from prefill within %.1fs; releasing its "
                                   "%d pages (SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT)",
                                   h.room, now - h.since, len(h.pages))
                self.allocator.free(h.pages)
                h.recv.clear()
                freed += len(h.pages)
                self.releases.append((h.room, "confirmed" if safe else "timeout", now - h.since))
            else:
                keep.append(h)
        self.quarantine = keep
        return freed

    def drain_quarantine(self, timeout: Optional[float] = None) -> int:
        """Wait until no pages are held (at most ``timeout`` s, default: the holds' own deadlines)."""
        end = time.monotonic() + (timeout if timeout is not None else self._release_timeout() + 1.0)
        self.release_quarantined()
        while self.quarantine and time.monotonic() < end:
            time.sleep(0.01)
            self.release_quarantined()
        return sum(len(h.pages) for h in self.quarantine)

    def _settle_failed(self, recv, room: int, pages: List[int]) -> str:
        """A failed request: free its pages now if no late write can land in them, else hold them."""
        notify = getattr(recv, "ensure_abort_notified", None)
        if notify is not None:
            notify()
        if self._release_safe(recv):
            self.allocator.free(pages)
            recv.clear()
            return "now"
        now = time.monotonic()
        self.quarantine.append(_Held(room, recv, list(pages), now, now + self._release_timeout()))
        logger.info("[decode] room %d failed after prefill got its pages; holding %d pages until prefill "
                    "confirms it stopped writing (at most %.1fs)", room, len(pages), self._release_timeout())
        return "deferred"

    # ---------------------------------------------------------------- fetch
    def _give_up_on(self, pending: deque, res: SideResult, pages_per_request: int, reason: str) -> None:
        """Fail every request not issued yet with ``reason`` (they never got pages)."""
        for room in pending:
            res.requests.append(RequestResult(room=room, status="Failed", pages=pages_per_request, bytes=0,
                                              reason=reason))
        pending.clear()

    def _prefill_gone(self, addr: Optional[str]) -> Optional[str]:
        """Why no more requests should go to ``addr`` (lost, unreachable or misconfigured), or None."""
        mgr = self.mgr
        mismatch = getattr(mgr, "config_mismatch", {}).get(addr)
        if mismatch is not None:
            return str(mismatch)
        return getattr(mgr, "lost_prefills", {}).get(addr)

    def fetch(self, prefill_addr: Optional[str], rooms: Sequence[int], pages_per_request: int, *,
              max_inflight: int = 8, timeout: Optional[float] = None, verify: bool = True) -> SideResult:
        """Receive ``rooms`` from the prefill at ``prefill_addr`` (``host:bootstrap_port``).

        Raises :class:`PeerConfigError` when the prefill is configured inconsistently with this
        decode (e.g. checksums on one side only): that is not a per-request failure.
        """
        mgr = self.mgr
        if hasattr(mgr, "forget_lost"):
            mgr.forget_lost(prefill_addr)
        pending = deque(rooms)
        inflight: Dict[int, list] = {}
        res = SideResult("decode", self.backend, dict(self.endpoints(), prefill=prefill_addr),
                         _registration(self.args))
        t0 = time.monotonic()
        deadline = t0 + timeout if timeout else None
        first_send = last_done = None
        status_table = getattr(mgr, "status", None)
        while pending or inflight:
            self.release_quarantined()
            gone = self._prefill_gone(prefill_addr)
            if gone and pending:
                logger.error("[decode] %s; not issuing the %d remaining request(s)", gone, len(pending))
                self._give_up_on(pending, res, pages_per_request, f"not issued: {gone}")
            if deadline is not None and time.monotonic() > deadline:
                for room, item in inflight.items():
                    if hasattr(mgr, "fail"):
                        mgr.fail(room, "decode run deadline exceeded")
                    else:
                        item[0].abort()
                self._give_up_on(pending, res, pages_per_request,
                                 "decode run deadline exceeded before the request was issued")
                deadline = None
            while pending and len(inflight) < max_inflight and not self._prefill_gone(prefill_addr):
                pages = self.allocator.alloc(pages_per_request)
                if pages is None:
                    break
                room = pending.popleft()
                recv = self.classes.receiver(mgr, prefill_addr or "2.2.2.2:0", room)
                recv.init(0)
                ts = time.monotonic()
                first_send = first_send or ts
                recv.send_metadata(pages)
                inflight[room] = [recv, pages, ts]
            if pending and not inflight:
                if self._prefill_gone(prefill_addr):
                    continue   # the top of the loop fails them with the reason
                if not self.quarantine:   # nothing will ever be freed: the request cannot fit
                    self._give_up_on(pending, res, pages_per_request,
                                     f"{pages_per_request} KV pages do not fit in this decode's pool")
                    break
                time.sleep(0.01)   # waiting for quarantined pages to be released
                continue
            version = status_table.version() if status_table is not None else 0
            changed = False
            for room in list(inflight):
                recv, pages, ts = inflight[room]
                st = recv.poll()
                if st not in TERMINAL:
                    continue
                done = time.monotonic()
                last_done = done
                ok = st == KVPoll.Success
                if ok and self.args.staging is not None:   # device KV: bring the received pages home
                    self.args.staging.to_device(pages)
                verified = None
                if ok and verify and not self.fake:
                    verified = check_pages(self.args, pages, room)
                reason = None
                if not ok:
                    reason = getattr(mgr, "failure_reasons", {}).get(room, "failed")
                elif verified is False:
                    reason = "received bytes differ from what prefill sent"
                checksum = getattr(mgr, "checksum_results", {}).get(room)
                release = None
                if ok:
                    self.allocator.free(pages)
                    recv.clear()
                else:
                    release = self._settle_failed(recv, room, pages)
                res.requests.append(RequestResult(
                    room=room, status=st.name if verified is not False else "Failed", pages=len(pages),
                    bytes=len(pages) * sum(self.args.kv_item_lens) if ok else 0,
                    latency_s=done - ts, reason=reason,
                    checksum=checksum, verified=verified, release=release))
                del inflight[room]
                changed = True
            if inflight and not changed:
                if status_table is not None:
                    status_table.wait_for_change(version, 0.02)
                else:
                    time.sleep(0.001)
        self.release_quarantined()
        out = _finish(res, self.allocator, t0, first_send, last_done)
        out.quarantined_pages = sum(len(h.pages) for h in self.quarantine)
        mismatch: Optional[PeerConfigError] = getattr(mgr, "config_mismatch", {}).get(prefill_addr)
        if mismatch is not None:
            raise mismatch
        return out

    def close(self) -> None:
        self.mgr.close()


# ------------------------------------------------------------------------------------ roles
def _rooms(requests: int, room_base: int) -> List[int]:
    return list(range(room_base, room_base + int(requests)))


def run_prefill(record, *, requests: Optional[int], pages_per_request: Optional[int] = None,
                host: str = DEFAULT_HOST, bootstrap_port: Optional[int] = None, room_base: int = 1,
                geometry: Optional[PlainBufferShape] = None, max_inflight: int = 32, timeout: Optional[float] = None,
                idle_timeout: Optional[float] = None, stop: Optional[threading.Event] = None,
                ready=None, fill: bool = True, warmup: int = 0) -> SideResult:
    """Prefill role. ``requests=None`` serves whatever decode asks for until ``stop``/``idle_timeout``.

    ``ready``, if given, is called with the endpoints once the bootstrap server is up.
    """
    w = PrefillWorker(record, host=host, bootstrap_port=bootstrap_port, geometry=geometry)
    try:
        if ready is not None:
            ready(w.endpoints())
        rooms = None if requests is None else _rooms(requests + warmup, room_base - warmup)
        res = w.serve(rooms, pages_per_request=pages_per_request, max_inflight=max_inflight,
                      timeout=timeout, stop=stop, idle_timeout=idle_timeout, fill=fill)
        if warmup:
            res.requests = [r for r in res.requests if r.room >= room_base]
        return res
    finally:
        w.close()


def run_decode(record, *, prefill_addr: Optional[str], requests: int, pages_per_request: int,
               host: str = DEFAULT_HOST, room_base: int = 1, geometry: Optional[PlainBufferShape] = None,
               max_inflight: int = 8, timeout: Optional[float] = None, verify: bool = True,
               warmup: int = 0) -> SideResult:
    """Decode role: fetch ``requests`` requests of ``pages_per_request`` pages from ``prefill_addr``.

    ``warmup`` extra requests (rooms just below ``room_base``) run first and are not reported.
    """
    w = DecodeWorker(record, host=host, geometry=geometry)
    try:
        if warmup:
            w.fetch(prefill_addr, _rooms(warmup, room_base - warmup), pages_per_request,
                    max_inflight=max_inflight, timeout=timeout, verify=False)
        return w.fetch(prefill_addr, _rooms(requests, room_base), pages_per_request,
                       max_inflight=max_inflight, timeout=timeout, verify=verify)
    finally:
        w.close()
