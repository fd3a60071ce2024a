"""L3 storage for the hierarchical cache (reference §5.8-§5.10).

* :class:`StorageBackend` - batch get/set/exists by page key (payloads are 1-D uint8
  tensors holding one page in canonical ``(family, L, ps, H, D)`` byte order).
* registry: :func:`register_storage_backend`, :func:`create_storage_backend`.
* ``file``: one file per page ``{dir}/{key}{suffix}.bin``, written to a temp file and
  renamed (atomic), with a header carrying the payload length and a BLAKE2b checksum, so
  a torn, truncated or corrupted file is detected, warned about and treated as a miss.
  Optional LRU size cap (``max_size``).
* ``sim``: an in-process dictionary (for tests and benchmarks).
* ``dynamic``: ``module_path`` / ``class_name`` from the extra config.
* other reference names fail with an error naming the package to install.
* keys: :func:`page_hashes` - chained SHA-256 page hashes (§5.9).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import re
import struct
import threading
import uuid
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

__all__ = [
    "StorageConfig", "StorageBackend", "FileStorage", "SimStorage", "StorageError",
    "register_storage_backend", "create_storage_backend", "storage_backend_names",
    "page_hashes", "namespace_seed", "parse_size", "storage_config_from_record",
    "check_page_file", "STORAGE_BATCH_SIZE", "check_storage_key", "check_private_dir",
    "default_file_storage_dir",
]

STORAGE_BATCH_SIZE = 128
_UINT32_MAX = 0xFFFFFFFF


class StorageError(RuntimeError):
    """A storage backend could not be created."""


# ------------------------------------------------------------------------------ keys
def _part(s: Optional[str]) -> bytes:
    if s is None:
        return b"\x00"
    b = s.encode("utf-8")
    return b"\x01" + len(b).to_bytes(8, "little") + b


def namespace_seed(extra_key: Optional[str] = None, cache_salt: Optional[str] = None) -> Optional[str]:
    """Seed for a new chain (§5.9): None unless ``extra_key`` or ``cache_salt`` is set."""
    if extra_key is None and cache_salt is None:
        return None
    return hashlib.sha256(b"sglang-cache-namespace-v1" + _part(extra_key) + _part(cache_salt)).hexdigest()


def _page_bytes(tokens: Sequence[int]) -> bytes:
    toks = [int(t) for t in tokens]
    if any(t > _UINT32_MAX or t < 0 for t in toks):
        return b"\xff" + struct.pack(f"<{len(toks)}Q", *[t & 0xFFFFFFFFFFFFFFFF for t in toks])
    return struct.pack(f"<{len(toks)}I", *toks)


def page_hashes(pages: Sequence[Sequence[int]], prior_hash: Optional[str] = None,
                extra_key: Optional[str] = None, cache_salt: Optional[str] = None) -> List[str]:
    """Chained keys: ``digest_i = SHA256(digest_{i-1} || page_bytes_i)``, hex encoded."""
    prev = bytes.fromhex(prior_hash) if prior_hash else None
    if prev is None:
        seed = namespace_seed(extra_key, cache_salt)
        prev = bytes.fromhex(seed) if seed else None
    out = []
    for toks in pages:
        h = hashlib.sha256()
        if prev is not None:
            h.update(prev)
        h.update(_page_bytes(toks))
        prev = h.digest()
        out.append(prev.hex())
    return out


# ------------------------------------------------------------------------------ config
@dataclass
class StorageConfig:
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    attn_cp_rank: int = 0
    attn_cp_size: int = 1
    is_mla_model: bool = False
    model_name: Optional[str] = None
    page_bytes: int = 0
    extra_config: Dict[str, Any] = field(default_factory=dict)


def storage_config_from_record(record, page_bytes: int = 0) -> StorageConfig:
    from ..config.extra_config import parse_extra_config
    backend = getattr(record, "hicache_storage_backend", None)
    extra = parse_extra_config(getattr(record, "hicache_storage_backend_extra_config", None), backend)
    model = getattr(record, "served_model_name", None) or getattr(record, "model_path", None)
    is_mla = False
    try:
        from ..memory.geometry import kv_geometry
        is_mla = kv_geometry(record).is_mla
    except Exception:  # pragma: no cover - geometry needs a full record
        pass
    return StorageConfig(tp_rank=0, tp_size=int(getattr(record, "tp_size", 1) or 1),
                         pp_rank=0, pp_size=int(getattr(record, "pp_size", 1) or 1),
                         is_mla_model=is_mla, model_name=model, page_bytes=page_bytes,
                         extra_config=dict(extra.backend))


# ------------------------------------------------------------------------------ interface
class StorageBackend:
    """Page store addressed by key; ``batch_set`` is all-or-nothing-ish: stops at first failure."""

    name = "base"

    def __init__(self, config: Optional[StorageConfig] = None):
        self.config = config or StorageConfig()
        self.stats = {"get": 0, "get_hit": 0, "get_miss": 0, "corrupt": 0, "set": 0,
                      "set_fail": 0, "bytes_read": 0, "bytes_written": 0, "evicted": 0}

    # must implement
    def get(self, key: str) -> Optional[torch.Tensor]:
        raise NotImplementedError

    def set(self, key: str, value: torch.Tensor) -> bool:
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    # defaults
    def batch_get(self, keys: Sequence[str]) -> List[Optional[torch.Tensor]]:
        return [self.get(k) for k in keys]

    def batch_set(self, keys: Sequence[str], values: Sequence[torch.Tensor]) -> bool:
        for k, v in zip(keys, values):
            if not self.set(k, v):
                return False
        return True

    def batch_exists(self, keys: Sequence[str]) -> int:
        """Number of leading keys that exist."""
        n = 0
        for k in keys:
            if not self.exists(k):
                break
            n += 1
        return n

    def delete(self, key: str) -> None:
        pass

    def clear(self) -> None:
        pass

    def get_stats(self) -> Dict[str, int]:
        return dict(self.stats)

    def close(self) -> None:
        pass


class SimStorage(StorageBackend):
    """In-process store (the reference's ``sim`` is a simulation backend too)."""

    name = "sim"

    def __init__(self, config=None):
        super().__init__(config)
        self._d: Dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def get(self, key):
        self.stats["get"] += 1
        with self._lock:
            v = self._d.get(key)
        if v is None:
            self.stats["get_miss"] += 1
            return None
        self.stats["get_hit"] += 1
        self.stats["bytes_read"] += v.numel()
        return v.clone()

    def set(self, key, value):
        self.stats["set"] += 1
        with self._lock:
            if key not in self._d:
                self._d[key] = value.detach().to("cpu").contiguous().view(torch.uint8).view(-1).clone()
                self.stats["bytes_written"] += value.numel() * value.element_size()
        return True

    def exists(self, key):
        return key in self._d

    def delete(self, key):
        self._d.pop(key, None)

    def clear(self):
        self._d.clear()


# ------------------------------------------------------------------------------ file
_MAGIC = b"HYKV1\x00\x00\x00"
_HDR = struct.Struct("<8sQ16s")   # magic, payload length, blake2b-128 of payload


def parse_size(v) -> Optional[int]:
    """'200G', '1Gi', '512M', 1024 -> bytes; None/''/0 -> None."""
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return int(v) if v > 0 else None
    s = str(v).strip()
    if not s:
        return None
    units = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
             "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}
    num = s.rstrip("bBiIkKmMgGtT")
    unit = s[len(num):].lower().rstrip("b")
    if unit not in units:
        raise ValueError(f"bad size {v!r}")
    out = int(float(num) * units[unit])
    return out if out > 0 else None


def _checksum(data) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def read_page_file(path, page_bytes: int = 0):
    """``(problem or None, payload tensor)`` of one ``file`` backend page.

    The header is checked against the file size before the payload is read, and the
    payload is read straight into the tensor it is returned in (one copy)."""
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        hdr = fh.read(_HDR.size)
        if len(hdr) < _HDR.size:
            return "truncated header", None
        magic, n, cs = _HDR.unpack(hdr)
        if magic != _MAGIC:
            return "bad magic", None
        if size - _HDR.size != n:
            return f"truncated ({size - _HDR.size} of {n} payload bytes)", None
        if page_bytes and n != page_bytes:
            return f"wrong page size {n} (expected {page_bytes})", None
        out = torch.empty(n, dtype=torch.uint8)
        view = memoryview(out.numpy())
        got = 0
        while got < n:
            k = fh.readinto(view[got:])
            if not k:
                return f"truncated ({got} of {n} payload bytes)", None
            got += k
    if _checksum(view) != cs:
        return "checksum mismatch", None
    return None, out


def check_page_file(path, page_bytes: int = 0) -> Optional[str]:
    """What is wrong with the ``file`` backend page at ``path`` (None: intact)."""
    return read_page_file(path, page_bytes)[0]


_KEY_RE = re.compile(r"[0-9a-f]{1,128}")


def check_storage_key(key) -> str:
    """``key`` if it is a page key (1-128 lowercase hex characters), else ValueError: a key
    with ``/``, ``..``, a NUL or anything else outside the hash alphabet could address a
    file outside the storage directory."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"storage key {key!r} is not a page key (1-128 lowercase hex characters)")
    return key


def default_file_storage_dir() -> str:
    """Per-user default for the file tier: ``$XDG_CACHE_HOME/sglang_hydra/hicache`` (or
    ``~/.cache/...``), created mode 0700 - not a shared ``/tmp/hicache`` another user could
    fill with pages of their choosing or read."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sglang_hydra", "hicache")


