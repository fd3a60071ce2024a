"""``mooncake`` L3 storage: the Mooncake Store (``mooncake.store.MooncakeDistributedStore``).

The store ships in the same wheel as the transfer engine the disaggregation backend uses
(``mooncake-transfer-engine-non-cuda`` on CPU machines, plus Debian ``libibverbs1``). It has
two parts:

* a **master** (``mooncake_master``, a binary in the wheel) that keeps object metadata,
  allocates space and evicts;
* **clients** (this backend) that each may contribute a memory segment
  (``global_segment_size``) to the pool and move page bytes with the transfer engine (TCP here;
  RDMA where there is an HCA). Page bytes live in the segments, never in the master.

One page is one object. The key is ``[{extra_backend_tag}_][{model}_]{page_hash}{suffix}`` with
the reference's rank suffix (``_{tp_rank}`` for MHA, none for MLA, ``_{pp_rank}`` added with
PP). The reference splits a page into ``_k`` / ``_v`` objects; this project's pages are one
canonical ``(family, L, ps, H, D)`` byte string, so they stay one object. Each object is a
32-byte header (magic with the checksum algorithm, payload length, checksum) followed by the
payload, so a corrupted or wrong-sized object is detected, warned about, removed and treated
as a miss, like the ``file`` backend.

Configuration (per key: ``hicache_storage_backend_extra_config`` > the JSON file named by
``SGLANG_HICACHE_MOONCAKE_CONFIG_PATH`` > environment > default):

=====================  =================================  ==================
extra_config key       environment                        default
=====================  =================================  ==================
master_server_address  ``MOONCAKE_MASTER``                (required)
local_hostname         ``MOONCAKE_LOCAL_HOSTNAME``        ``localhost``
metadata_server        ``MOONCAKE_TE_META_DATA_SERVER``   ``P2PHANDSHAKE``
global_segment_size    ``MOONCAKE_GLOBAL_SEGMENT_SIZE``   ``4gb`` (split over tp*pp)
local_buffer_size      ``MOONCAKE_LOCAL_BUFFER_SIZE``     16 MiB
protocol               ``MOONCAKE_PROTOCOL``              ``tcp``
device_name            ``MOONCAKE_DEVICE``                ``""``
tenant_id              ``MOONCAKE_TENANT_ID``             ``default``
extra_backend_tag      -                                  none
checksum               -                                  ``crc32`` (``adler32``, ``blake2b``, ``none``)
connect_timeout        -                                  2 s (probe of the master port)
retry_interval         -                                  5 s (L3 off after an RPC failure)
=====================  =================================  ==================

Start a master (and optionally a process that holds the pool memory) with
``python -m sglang_hydra.cache.mooncake_master --serve`` or
:class:`sglang_hydra.cache.mooncake_master.MooncakeMaster`.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import socket
import struct
import threading
import time
import warnings
import zlib
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import torch

from .storage import StorageBackend, StorageConfig, StorageError, parse_size

__all__ = ["MooncakeStore", "MooncakeStoreSettings", "INSTALL_HINT",
           "mooncake_store_available", "master_binary"]

INSTALL_HINT = ("the 'mooncake' storage backend needs the Mooncake Store client from the Mooncake wheel: "
                "`pip install mooncake-transfer-engine-non-cuda` (CPU; `mooncake-transfer-engine` with CUDA) "
                "plus the Debian package libibverbs1 (`apt-get install -y --no-install-recommends libibverbs1`)")
START_HINT = ("start one with `python -m sglang_hydra.cache.mooncake_master --serve --port PORT` or "
              "`mooncake_master --rpc_port=PORT` (the binary ships with mooncake-transfer-engine-non-cuda)")

# ErrorCode values of mooncake-store/include/types.h that matter here
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
_CODES = {-200: "NO_AVAILABLE_HANDLE (pool full)", -600: "INVALID_PARAMS (size mismatch)",
          -703: "REPLICA_IS_NOT_READY", -704: "OBJECT_NOT_FOUND", -705: "OBJECT_ALREADY_EXISTS",
          -706: "OBJECT_HAS_LEASE", -707: "LEASE_EXPIRED", -800: "TRANSFER_FAIL",
          -900: "RPC_FAIL", -901: "RPC_TIMEOUT"}
_RPC_CODES = (-900, -901)
DEFAULT_GLOBAL_SEGMENT_SIZE = "4gb"
DEFAULT_LOCAL_BUFFER_SIZE = 16 << 20
MIN_SEGMENT_SIZE = 16 << 20          # smaller non-zero segments make setup() fail with -600
CONFIG_PATH_ENV = "SGLANG_HICACHE_MOONCAKE_CONFIG_PATH"


def _code(rc: int) -> str:
    return f"{rc} {_CODES.get(rc, '')}".strip()


# ------------------------------------------------------------------------------ import
def _quiet_logs() -> None:
    """Mooncake logs every setup step at INFO through glog; ``MC_LOG_LEVEL`` lowers that."""
    os.environ.setdefault("MC_LOG_LEVEL", "WARNING")


def import_store():
    """``MooncakeDistributedStore`` or a :class:`StorageError` with the install hint."""
    _quiet_logs()
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise StorageError(f"Failed to create storage backend: {INSTALL_HINT}; import failed: {exc}") from exc
    return MooncakeDistributedStore


def mooncake_store_available() -> bool:
    try:
        import_store()
        return True
    except StorageError:
        return False


def master_binary() -> str:
    """Path of ``mooncake_master`` (the binary inside the wheel, else the one on PATH)."""
    spec = importlib.util.find_spec("mooncake")
    for d in (spec.submodule_search_locations or []) if spec else []:
        p = os.path.join(d, "mooncake_master")
        if os.path.isfile(p):
            return p
    p = shutil.which("mooncake_master")
    if p:
        return p
    raise StorageError(f"mooncake_master not found; {INSTALL_HINT}")


# ------------------------------------------------------------------------------ config
def parse_segment_size(v) -> int:
    """Bytes; ``"4gb"`` means GiB as in the reference, other suffixes as :func:`parse_size`."""
    if v is None or v == "":
        return 0
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return max(int(v), 0)
    s = str(v).strip().lower()
    if s.endswith("gb") and s[:-2].strip().replace(".", "", 1).isdigit():
        return int(float(s[:-2]) * (1 << 30))
    if s.isdigit():
        return int(s)
    return parse_size(s) or 0


@dataclass
class MooncakeStoreSettings:
    master_server_address: str = ""
    local_hostname: str = "localhost"
    metadata_server: str = "P2PHANDSHAKE"
    global_segment_size: int = 4 << 30
    local_buffer_size: int = DEFAULT_LOCAL_BUFFER_SIZE
    protocol: str = "tcp"
    device_name: str = ""
    tenant_id: str = "default"
    extra_backend_tag: Optional[str] = None
    checksum: str = "crc32"
    connect_timeout: float = 2.0
    retry_interval: float = 5.0

    _ENV = {"master_server_address": "MOONCAKE_MASTER", "local_hostname": "MOONCAKE_LOCAL_HOSTNAME",
            "metadata_server": "MOONCAKE_TE_META_DATA_SERVER",
            "global_segment_size": "MOONCAKE_GLOBAL_SEGMENT_SIZE",
            "local_buffer_size": "MOONCAKE_LOCAL_BUFFER_SIZE", "protocol": "MOONCAKE_PROTOCOL",
            "device_name": "MOONCAKE_DEVICE", "tenant_id": "MOONCAKE_TENANT_ID"}

    @classmethod
    def resolve(cls, extra: Optional[Dict[str, Any]] = None) -> "MooncakeStoreSettings":
        extra = dict(extra or {})
        from_file: Dict[str, Any] = {}
        path = os.environ.get(CONFIG_PATH_ENV)
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    from_file = json.load(fh)
            except (OSError, ValueError) as exc:
                raise StorageError(f"mooncake storage: cannot read {CONFIG_PATH_ENV}={path}: {exc}") from exc
        out = cls()
        for f in ("master_server_address", "local_hostname", "metadata_server", "global_segment_size",
                  "local_buffer_size", "protocol", "device_name", "tenant_id", "extra_backend_tag",
                  "checksum", "connect_timeout", "retry_interval"):
            envs = [cls._ENV[f]] if f in cls._ENV else []
            if f == "local_buffer_size":
                envs.append("SGLANG_MOONCAKE_LOCAL_BUFFER_SIZE")
            from_env = next((os.environ[e] for e in envs if os.environ.get(e)), None)
            if extra.get(f) is not None:
                v = extra[f]
            elif from_file.get(f) is not None:
                v = from_file[f]
            elif from_env is not None:
                v = from_env
            else:
                continue
            try:
                if f == "global_segment_size":
                    v = parse_segment_size(v)
                elif f == "local_buffer_size":
                    v = parse_segment_size(v) or DEFAULT_LOCAL_BUFFER_SIZE
                elif f in ("connect_timeout", "retry_interval"):
                    v = float(v)
                else:
                    v = str(v)
            except (TypeError, ValueError) as exc:
                raise StorageError(f"mooncake storage: bad value {v!r} for {f}: {exc}") from exc
            setattr(out, f, v)
        out.checksum = out.checksum.lower()
        if out.checksum not in _ALGOS:
            raise StorageError(f"mooncake storage: checksum must be one of {', '.join(_ALGOS)}; got {out.checksum!r}")
        return out


# ------------------------------------------------------------------------------ object format
_MAGIC = b"HYMC1"
_HDR = struct.Struct("<5sB2xQ16s")   # magic, checksum algorithm, payload length, checksum
HEADER_BYTES = _HDR.size             # 32: the payload starts 32-byte aligned inside the object


def _crc32(b) -> bytes:
    return zlib.crc32(b).to_bytes(4, "little")


def _adler32(b) -> bytes:
    return zlib.adler32(b).to_bytes(4, "little")


def _blake2b(b) -> bytes:
    return hashlib.blake2b(b, digest_size=16).digest()


_ALGOS = {"none": (0, lambda b: b""), "crc32": (1, _crc32), "adler32": (2, _adler32), "blake2b": (3, _blake2b)}
_BY_ID = {i: f for i, f in _ALGOS.values()}


def _pack_header(algo: str, payload) -> bytes:
    aid, fn = _ALGOS[algo]
    return _HDR.pack(_MAGIC, aid, len(payload), fn(payload).ljust(16, b"\0"))


def _probe_master(host: str, port: int, timeout: float, full: bool = False) -> Optional[str]:
    """None if ``host:port`` accepts TCP (and, with ``full``, closes on an HTTP request as the
    master's RPC port does, rather than answering like its metrics/HTTP port); else the reason."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        return f"nothing accepts connections there ({exc})"
    try:
        if not full:
            return None
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n")
        conn.settimeout(min(timeout, 1.0))
        try:
            reply = conn.recv(16)
        except socket.timeout:
            return None          # silent: let setup() decide
        except OSError:
            return None          # reset: also what the RPC port may do
        if reply.startswith(b"HTTP/"):
            return ("that port answers HTTP (a mooncake_master metrics port or an HTTP metadata server?), "
                    "not the master's RPC port (--rpc_port)")
        if reply:
            return f"that port answered {reply!r}, not like a mooncake_master RPC port"
        return None
    finally:
        conn.close()


def _split_address(addr: str):
    host, sep, port = addr.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise StorageError(f"mooncake storage: master_server_address / MOONCAKE_MASTER must be HOST:PORT, got {addr!r}")
    return host.strip("[]"), int(port)


class _Staging:
    """A growable uint8 buffer registered with the client (one per direction)."""

    def __init__(self, store, what: str):
        self.store, self.what = store, what
        self.buf: Optional[torch.Tensor] = None
        self.lock = threading.Lock()

    def ensure(self, nbytes: int) -> torch.Tensor:
        if self.buf is None or self.buf.numel() < nbytes:
            self.release()
            buf = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8)
            rc = self.store.register_buffer(buf.data_ptr(), buf.numel())
            if rc != 0:
                raise RuntimeError(f"mooncake register_buffer({self.what}, {buf.numel()} B) failed: {_code(rc)}")
            self.buf = buf
        return self.buf

    def release(self) -> None:
        if self.buf is not None:
            try:
                self.store.unregister_buffer(self.buf.data_ptr())
            except Exception:
                pass
            self.buf = None


