"""``nixl``: NVIDIA NIXL agents (one-sided WRITEs into decode's registered buffers, with a notification).

Optional. Install after a CPU torch (never let pip resolve the meta package ``nixl``, whose
dependencies pull a CUDA torch and ``nixl-cu13`` of several GB)::

    pip install --no-deps nixl-cu12==1.5.1 nixl==1.5.1

``from nixl._api import ...`` is tried first (the reference's import), then ``nixl_cu12._api``
(the wheel that does the work; ``nixl`` only re-exports it), so ``nixl-cu12`` alone is enough.
If neither imports, the registry raises :class:`BackendUnavailableError` naming the command above.

How it maps onto the reference's ``NixlKVManager`` (``D/nixl/conn.py``):

* **One agent per side**, named ``uuid4()``, ``nixl_agent_config(backends=[], num_threads=8 on
  prefill / 0 on decode, sync_mode=NIXL_THREAD_SYNC_STRICT)`` (the transfer workers and the
  control thread use the agent concurrently). ``agent.create_backend(SGLANG_DISAGGREGATION_NIXL_BACKEND
  (default "UCX"), params)`` where params is the JSON object (str -> str) in
  ``SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS`` (default ``{}``); ``num_threads`` is added to the
  UCX/OBJ params on prefill unless given there. Agent creation + ``create_backend`` run under
  ``SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT`` (60 s). A backend that is not in
  ``agent.get_plugin_list()`` raises ``ValueError`` naming the available plugins.
  **Deviation:** NIXL's own progress thread is off unless ``SGLANG_HYDRA_NIXL_PROGRESS_THREAD=1``.
  The Python wrapper runs it with no delay, so an idle agent burns a whole core (measured 0.97
  CPU-s per s); on a 2-core box the two sides' spinning threads cut a 64 MiB WRITE from ~11 GB/s
  to ~3 GB/s. Without it the UCX workers progress when we poll: prefill's transfer workers call
  ``check_xfer_state`` and decode's notification thread calls ``get_new_notifs`` (every 1 ms while
  it has rooms in flight, 20 ms when idle).
* **Memory**: every KV buffer the side built (``KVArgs.kv_data_ptrs/lens``, i.e. the pools from
  ``sglang_hydra.memory.build_memory``) is registered with one ``register_memory``: as ``"DRAM"``
  for host buffers, as ``"VRAM"`` (with the CUDA device index) when the KV lives in GPU memory.
  Each side tells the other its memory type and device in the registration extras, so a WRITE
  can go GPU -> GPU, GPU -> host or host -> GPU.
* **Metadata exchange** rides the existing control plane: decode's ZMQ ``REGISTER`` message carries
  ``{"nixl_agent": name, "nixl_metadata": base64(agent.get_agent_metadata())}`` in its ``extra``;
  prefill calls ``add_remote_agent`` on it (the registration log shows only its size). A peer whose
  metadata NIXL dropped is re-added before the next transfer, as the reference's
  ``_reload_invalidated_peers``.
* **Data**: per request, the merged page runs (``group_contiguous_runs`` -> one descriptor per
  buffer and run, all K layers then all V layers) become two ``get_xfer_descs`` lists and one
  ``initialize_xfer("WRITE", local, remote, peer, notif=b"kv:<room>")`` + ``transfer``
  (``start_transfer``); the common transfer worker then polls ``check_xfer_state``
  (``progress_transfer``) with other requests in flight, until ``DONE`` or ``ERR``, bounded by
  ``SGLANG_HYDRA_DISAGG_PREFILL_SEND_TIMEOUT`` + 10 ms per MB. NIXL itself refuses descriptors
  outside the peer's registered regions (``NIXL_ERR_NOT_FOUND``, nothing posted) and a vanished
  peer (``NIXL_ERR_REMOTE_DISCONNECT``); both become rc -1. A synchronous ``transfer()`` is kept
  for callers without those hooks.
* **Status** goes over the existing ZMQ ``KV_STATUS`` messages (as the reference: not over NIXL
  notifications). Decode additionally holds a ``Success`` until the transfer's notification
  ``kv:<room>`` has arrived (the notification is delivered after the data), like the reference's
  metadata gate; if it does not come within the send timeout the request fails.
* **Failure**: rc -1 -> the common worker concludes the room ``Failed`` and pushes ``KV_STATUS``
  Failed to decode; both sides free the pages and keep serving. A failure is reported *settled*
  (no byte of the room can land any more, so decode may reuse the pages at once) when nothing was
  posted, when the handle ended in ``ERR``, or when the handle could be released (cancelled). A
  handle still in flight past the deadline that NIXL refuses to cancel gets
  ``NIXL_ERR_SETTLE_TIMEOUT_S`` (5 s) more and is then reported *unsettled* (decode keeps the
  pages until ``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT``).
  Decode proves a lost prefill unable to write when its control port refuses connections (the
  agent lives in that process): ``prefill_writes_impossible``.

UCX environment defaults (set in ``os.environ`` before the agent is created, only when unset):

* ``UCX_NET_DEVICES=lo`` when this side's host is a loopback address and no
  ``--disaggregation-ib-device`` is given (otherwise UCX also opens ``tcp/eth0``). With an IB
  device the reference passes it as the UCX ``device_list`` param, and so do we.
* ``UCX_MODULES=cma`` when the machine has no RDMA device (``/sys/class/infiniband`` empty) and
  the NIXL backend is UCX. This loads only the CMA module (``process_vm_writev``; TCP, self and
  shared memory are built into ``libuct``), which is the fast loopback path (4-6 GB/s measured,
  TCP alone ~0.3-1 GB/s). It also avoids the **exit crash**: with Debian ``ibverbs-providers``
  installed, the bundled UCX EFA module dlopens the system ``libefa``/``libibverbs``, which drags a
  second ``libnl`` into the process, and every process that created a UCX backend segfaults in
  ``_dl_fini`` (``rtnl_tc_unregister``) after the work is done. Not installing
  ``ibverbs-providers`` (only ``libibverbs1`` with ``--no-install-recommends``) also avoids it.
  Set ``UCX_MODULES`` yourself to override (``UCX_MODULES=all`` is UCX's own default; an empty
  value loads no module at all and leaves TCP only).

``UCX_TLS=sm,self`` does not work (NIXL needs peer-failure handling, which UCX shared memory lacks).
"""
from __future__ import annotations