def check_private_dir(path: str) -> None:
    """Refuse a storage directory that another user owns or that anyone may write to: its
    pages would be loaded into the KV cache as they are."""
    st = os.stat(path)
    uid = os.getuid() if hasattr(os, "getuid") else st.st_uid
    if st.st_uid != uid:
        raise StorageError(f"hicache file storage: {path} belongs to uid {st.st_uid}, not to this user "
                           f"(uid {uid}); use a directory of your own (file_storage_path or "
                           f"SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR)")
    if st.st_mode & 0o002:
        raise StorageError(f"hicache file storage: {path} is writable by every user (mode "
                           f"{st.st_mode & 0o777:o}); make it private (chmod 700) or use another directory")


class FileStorage(StorageBackend):
    """Reference ``HiCacheFile`` with integrity checks and an optional LRU size cap."""

    name = "file"
    ENV_DIR = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
    ENV_MAX = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"

    def __init__(self, config=None):
        super().__init__(config)
        cfg = self.config
        extra = cfg.extra_config or {}
        self.dir = os.environ.get(self.ENV_DIR) or extra.get("file_storage_path") or default_file_storage_dir()
        model = (cfg.model_name or "").replace("/", "-")
        shard = ""
        if cfg.pp_size > 1:
            shard += f"_{cfg.pp_size}_{cfg.pp_rank}"
        if cfg.attn_cp_size > 1:
            shard += f"_cp{cfg.attn_cp_rank}_{cfg.attn_cp_size}"
        self.suffix = f"_{model}{shard}" if cfg.is_mla_model else f"_{model}_{cfg.tp_rank}_{cfg.tp_size}{shard}"
        max_size = extra.get("max_size", os.environ.get(self.ENV_MAX))
        self.max_size = parse_size(max_size)
        ratio = extra.get("eviction_ratio", 0.9)
        try:
            ratio = float(ratio)
        except (TypeError, ValueError):
            ratio = 0.9
        self.eviction_ratio = ratio if 0 < ratio <= 1 else 0.9
        self.writable = True
        self._warned: Dict[str, int] = {}
        self._lock = threading.RLock()
        self._lru: "OrderedDict[str, int]" = OrderedDict()   # key -> file bytes
        self._inflight: set = set()                            # temp files of writes in progress
        self.total = 0
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            self.writable = False
            self._warn("mkdir", f"hicache file storage: cannot create {self.dir}: {exc}; storage writes disabled")
        else:
            check_private_dir(self.dir)
        self._scan()

    # -- helpers
    def _warn(self, kind: str, msg: str) -> None:
        n = self._warned.get(kind, 0)
        self._warned[kind] = n + 1
        if n < 5:
            warnings.warn(msg, RuntimeWarning, stacklevel=3)

    def path(self, key: str) -> str:
        """The file of ``key``; only chained-hash keys (lowercase hex) are accepted, so no
        key can name a file outside the storage directory."""
        check_storage_key(key)
        return os.path.join(self.dir, f"{key}{self.suffix}.bin")

    def _scan(self) -> None:
        try:
            ents = [e for e in os.scandir(self.dir) if e.name.endswith(self.suffix + ".bin")]
        except OSError:
            return
        ents.sort(key=lambda e: e.stat().st_mtime)
        for e in ents:
            key = e.name[: -len(self.suffix + ".bin")]
            sz = e.stat().st_size
            self._lru[key] = sz
            self.total += sz

    def _make_room(self, need: int) -> bool:
        if self.max_size is None:
            return True
        if need > self.max_size:
            return False
        if self.total + need <= self.max_size:
            return True
        target = self.max_size * self.eviction_ratio - need
        while self._lru and self.total > target:
            key, sz = self._lru.popitem(last=False)
            self.total -= sz
            self.stats["evicted"] += 1
            try:
                os.remove(self.path(key))
            except OSError:
                pass
        return self.total + need <= self.max_size

    # -- interface
    def exists(self, key):
        return os.path.exists(self.path(key))

    def set(self, key, value):
        check_storage_key(key)
        self.stats["set"] += 1
        if not self.writable:
            self.stats["set_fail"] += 1
            return False
        with self._lock:
            if key in self._lru and self.exists(key):
                self._lru.move_to_end(key)
                return True
        payload = memoryview(value.detach().to("cpu").contiguous().view(torch.uint8).view(-1).numpy())
        header = _HDR.pack(_MAGIC, len(payload), _checksum(payload))
        size = len(header) + len(payload)
        with self._lock:
            if not self._make_room(size):
                self.stats["set_fail"] += 1
                self._warn("full", f"hicache file storage: size cap {self.max_size} B reached; page not stored")
                return False
            self._lru[key] = size
            self.total += size
        # temp file + rename: readers and a crash never see half a page.  The temp name is
        # registered before the file exists, so close() can remove it if an interrupt
        # (KeyboardInterrupt) lands anywhere in here, even inside the cleanup below.
        tmp = os.path.join(self.dir, f".{uuid.uuid4().hex}.tmp")
        self._inflight.add(tmp)
        try:
            with open(tmp, "wb") as fh:
                fh.write(header)
                fh.write(payload)
            os.replace(tmp, self.path(key))
            self._inflight.discard(tmp)
        except BaseException as exc:
            with self._lock:
                if self._lru.pop(key, None) is not None:
                    self.total -= size
            self._remove_temp(tmp)
            if not isinstance(exc, Exception):
                raise
            self.stats["set_fail"] += 1
            self._warn("write", f"hicache file storage: write of {key[:16]}... failed: {exc}")
            return False
        self.stats["bytes_written"] += len(payload)
        return True

    def _remove_temp(self, tmp: str) -> None:
        try:
            os.remove(tmp)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._warn("tmp", f"hicache file storage: cannot remove temp file {tmp}: {exc}")
            return
        self._inflight.discard(tmp)

    def close(self) -> None:
        """Remove temp files of writes that never finished (an interrupted replay)."""
        for tmp in list(self._inflight):
            self._remove_temp(tmp)

    def get(self, key):
        self.stats["get"] += 1
        p = self.path(key)
        try:
            bad, out = read_page_file(p, self.config.page_bytes)
        except FileNotFoundError:
            self.stats["get_miss"] += 1
            return None
        except OSError as exc:
            self.stats["get_miss"] += 1
            self._warn("read", f"hicache file storage: cannot read {p}: {exc}; treated as a miss")
            return None
        if bad:
            self.stats["corrupt"] += 1
            self.stats["get_miss"] += 1
            self._warn("corrupt", f"hicache file storage: {p} is corrupt ({bad}); treated as a miss")
            self.delete(key)
            return None
        self.stats["get_hit"] += 1
        self.stats["bytes_read"] += out.numel()
        with self._lock:
            if key in self._lru:
                self._lru.move_to_end(key)
        return out

    def delete(self, key):
        with self._lock:
            sz = self._lru.pop(key, None)
            if sz is not None:
                self.total -= sz
        try:
            os.remove(self.path(key))
        except OSError:
            pass

    def clear(self):
        with self._lock:
            for key in list(self._lru):
                self.delete(key)


