"""How much host memory this process may use, and how the HiCache host tier is sized.

Pure Python on purpose (no torch, no psutil): the config layer and the plan printer import
it.  Every file it reads sits under two injectable roots so tests can build a fake machine
in a temporary directory:

* ``proc_root`` (default ``/proc``): ``self/cgroup``, ``self/mountinfo``, ``meminfo``;
* ``cgroup_root`` (default ``""``): a prefix put in front of every cgroup mount point
  found in ``mountinfo`` (a fake ``/sys/fs/cgroup/memory`` lives at
  ``<cgroup_root>/sys/fs/cgroup/memory``).

What the numbers mean (the reference's RT-2 / RT-3 rules, restated):

* *available* = the smaller of the kernel's MemAvailable and the tightest cgroup headroom.
  Headroom is measured at every level from the process's memory cgroup up to the root of
  its mount: for each limit file there (v2 ``memory.max`` and ``memory.high``, v1
  ``memory.limit_in_bytes``; ``max`` means none) the headroom is
  ``limit - max(0, usage - page cache)``, never below zero.  Page cache is credited
  because the kernel reclaims it before failing an allocation, except on v2 when some
  cgroup below that level protects memory with ``memory.min`` (or hides it).
* *budget* for host pools = ``(available - 10 GiB reserve) // ranks on this host``.
* *auto-size*: the host/device ratio becomes ``min(requested, budget*(1-0.05)/device
  bytes)`` where the budget is first scaled by ``hicache_host_memory_fraction``.
* *host pool tokens*: ``hicache_size`` GB (1e9 bytes) wins over the ratio; either way
  the token count is floored to a page and one page is added on top.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional, Tuple

GiB = 1024 ** 3
GB = 10 ** 9
#: Host memory never handed to HiCache pools (left for the OS, the runtime, weights ...).
HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * GiB
#: Slack kept back by auto-sizing so rounding and small buffers still fit the budget.
ALLOCATION_SLACK_FRACTION = 0.05
#: v1 reports "no limit" as a huge page-rounded number; anything this large is no limit.
_UNLIMITED = 1 << 60


def _error(field_name: str, message: str):
    # imported lazily: keeps this module importable without the memory package
    from sglang_hydra.memory.errors import setup_error

    return setup_error(field_name, message, source="hostmem")


# ---------------------------------------------------------------------------------------
# raw readers
# ---------------------------------------------------------------------------------------

def _read_text(path: str) -> str:
    with open(path, "r") as fh:
        return fh.read()


def _read_int_or_max(path: str) -> Optional[int]:
    """An integer file; None for 'max' (no limit). Raises OSError when missing."""
    text = _read_text(path).strip()
    if text == "max":
        return None
    return int(text)


def _stat_fields(path: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for line in _read_text(path).splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = int(parts[1])
            except ValueError:
                pass
    return out


def _meminfo_bytes(proc_root: str, key: str) -> Optional[int]:
    try:
        for line in _read_text(os.path.join(proc_root, "meminfo")).splitlines():
            if line.startswith(key + ":"):
                parts = line.split()
                scale = 1024 if len(parts) > 2 and parts[2].lower() == "kb" else 1
                return int(parts[1]) * scale
    except OSError:
        pass
    return None


def meminfo_available_bytes(proc_root: str = "/proc") -> int:
    """MemAvailable from ``<proc_root>/meminfo``; falls back to free pages via sysconf."""
    found = _meminfo_bytes(proc_root, "MemAvailable")
    if found is not None:
        return found
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - exotic platforms
        return 0


def meminfo_total_bytes(proc_root: str = "/proc") -> int:
    """MemTotal from ``<proc_root>/meminfo``; falls back to physical pages via sysconf."""
    found = _meminfo_bytes(proc_root, "MemTotal")
    if found is not None:
        return found
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - exotic platforms
        return 0


# ---------------------------------------------------------------------------------------
# cgroup discovery
# ---------------------------------------------------------------------------------------

@dataclass
class CgroupLimit:
    """One limit file seen while walking up the cgroup tree."""

    path: str
    version: int
    limit: int
    usage: int
    page_cache: int
    headroom: int


@dataclass
class _Mount:
    root: str
    mountpoint: str
    version: int
    controllers: Tuple[str, ...]


def _unescape(path: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 3 < len(path) and path[i + 1:i + 4].isdigit():
            out.append(chr(int(path[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _cgroup_mounts(proc_root: str) -> List[_Mount]:
    mounts: List[_Mount] = []
    for line in _read_text(os.path.join(proc_root, "self", "mountinfo")).splitlines():
        if " - " not in line:
            continue
        pre, post = line.split(" - ", 1)
        pre_f, post_f = pre.split(), post.split()
        if len(pre_f) < 5 or len(post_f) < 1:
            continue
        fstype = post_f[0]
        superopts = post_f[2] if len(post_f) > 2 else ""
        root, mountpoint = _unescape(pre_f[3]), _unescape(pre_f[4])
        if fstype == "cgroup2":
            mounts.append(_Mount(root, mountpoint, 2, ()))
        elif fstype == "cgroup":
            mounts.append(_Mount(root, mountpoint, 1, tuple(superopts.split(","))))
    return mounts


def _memberships(proc_root: str) -> List[Tuple[int, str]]:
    """(version, path) for the v2 membership and the v1 ``memory`` membership."""
    out: List[Tuple[int, str]] = []
    for line in _read_text(os.path.join(proc_root, "self", "cgroup")).splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":
            out.append((2, path))
        elif "memory" in controllers.split(","):
            out.append((1, path))
    return out


def _locate(version: int, path: str, mounts: List[_Mount], cgroup_root: str) -> Optional[Tuple[str, str]]:
    """(process cgroup dir, mount dir) on the host filesystem, or None."""
    for m in mounts:
        if m.version != version or (version == 1 and "memory" not in m.controllers):
            continue
        root = m.root.rstrip("/")
        if path != root and not path.startswith(root + "/") and root != "":
            continue
        rel = path[len(root):].lstrip("/")
        top = cgroup_root.rstrip("/") + m.mountpoint if cgroup_root else m.mountpoint
        here = os.path.join(top, rel) if rel else top
        if os.path.isdir(here):
            return here, top
    return None


def _descendants_protect_memory(directory: str, budget: int = 4096) -> bool:
    """True if some cgroup below ``directory`` has a non-zero or unreadable memory.min.

    The scan is bounded; running out of budget is treated as 'protected' (no credit),
    which can only make the headroom smaller, never larger.
    """
    stack = [directory]
    seen = 0
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            return True
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                continue
            seen += 1
            if seen > budget:
                return True
            try:
                val = _read_int_or_max(os.path.join(e.path, "memory.min"))
            except FileNotFoundError:
                val = 0  # controller not enabled there: no protection
            except (OSError, ValueError):
                return True
            if val is None or val != 0:
                return True
            stack.append(e.path)
    return False


def _level_limits(version: int, directory: str) -> List[CgroupLimit]:
    names = ("memory.max", "memory.high") if version == 2 else ("memory.limit_in_bytes",)
    usage_name = "memory.current" if version == 2 else "memory.usage_in_bytes"
    found: List[Tuple[str, int]] = []
    for name in names:
        try:
            val = _read_int_or_max(os.path.join(directory, name))
        except FileNotFoundError:
            continue
        except ValueError:
            continue
        if val is None or val >= _UNLIMITED:
            continue
        found.append((name, val))
    if not found:
        return []
    usage = _read_int_or_max(os.path.join(directory, usage_name)) or 0
    cache = 0
    try:
        st = _stat_fields(os.path.join(directory, "memory.stat"))
        if version == 2:
            cache = st.get("active_file", 0) + st.get("inactive_file", 0)
            if cache and _descendants_protect_memory(directory):
                cache = 0
        else:
            cache = st.get("total_active_file", 0) + st.get("total_inactive_file", 0)
    except OSError:
        cache = 0
    used = max(0, usage - cache)
    return [CgroupLimit(os.path.join(directory, name), version, lim, usage, cache, max(0, lim - used))
            for name, lim in found]


def cgroup_memory_limits(proc_root: str = "/proc", cgroup_root: str = "") -> Optional[List[CgroupLimit]]:
    """Every finite memory limit between the process cgroup and its mount root.

    Returns None when there is no procfs (not Linux) and ``[]`` when no limit is set.
    Raises :class:`HostMemoryProbeError` (an OSError/RuntimeError-style failure) when the
    process belongs to a memory cgroup that cannot be found on any mounted hierarchy.
    """
    from sglang_hydra.memory.errors import HostMemoryProbeError

    if not os.path.exists(os.path.join(proc_root, "self", "cgroup")):
        return None
    try:
        memberships = _memberships(proc_root)
        mounts = _cgroup_mounts(proc_root)
    except OSError as exc:
        raise HostMemoryProbeError(f"cannot read cgroup membership: {exc}") from exc
    limits: List[CgroupLimit] = []
    located_any = False
    for version, path in memberships:
        loc = _locate(version, path, mounts, cgroup_root)
        if loc is None:
            continue
        located_any = True
        here, top = loc
        top = os.path.normpath(top)
        d = os.path.normpath(here)
        while True:
            limits.extend(_level_limits(version, d))
            if d == top or len(d) <= len(top):
                break
            d = os.path.dirname(d)
    if memberships and not located_any:
        raise HostMemoryProbeError("Cannot locate the process memory cgroup in mounted cgroup filesystems")
    return limits


# ---------------------------------------------------------------------------------------
# available memory and budget
# ---------------------------------------------------------------------------------------

@dataclass
class HostMemoryInfo:
    """A snapshot of host memory as seen by this process."""

    available: int                      # min(meminfo, cgroup headroom)
    meminfo_available: int
    cgroup_headroom: Optional[int] = None
    cgroup_limit: Optional[int] = None  # the limit whose headroom is the tightest
    cgroup_limit_path: Optional[str] = None
    limits: List[CgroupLimit] = field(default_factory=list)
    note: str = ""

    def describe(self) -> str:
        if self.cgroup_limit is not None:
            return (f"cgroup limit {self.cgroup_limit / GiB:.1f} GiB at {self.cgroup_limit_path}, "
                    f"headroom {self.cgroup_headroom / GiB:.1f} GiB")
        return "no cgroup limit" + (f" ({self.note})" if self.note else "")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def fixed(cls, available: int, note: str = "fixed for a test") -> "HostMemoryInfo":
        """A snapshot with a given amount of available memory (tests, dry runs)."""
        return cls(available=int(available), meminfo_available=int(available), note=note)


def probe_host_memory(proc_root: str = "/proc", cgroup_root: str = "",
                      allow_cgroup_fallback: bool = True) -> HostMemoryInfo:
    """Measure available host memory, cgroup aware.

    When the cgroup probe fails, ``allow_cgroup_fallback`` decides: True keeps the plain
    MemAvailable figure (with a note), False raises a setup error telling the user to give
    ``--hicache-size`` explicitly (auto-sizing must not guess inside a container).
    """
    from sglang_hydra.memory.errors import HostMemoryProbeError

    avail = meminfo_available_bytes(proc_root)
    try:
        limits = cgroup_memory_limits(proc_root, cgroup_root)
    except (OSError, RuntimeError, HostMemoryProbeError) as exc:
        if not allow_cgroup_fallback:
            raise _error("hicache_size",
                         "cannot size the HiCache host pool automatically because the memory "
                         f"cgroup could not be read ({exc}); give --hicache-size (GB per rank) "
                         "and leave room for everything else inside the container limit") from exc
        return HostMemoryInfo(avail, avail, note=f"cgroup probe failed, using MemAvailable: {exc}")
    if not limits:
        return HostMemoryInfo(avail, avail, note="no procfs" if limits is None else "")
    tight = min(limits, key=lambda c: c.headroom)
    return HostMemoryInfo(min(avail, tight.headroom), avail, tight.headroom, tight.limit,
                          tight.path, list(limits))


def host_capacity_bytes(proc_root: str = "/proc", cgroup_root: str = "") -> Tuple[int, str]:
    """(bytes, why): how much RAM this process could ever get, whatever else is running.

    The smaller of MemTotal and the tightest cgroup *limit* (not headroom), so the answer
    does not move when other processes allocate.  Sizing that must not depend on momentary
    free memory (CPU runs, ``hardware=local`` without a GPU) uses this.
    """
    total = meminfo_total_bytes(proc_root)
    try:
        limits = cgroup_memory_limits(proc_root, cgroup_root) or []
    except (OSError, RuntimeError) as exc:
        return total, f"MemTotal {total / GiB:.1f} GiB (cgroup not readable: {exc})"
    if limits:
        tight = min(limits, key=lambda c: c.limit)
        if tight.limit < total:
            return tight.limit, f"cgroup limit {tight.limit / GiB:.1f} GiB at {tight.path}"
    return total, f"MemTotal {total / GiB:.1f} GiB"


def available_host_memory_bytes(proc_root: str = "/proc", cgroup_root: str = "",
                                allow_cgroup_fallback: bool = True) -> int:
    return probe_host_memory(proc_root, cgroup_root, allow_cgroup_fallback).available


def ranks_per_host(tp_size: int = 1, pp_size: int = 1, nnodes: int = 1) -> int:
    """Ranks sharing this host's memory (the launch world split over the nodes)."""
    return max((max(1, tp_size) * max(1, pp_size)) // max(1, nnodes), 1)


def host_memory_budget_bytes(info: Optional[HostMemoryInfo] = None, *, ranks: int = 1,
                             auto_size: bool = False, proc_root: str = "/proc",
                             cgroup_root: str = "") -> int:
    """Bytes one rank may give to host KV pools: (available - 10 GiB reserve) // ranks.

    May be negative when less than the reserve is available; callers compare against it.
    """
    if info is None:
        info = probe_host_memory(proc_root, cgroup_root, allow_cgroup_fallback=not auto_size)
    return (info.available - HICACHE_HOST_MEMORY_RESERVE_BYTES) // max(1, ranks)


def auto_size_ratio(requested_ratio: float, budget_bytes: int, device_bytes: int) -> float:
    """The host/device ratio auto-sizing settles on (``budget_bytes`` already scaled).

    ``min(requested, budget * (1 - 0.05) / device_bytes)``; a result ≤ 0 is an error.
    """
    if device_bytes <= 0:
        raise _error("hicache_host_memory_fraction", "the device KV pool has no bytes to mirror")
    ratio = min(float(requested_ratio), budget_bytes * (1 - ALLOCATION_SLACK_FRACTION) / device_bytes)
    if ratio <= 0:
        raise _error("hicache_host_memory_fraction",
                     "after keeping the 10 GiB host reserve there is no memory left for the HiCache "
                     "host pool; give --hicache-ratio or --hicache-size explicitly")
    return ratio


def host_pool_tokens(*, page_size: int, size_per_token: int, device_tokens: int,
                     ratio: Optional[float], hicache_size_gb: float = 0) -> Tuple[int, int]:
    """(tokens, pages) of the host pool: size in GB wins, else ratio × device tokens.

    The count is floored to whole pages and one extra page is added, so a pool is never
    empty; e.g. 1000 device tokens × 2.0 at page 16 → 125 + 1 pages = 2016 tokens.
    """
    if hicache_size_gb and hicache_size_gb > 0:
        tokens = int(hicache_size_gb * GB // size_per_token)
    else:
        tokens = int(device_tokens * float(ratio if ratio is not None else 2.0))
    pages = tokens // page_size + 1
    return pages * page_size, pages


def check_host_request(requested_bytes: int, available_bytes: int, field_name: str = "hicache_ratio") -> None:
    """Refuse a host pool larger than the budget, in GB (1e9) with two decimals."""
    if requested_bytes > available_bytes:
        raise _error(field_name,
                     f"not enough host memory: the HiCache host pool needs {requested_bytes / GB:.2f} GB but only "
                     f"{available_bytes / GB:.2f} GB of host memory is free for it (after the 10 GiB "
                     "reserve); make the hierarchical cache smaller")


__all__ = [
    "GiB", "GB", "HICACHE_HOST_MEMORY_RESERVE_BYTES", "ALLOCATION_SLACK_FRACTION",
    "CgroupLimit", "HostMemoryInfo", "meminfo_available_bytes", "cgroup_memory_limits",
    "probe_host_memory", "available_host_memory_bytes", "meminfo_total_bytes", "host_capacity_bytes", "ranks_per_host",
    "host_memory_budget_bytes", "auto_size_ratio", "host_pool_tokens", "check_host_request",
]