import base64
import importlib
import ipaddress
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from sglang_hydra.utils.envflags import env_flag, env_str

from ..base import BackendClasses, BackendUnavailableError
from ..bootstrap import BootstrapServer
from ..decode_side import CommonKVReceiver, DecodeKVManager
from ..manager import role_dispatch
from ..prefill_side import CommonKVSender, PrefillKVManager
from ..states import KVPoll
from .native import has_rdma_devices, with_deadline

logger = logging.getLogger("sglang_hydra.disagg.nixl")

INSTALL_COMMAND = "pip install --no-deps nixl-cu12==1.5.1 nixl==1.5.1"
INSTALL_HINT = (f"the 'nixl' transfer backend needs the NIXL Python package (nixl-cu12): `{INSTALL_COMMAND}` "
                "after a CPU torch (`--no-deps`: resolving the meta package `nixl` pulls a CUDA torch "
                "and nixl-cu13); use 'mooncake', 'mooncake_tcp' or 'zmq' otherwise")
NIXL_ERR_SETTLE_TIMEOUT_S = 5.0
DEFAULT_BACKEND = "UCX"
PREFILL_NUM_THREADS = 8  # the reference's value; override with SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS
PROGRESS_THREAD_ENV = "SGLANG_HYDRA_NIXL_PROGRESS_THREAD"
NOTIF_PREFIX = b"kv:"
_API_MODULES = ("nixl._api", "nixl_cu12._api")


def import_nixl_api():
    """The NIXL Python API module (``nixl._api`` or ``nixl_cu12._api``), or BackendUnavailableError."""
    errors = []
    for name in _API_MODULES:
        try:
            mod = importlib.import_module(name)
            mod.nixl_agent, mod.nixl_agent_config  # noqa: B018 - both must exist
            return mod
        except Exception as e:  # ImportError, or OSError from a missing native library
            errors.append(f"{name}: {type(e).__name__}: {e}")
    raise BackendUnavailableError(f"{INSTALL_HINT}; import failed ({'; '.join(errors)})")


def nixl_available() -> bool:
    try:
        import_nixl_api()
        return True
    except Exception:
        return False


available = nixl_available