# ------------------------------------------------------------------------------ registry
_REGISTRY: Dict[str, Callable[[StorageConfig], StorageBackend]] = {}

#: reference choices this project cannot run, and what to install for them
_UNAVAILABLE = {
    "mooncake": "the Mooncake store client: pip install mooncake-transfer-engine (and a running mooncake_master)",
    "hf3fs": "the 3FS client (hf3fs_fuse / hf3fs_py_usrbio) and a mounted 3FS cluster",
    "nixl": "NIXL: pip install nixl",
    "aibrix": "AIBrix KV cache: pip install aibrix-kvcache",
    "npu_memcache": "memfabric_hybrid (Ascend NPU memcache)",
    "eic": "the Volcengine EIC client (eic)",
    "simm": "the SiMM client (simm)",
    "mori": "the MORI io library (mori)",
    "shm": "the shared-memory store of the reference (sglang's shm storage module)",
    "tensorcast": "tensorcast",
    "seaweedfs": "a SeaweedFS client (boto3 + a running SeaweedFS S3 gateway)",
}


def register_storage_backend(name: str, factory: Callable[[StorageConfig], StorageBackend]) -> None:
    _REGISTRY[name] = factory


def register_storage_backend_by_name(name: str, module: str, class_name: str) -> None:
    """Register a backend class that lives in ``module`` without importing it now."""
    def factory(config: StorageConfig) -> StorageBackend:
        return getattr(importlib.import_module(module), class_name)(config)

    factory.__qualname__ = f"{module}.{class_name}"
    register_storage_backend(name, factory)