# ------------------------------------------------------------------------------ backend
class MooncakeStore(StorageBackend):
    """Pages in a Mooncake Store pool, moved by batch zero-copy calls through registered staging."""

    name = "mooncake"

    def __init__(self, config: Optional[StorageConfig] = None):
        super().__init__(config)
        cfg = self.config
        self.settings = s = MooncakeStoreSettings.resolve(cfg.extra_config)
        Store = import_store()
        if not s.master_server_address:
            raise StorageError(
                "Failed to create storage backend: 'mooncake' needs the address of a running Mooncake master: "
                "set master_server_address in hicache_storage_backend_extra_config or MOONCAKE_MASTER=HOST:PORT; "
                + START_HINT)
        self._hostport = _split_address(s.master_server_address)
        why = _probe_master(*self._hostport, s.connect_timeout, full=True)
        if why:     # setup() itself would retry for ~90 s holding the GIL, so check first
            raise StorageError(
                f"Failed to create storage backend: cannot use the Mooncake master at {s.master_server_address} "
                f"(master_server_address / MOONCAKE_MASTER): {why}; {START_HINT}")
        ranks = max(1, cfg.tp_size * cfg.pp_size)
        seg = s.global_segment_size // ranks if s.global_segment_size else 0
        if 0 < seg < MIN_SEGMENT_SIZE:
            seg = MIN_SEGMENT_SIZE
        self.segment_bytes = seg
        self.stats.update(rpc_fail=0)
        self._warned: Dict[str, int] = {}
        self._down_until = 0.0
        self._probe = False
        self._closed = True              # until setup() succeeded
        self._store = Store()
        self._put = _Staging(self._store, "put staging")
        self._get = _Staging(self._store, "get staging")
        kwargs = {"tenant_id": s.tenant_id} if s.tenant_id != "default" else {}
        t0 = time.perf_counter()
        try:    # blocks with the GIL held (no Python-side timeout is possible)
            rc = self._store.setup(s.local_hostname, s.metadata_server, seg, s.local_buffer_size, s.protocol,
                                   s.device_name, s.master_server_address, None, **kwargs)
        except Exception as exc:
            raise StorageError(f"Failed to create storage backend: Mooncake store setup raised {exc!r}") from exc
        if rc != 0:
            raise StorageError(
                f"Failed to create storage backend: Mooncake store setup against {s.master_server_address} returned "
                f"{_code(rc)} (global_segment_size={seg}, local_buffer_size={s.local_buffer_size}, "
                f"protocol={s.protocol!r}; non-zero segments must be >= {MIN_SEGMENT_SIZE} B)")
        self.setup_seconds = time.perf_counter() - t0
        self._closed = False
        model = (cfg.model_name or "").replace("/", "-")
        parts = [p for p in (s.extra_backend_tag, model) if p]
        self.prefix = "_".join(parts) + "_" if parts else ""
        if cfg.is_mla_model:
            suffix = f"_{cfg.pp_rank}" if cfg.pp_size > 1 else ""
        else:
            suffix = f"_{cfg.tp_rank}" + (f"_{cfg.pp_rank}" if cfg.pp_size > 1 else "")
        if cfg.attn_cp_size > 1:
            suffix += f"_cp{cfg.attn_cp_rank}_{cfg.attn_cp_size}"
        self.suffix = suffix

    # -- helpers
    def key(self, key: str) -> str:
        return f"{self.prefix}{key}{self.suffix}"

    def _warn(self, kind: str, msg: str) -> None:
        n = self._warned.get(kind, 0)
        self._warned[kind] = n + 1
        if n < 5:
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def _available(self) -> bool:
        if self._closed or time.monotonic() < self._down_until:
            return False
        if self._probe and _probe_master(*self._hostport, self.settings.connect_timeout):
            # still down: a store call now would block ~4 s reconnecting
            self._down_until = time.monotonic() + self.settings.retry_interval
            return False
        return True

    def _rpc_failed(self, what: str, rc: int) -> None:
        self.stats["rpc_fail"] += 1
        self._down_until = time.monotonic() + self.settings.retry_interval
        self._probe = True     # afterwards: a TCP probe, then batch_is_exist, before any other store call
        self._warn("rpc", f"mooncake storage: {what} got {_code(rc)} from the master at "
                          f"{self.settings.master_server_address}; L3 reads are misses and writes fail for "
                          f"{self.settings.retry_interval:g}s (retry_interval)")

    def _exist_codes(self, tkeys: List[str]) -> Optional[List[int]]:
        codes = list(self._store.batch_is_exist(tkeys))
        bad = [c for c in codes if c < 0]
        if bad:
            self._rpc_failed("batch_is_exist", bad[0])
            return None
        self._probe = False
        return codes

    # -- interface
    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(self, keys: Sequence[str]) -> int:
        if not keys or not self._available():
            return 0
        codes = self._exist_codes([self.key(k) for k in keys])
        if codes is None:
            return 0
        n = 0
        for c in codes:
            if c != 1:
                break
            n += 1
        return n

    def set(self, key: str, value: torch.Tensor) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: Sequence[str], values: Sequence[torch.Tensor]) -> bool:
        keys, values = list(keys), list(values)
        self.stats["set"] += len(keys)
        if not keys:
            return True
        if not self._available():
            self.stats["set_fail"] += len(keys)
            return False
        tkeys = [self.key(k) for k in keys]
        codes = self._exist_codes(tkeys)
        if codes is None:
            self.stats["set_fail"] += len(keys)
            return False
        todo = [i for i, c in enumerate(codes) if c != 1]     # present keys are not rewritten
        if not todo:
            return True
        payloads = [values[i].detach().to("cpu").contiguous().view(torch.uint8).reshape(-1) for i in todo]
        sizes = [HEADER_BYTES + p.numel() for p in payloads]
        with self._put.lock:
            buf = self._put.ensure(sum(sizes))
            offs, off = [], 0
            for p, sz in zip(payloads, sizes):
                dst = buf[off + HEADER_BYTES: off + sz]
                dst.copy_(p)
                hdr = _pack_header(self.settings.checksum, dst.numpy())
                buf[off: off + HEADER_BYTES].copy_(torch.frombuffer(bytearray(hdr), dtype=torch.uint8))
                offs.append(off)
                off += sz
            base = buf.data_ptr()
            rcs = list(self._store.batch_put_from([tkeys[i] for i in todo], [base + o for o in offs], sizes))
        ok = True
        for i, rc, p in zip(todo, rcs, payloads):
            if rc == 0 or rc == OBJECT_ALREADY_EXISTS:
                self.stats["bytes_written"] += p.numel()
                continue
            ok = False
            self.stats["set_fail"] += 1
            if rc in _RPC_CODES:
                self._rpc_failed("batch_put_from", rc)
            elif rc == -200:
                self._warn("full", "mooncake storage: the pool has no free space (NO_AVAILABLE_HANDLE); page not "
                                   "stored (eviction frees space once leases expire; raise global_segment_size)")
            else:
                self._warn("put", f"mooncake storage: put of {keys[i][:16]}... failed: {_code(rc)}")
        return ok

    def get(self, key: str) -> Optional[torch.Tensor]:
        return self.batch_get([key])[0]

    def batch_get(self, keys: Sequence[str]) -> List[Optional[torch.Tensor]]:
        keys = list(keys)
        self.stats["get"] += len(keys)
        out: List[Optional[torch.Tensor]] = [None] * len(keys)
        if not keys:
            return out
        if not self._available():
            self.stats["get_miss"] += len(keys)
            return out
        tkeys = [self.key(k) for k in keys]
        if self._probe and self._exist_codes(tkeys) is None:   # gets on a dead master block ~4 s each
            self.stats["get_miss"] += len(keys)
            return out
        pb = self.config.page_bytes
        if pb:
            slots = [HEADER_BYTES + pb] * len(keys)
        else:                                       # page size unknown: ask the master per key
            slots = [int(self._store.get_size(k)) for k in tkeys]
        idx = [i for i, sz in enumerate(slots) if sz > 0]
        rpc = [sz for sz in slots if sz in _RPC_CODES]
        if rpc:
            self._rpc_failed("get_size", rpc[0])
        if idx:
            with self._get.lock:
                offs, off = [], 0
                for i in idx:
                    offs.append(off)
                    off += slots[i]
                buf = self._get.ensure(off)
                base = buf.data_ptr()
                rcs = list(self._store.batch_get_into([tkeys[i] for i in idx], [base + o for o in offs],
                                                      [slots[i] for i in idx]))
                for i, o, rc in zip(idx, offs, rcs):
                    out[i] = self._check(keys[i], tkeys[i], buf, o, rc)
        for v in out:
            if v is None:
                self.stats["get_miss"] += 1
            else:
                self.stats["get_hit"] += 1
                self.stats["bytes_read"] += v.numel()
        return out

    def _check(self, key: str, tkey: str, buf: torch.Tensor, off: int, rc: int) -> Optional[torch.Tensor]:
        if rc == OBJECT_NOT_FOUND:
            return None
        if rc in _RPC_CODES:
            self._rpc_failed("batch_get_into", rc)
            return None
        bad = None
        if rc == -600:
            bad = "object larger than a page"
        elif rc < 0:
            self._warn("get", f"mooncake storage: get of {key[:16]}... failed: {_code(rc)}; treated as a miss")
            return None
        elif rc < HEADER_BYTES:
            bad = f"truncated header ({rc} B)"
        else:
            magic, aid, n, cs = _HDR.unpack_from(buf[off: off + HEADER_BYTES].numpy().tobytes())
            payload = buf[off + HEADER_BYTES: off + rc]
            pb = self.config.page_bytes
            if magic != _MAGIC or aid not in _BY_ID:
                bad = "bad magic"
            elif payload.numel() != n:
                bad = f"truncated ({payload.numel()} of {n} payload bytes)"
            elif pb and n != pb:
                bad = f"wrong page size {n} (expected {pb})"
            elif _BY_ID[aid](payload.numpy()).ljust(16, b"\0") != cs:
                bad = "checksum mismatch"
            else:
                return payload.clone()
        self.stats["corrupt"] += 1
        self._warn("corrupt", f"mooncake storage: object {tkey[:24]}... is corrupt ({bad}); treated as a miss")
        self.delete(key)
        return None

    def delete(self, key: str) -> None:
        if not self._closed:
            try:
                self._store.remove(self.key(key), True)
            except Exception:
                pass

    def clear(self) -> None:
        """Remove every object with this backend's prefix and rank suffix.

        Refused without a prefix (no model name and no backend tag): the pattern would then
        match every object with the rank suffix, other models' and other users' included."""
        if not self.prefix:
            raise StorageError("refusing to clear the Mooncake store without a key prefix: set a model name "
                               "or extra_backend_tag so clear() only removes this deployment's pages")
        if self._closed:
            return
        pat = "^" + re.escape(self.prefix) + ".*" + re.escape(self.suffix) + "$"
        self._store.remove_by_regex(pat, True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        try:    # ~0.2-3 s normally, >10 s with a dead master; holds the GIL
            self._put.release()
            self._get.release()
            self._store.close()
        except Exception:
            pass

    def __del__(self):  # pragma: no cover - best effort
        try:
            if not getattr(self, "_closed", True):
                self.close()
        except Exception:
            pass