def _is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def apply_ucx_env_defaults(host: str, ib_device: Optional[str], backend: str = DEFAULT_BACKEND) -> Dict[str, str]:
    """Set the safe UCX defaults described in the module docstring; returns what was set."""
    applied: Dict[str, str] = {}
    if backend != "UCX":
        return applied
    if "UCX_NET_DEVICES" not in os.environ and not ib_device and _is_loopback(host):
        os.environ["UCX_NET_DEVICES"] = applied["UCX_NET_DEVICES"] = "lo"
    if "UCX_MODULES" not in os.environ and not has_rdma_devices():
        os.environ["UCX_MODULES"] = applied["UCX_MODULES"] = "cma"
    return applied


def backend_params_from_env() -> Tuple[str, Dict[str, str]]:
    backend = env_str("SGLANG_DISAGGREGATION_NIXL_BACKEND", DEFAULT_BACKEND)
    raw = env_str("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", "{}")
    try:
        params = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS is not valid JSON ({e}): {raw!r}") from e
    if not isinstance(params, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        raise ValueError("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS must be a JSON object "
                         "with string keys and string values")
    return backend, params



def _name(x) -> str:
    return x.decode() if isinstance(x, (bytes, bytearray)) else str(x)


def _notif(room: int) -> bytes:
    return NOTIF_PREFIX + str(int(room)).encode()


def _room_of(msg: bytes) -> Optional[int]:
    if not msg.startswith(NOTIF_PREFIX):
        return None
    try:
        return int(msg[len(NOTIF_PREFIX):])
    except ValueError:
        return None


class _Xfer:
    """One posted WRITE (prefill side)."""
    __slots__ = ("handle", "session", "peer_name", "state", "deadline", "started", "error")

    def __init__(self, handle, session: str, peer_name: str, state: str, deadline: float):
        self.handle, self.session, self.peer_name, self.state = handle, session, peer_name, state
        self.deadline, self.started, self.error = deadline, time.monotonic(), ""


class NixlAgent:
    """The NIXL agent both roles bring up (module docstring: config, memory, UCX defaults)."""
    backend_name = "nixl"
    # NIXL registers GPU memory itself ("VRAM" segments): device KV buffers need no staging
    device_memory = True

    # ------------------------------------------------------------------------- engine
    def init_engine(self) -> None:
        try:
            self._init_agent()
        except BaseException:
            # CommonKVManager.__init__ has bound its control socket already; a half-built manager
            # must not leave it (and its zmq context) to the garbage collector, whose ctx.term()
            # can block the interpreter
            try:
                self._pull.close(0)
                self._ctx.term()
            except Exception:
                logger.debug("nixl: closing the control socket after a failed init failed", exc_info=True)
            raise

    def _init_agent(self) -> None:
        api = import_nixl_api()
        backend, params = backend_params_from_env()
        applied = apply_ucx_env_defaults(self.host, self.args.ib_device, backend)
        if backend == "UCX" and self.args.ib_device and "UCX_NET_DEVICES" not in os.environ:
            params.setdefault("device_list", self.args.ib_device)
        num_threads = PREFILL_NUM_THREADS if self.mode == "prefill" else 0
        if num_threads > 0:
            # as the reference: NIXL does not pass nixl_agent_config.num_threads to explicitly created backends
            if backend in ("UCX", "OBJ"):
                params.setdefault("num_threads", str(num_threads))
            elif backend == "GDS_MT":
                params.setdefault("thread_count", str(num_threads))
            elif backend == "UCCL":
                params.setdefault("num_cpus", str(num_threads))
        self.agent_name = str(uuid.uuid4())
        self.progress_thread = env_flag(PROGRESS_THREAD_ENV, False)

        def create():
            sync = getattr(api, "nixl_thread_sync_t", None)
            kw = {"sync_mode": sync.NIXL_THREAD_SYNC_STRICT} if sync is not None else {}
            agent = api.nixl_agent(self.agent_name, api.nixl_agent_config(
                backends=[], num_threads=num_threads, enable_prog_thread=self.progress_thread, **kw))
            plugins = list(agent.get_plugin_list())
            if backend not in plugins:
                raise ValueError(f"NIXL backend {backend!r} not found. Available: {plugins}. Set "
                                 "SGLANG_DISAGGREGATION_NIXL_BACKEND to one of them or install the plugin.")
            agent.create_backend(backend, params)
            return agent

        self.agent = with_deadline(create, self.env.engine_init_timeout, f"NIXL agent / create_backend({backend})", thread_name="nixl-init")
        self.nixl_backend = backend
        pairs = sorted({(p, n) for p, n in zip(self.args.kv_data_ptrs, self.args.kv_data_lens) if n > 0})
        self.mem_type = "VRAM" if self.args.memory_kind == "device" else "DRAM"
        dev = int(self.args.device_index or 0)
        self._reg_descs = (self.agent.register_memory([(p, n, dev, "") for p, n in pairs], self.mem_type)
                           if pairs else None)
        self.agent_metadata = bytes(self.agent.get_agent_metadata())
        self._nixl_lock = threading.Lock()
        # prefill: decode session -> (remote agent name or None, metadata, why None)
        self._remote: Dict[str, Tuple[Optional[str], bytes, str]] = {}
        self._unreleased: List[Any] = []
        self._probe_cache: Dict[str, Tuple[float, bool]] = {}
        # decode: rooms whose notification arrived / whose Success waits for its notification
        self._notified: Dict[int, float] = {}
        self._pending: Dict[int, Tuple[Any, float]] = {}
        self._notif_wake = threading.Event()
        self._notif_thread = None
        logger.info("nixl agent %s up: backend=%s params=%s, %d %s regions registered (%d bytes), metadata %d bytes, "
                    "progress thread %s, UCX defaults applied %s (UCX_NET_DEVICES=%s UCX_MODULES=%s)",
                    self.agent_name[:8], backend, params, len(pairs), self.mem_type, sum(n for _, n in pairs),
                    len(self.agent_metadata),
                    "on" if self.progress_thread else "off", applied or "none",
                    os.environ.get("UCX_NET_DEVICES"), os.environ.get("UCX_MODULES"))

    def registration_extra(self) -> Dict[str, Any]:
        return {"nixl_agent": self.agent_name, "nixl_mem": self.mem_type,
                "nixl_device": int(self.args.device_index or 0),
                "nixl_metadata": base64.b64encode(self.agent_metadata).decode("ascii")}

    def close_engine(self) -> None:
        if self._notif_thread is not None:
            self._notif_wake.set()
            self._notif_thread.join(timeout=2)
        agent = getattr(self, "agent", None)
        if agent is None:
            return
        for h in self._unreleased:
            try:
                agent.release_xfer_handle(h)
            except Exception:
                logger.debug("nixl: could not release a transfer handle at close", exc_info=True)
        self._unreleased.clear()
        for name, _, _ in list(self._remote.values()):
            if name:
                try:
                    agent.remove_remote_agent(name)
                except Exception:
                    pass
        try:
            if self._reg_descs is not None:
                agent.deregister_memory(self._reg_descs)
        except Exception:
            logger.debug("nixl deregister failed", exc_info=True)
        self._reg_descs = None
        self.agent = None



class NixlPrefillManager(NixlAgent, PrefillKVManager):
    """One WRITE per room, polled by the common transfer workers."""

    def on_peer_registered(self, peer) -> None:
        extra = peer.reg.extra or {}
        session = peer.reg.session
        try:
            meta = base64.b64decode(extra["nixl_metadata"])
        except (KeyError, ValueError) as e:
            self._remote[session] = (None, b"", f"decode registered without NIXL agent metadata ({e!r})")
            return
        try:
            with self._nixl_lock:
                name = _name(self.agent.add_remote_agent(meta))
        except Exception as e:
            self._remote[session] = (None, meta, f"add_remote_agent failed: {type(e).__name__}: {e}")
            logger.warning("[prefill] could not load NIXL metadata of decode %s: %s", session[:8], e)
            return
        self._remote[session] = (name, meta, "")
        extra["nixl_metadata"] = f"<{len(meta)} bytes, loaded>"  # keep the registration log line short
        logger.info("[prefill] NIXL remote agent %s loaded for decode %s", name[:8], session[:8])
        # connect now, off the control thread, so the first request does not pay for it
        threading.Thread(target=self._connect, args=(name,), daemon=True, name="nixl-connect").start()

    def _connect(self, name: str) -> None:
        try:
            agent = self.agent
            if agent is not None:
                agent.make_connection(name)
        except Exception as e:  # the first transfer connects (or fails) by itself
            logger.debug("[prefill] NIXL make_connection(%s) failed: %s", name[:8], e)

    def _peer_name(self, session: str) -> Tuple[Optional[str], str]:
        name, meta, err = self._remote.get(session, (None, b"", "decode registered no NIXL agent"))
        if name is None:
            return None, err
        if not self.agent.check_remote_metadata(name):
            # NIXL dropped the peer (after a disconnect): re-add it, as the reference's
            # _reload_invalidated_peers (a dead peer then fails the transfer itself)
            try:
                with self._nixl_lock:
                    name = _name(self.agent.add_remote_agent(meta))
                self._remote[session] = (name, meta, "")
                logger.info("[prefill] NIXL metadata of decode %s reloaded", session[:8])
            except Exception as e:
                return None, f"reloading NIXL metadata of the decode failed: {type(e).__name__}: {e}"
        return name, ""

    def _release(self, handle) -> bool:
        """Release (cancelling if still active) a transfer handle; False if NIXL refused."""
        try:
            self.agent.release_xfer_handle(handle)
            return True
        except Exception:
            return False

    def start_transfer(self, peer, room: int, entries) -> Any:
        """Post the request's WRITE (one descriptor per buffer and merged page run) with its notification."""
        if not entries:
            return (0, "", True)
        session = peer.reg.session
        name, err = self._peer_name(session)
        if name is None:
            return (-1, err, True)
        arr = np.asarray(entries, dtype=np.uint64).reshape(-1, 3)
        extra = peer.reg.extra or {}
        here = np.full(len(arr), int(self.args.device_index or 0), dtype=np.uint64)
        there = np.full(len(arr), int(extra.get("nixl_device", 0)), dtype=np.uint64)
        handle = None
        try:
            local = self.agent.get_xfer_descs(np.stack([arr[:, 0], arr[:, 2], here], axis=1), self.mem_type)
            remote = self.agent.get_xfer_descs(np.stack([arr[:, 1], arr[:, 2], there], axis=1),
                                               str(extra.get("nixl_mem", "DRAM")))
            handle = self.agent.initialize_xfer("WRITE", local, remote, name, _notif(room))
            state = self.agent.transfer(handle)
        except Exception as e:
            # nixlNotFoundError: a descriptor outside the peer's registered regions (nothing posted);
            # nixlRemoteDisconnectError: the peer is gone
            if handle is not None and not self._release(handle):
                self._unreleased.append(handle)
                return (-1, f"NIXL WRITE failed: {type(e).__name__}: {e}", False)
            return (-1, f"NIXL WRITE failed: {type(e).__name__}: {e}", True)
        budget = max(self.env.prefill_send_timeout, 1.0) + float(arr[:, 2].sum()) / 1e8
        return _Xfer(handle, session, name, state, time.monotonic() + budget)

    def progress_transfer(self, h, stop_submitting: bool):
        """``None`` while the WRITE is in flight, else ``(rc, reason, settled)``.

        Everything is posted at once, so an abort (``stop_submitting``) just waits for the posted
        WRITE to settle. Past the deadline the handle is cancelled (released); if NIXL refuses, it
        gets ``NIXL_ERR_SETTLE_TIMEOUT_S`` more, then the room is failed as *unsettled*.
        """
        if not isinstance(h, _Xfer):
            return h
        if h.state == "PROC":
            try:
                h.state = self.agent.check_xfer_state(h.handle)
            except Exception as e:
                h.state, h.error = "ERR", f"{type(e).__name__}: {e}"
        if h.state == "DONE":
            self._release(h.handle)
            return (0, "", True)
        if h.state != "PROC":
            settled = self._release(h.handle)
            if not settled:
                self._unreleased.append(h.handle)
            return (-1, f"NIXL WRITE to agent {h.peer_name[:8]} ended in state {h.state} {h.error}".rstrip(), settled)
        now = time.monotonic()
        if now > h.deadline:
            why = f"NIXL WRITE still in progress after {h.deadline - h.started:.1f}s"
            if self._release(h.handle):
                return (-1, why + "; cancelled", True)
            if now > h.deadline + NIXL_ERR_SETTLE_TIMEOUT_S:
                self._unreleased.append(h.handle)
                return (-1, why + "; could not be cancelled, writes may still land", False)
        return None

    def abandon_transfer(self, h) -> None:
        if isinstance(h, _Xfer) and h.state == "PROC" and not self._release(h.handle):
            self._unreleased.append(h.handle)

    def transfer(self, peer, room: int, entries) -> Tuple[int, str]:
        """The synchronous form (start + poll until concluded), for callers without the async hooks."""
        h = self.start_transfer(peer, room, entries)
        spins = 0
        while True:
            res = self.progress_transfer(h, False)
            if res is not None:
                return res[0], res[1]
            spins += 1
            if spins > 64:
                time.sleep(0.0002)



class NixlDecodeManager(NixlAgent, DecodeKVManager):
    """Holds a room's Success until its NIXL notification arrived (the data landed)."""
    late_writes_possible = True    # one-sided: prefill writes into our buffers without us

    def init_engine(self) -> None:
        super().init_engine()
        self._notif_thread = threading.Thread(target=self._notif_loop, daemon=True, name="nixl-notifs")
        self._notif_thread.start()

    # a prefill whose control socket refuses connections is gone (its NIXL agent lives in the same
    # process and the socket closes only after the transfer workers stopped)
    def prefill_writes_impossible(self, endpoint: str) -> bool:
        now = time.monotonic()
        t, dead = self._probe_cache.get(endpoint, (0.0, False))
        if dead or now - t < 0.5:
            return dead
        host, _, port = endpoint.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=0.5):
                dead = False
        except ConnectionRefusedError:
            dead = True
        except (OSError, ValueError):
            dead = False   # unreachable is not proof
        self._probe_cache[endpoint] = (now, dead)
        return dead

    def _on_status(self, msg) -> None:
        room = msg.room
        if msg.status == KVPoll.Success and self._room_pages.get(room):
            with self._nixl_lock:
                if self._notified.pop(room, None) is None:
                    self._pending[room] = (msg, time.monotonic() + self.env.prefill_send_timeout)
                    self._notif_wake.set()
                    return
        elif msg.status == KVPoll.Failed:
            with self._nixl_lock:
                self._pending.pop(room, None)
                self._notified.pop(room, None)
        super()._on_status(msg)

    def _notif_loop(self) -> None:
        """Decode: progress the agent, match notifications to rooms, release held Successes."""
        while not self._stop.is_set():
            try:
                self._notif_step()
            except Exception:  # this thread must outlive any single bad iteration
                if self._stop.is_set():
                    return
                logger.exception("[decode] NIXL notification loop error")
                time.sleep(0.05)

    def _notif_step(self) -> None:
        with self._nixl_lock:
            busy = bool(self._pending)
        if busy:
            time.sleep(0.0002)
        else:
            # rooms whose pages prefill knows need this side to progress UCX (notifications, and
            # wire-up / TCP-emulated writes when there is no progress thread). The thread starts
            # inside init_engine, before CommonKVManager creates _room_pages.
            self._notif_wake.wait(0.001 if getattr(self, "_room_pages", None) else 0.02)
            self._notif_wake.clear()
        agent = self.agent
        if agent is None:
            return
        notifs = agent.get_new_notifs()
        ready = []
        now = time.monotonic()
        with self._nixl_lock:
            for msgs in notifs.values():
                for m in msgs:
                    room = _room_of(bytes(m))
                    if room is None:
                        continue
                    if room in self._pending:
                        ready.append(self._pending.pop(room)[0])
                    else:
                        self._notified[room] = now
            expired = [r for r, (_, dl) in self._pending.items() if now > dl]
            for r in expired:
                del self._pending[r]
            if len(self._notified) > 4096:  # notifications of rooms nobody waits for any more
                for r, t in list(self._notified.items()):
                    if now - t > 600:
                        del self._notified[r]
        for m in ready:
            super()._on_status(m)
        for r in expired:
            self.fail(r, f"prefill reported Success for room {r} but its NIXL notification did not arrive "
                         f"within {self.env.prefill_send_timeout}s")

    def forget_room(self, room: int) -> None:
        with self._nixl_lock:
            self._notified.pop(room, None)
            self._pending.pop(room, None)


NixlKVManager = role_dispatch("NixlKVManager", NixlPrefillManager, NixlDecodeManager)


class NixlKVSender(CommonKVSender):
    pass


class NixlKVReceiver(CommonKVReceiver):
    def __init__(self, mgr: NixlDecodeManager, bootstrap_addr: str, bootstrap_room: Optional[int] = None, **kw):
        mgr.forget_room(int(bootstrap_room))  # a stale notification of an earlier request with this room
        super().__init__(mgr, bootstrap_addr, bootstrap_room, **kw)

    def clear(self) -> None:
        self.mgr.forget_room(self.room)
        super().clear()


class NixlKVBootstrapServer(BootstrapServer):
    pass


def backend_classes() -> BackendClasses:
    import_nixl_api()   # BackendUnavailableError naming the install command when NIXL is missing
    return BackendClasses(NixlKVManager, NixlKVSender, NixlKVReceiver, NixlKVBootstrapServer)