def storage_backend_names() -> List[str]:
    return sorted(set(_REGISTRY) | set(_UNAVAILABLE) | {"dynamic"})


def _dynamic(config: StorageConfig) -> StorageBackend:
    extra = config.extra_config or {}
    missing = [k for k in ("module_path", "class_name") if not extra.get(k)]
    if missing:
        raise StorageError(f"the 'dynamic' storage backend needs {', '.join(missing)} in "
                           "hicache_storage_backend_extra_config")
    try:
        mod = importlib.import_module(extra["module_path"])
    except ImportError as exc:
        raise StorageError(f"dynamic storage backend: cannot import {extra['module_path']!r}: {exc}") from exc
    cls = getattr(mod, extra["class_name"], None)
    if cls is None:
        raise StorageError(f"dynamic storage backend: {extra['module_path']} has no {extra['class_name']!r}")
    return cls(config)


def create_storage_backend(name: str, config: Optional[StorageConfig] = None) -> StorageBackend:
    config = config or StorageConfig()
    if name == "dynamic":
        return _dynamic(config)
    if name in _REGISTRY:
        return _REGISTRY[name](config)
    if name in _UNAVAILABLE:
        raise StorageError(f"Failed to create storage backend: {name!r} is not available here; "
                           f"it needs {_UNAVAILABLE[name]}")
    raise StorageError(f"Failed to create storage backend: Unknown storage backend {name!r} "
                       f"(known: {', '.join(storage_backend_names())})")


register_storage_backend("file", FileStorage)
register_storage_backend("sim", SimStorage)
# Backends in modules of their own are named here and imported only when asked for (the
# module imports this one, never the reverse), so a missing optional package fails with its
# install hint at creation, not at import.
register_storage_backend_by_name("mooncake", "sglang_hydra.cache.storage_mooncake", "MooncakeStore")
