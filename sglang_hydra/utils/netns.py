"""Two hosts on one machine: network namespaces joined by a veth pair, with a shapeable link.

:class:`NetLab` creates two namespaces (``a`` and ``b``), one veth pair between them with the
addresses :data:`ADDR_A` / :data:`ADDR_B` (198.18.0.0/15 is reserved for benchmarking, RFC 2544;
no other range is ever used), and starts processes inside them. The link can be shaped while
processes run: a token-bucket rate (``tc qdisc tbf``), random packet loss (an nftables rule
``numgen random mod 100 lt N drop`` in each namespace; the kernels here have no netem) and the
link itself set down and up.

Everything it creates carries one name prefix plus the owning process id, so :func:`sweep`
can remove what an earlier run left behind when it was killed (namespaces whose owner is dead,
their processes, stray veth ends in the root namespace). :meth:`NetLab.close` runs on normal
exit, on ``atexit``, and on SIGINT/SIGTERM. It is generic plumbing: nothing here knows about
KV transfer. It needs root, ``ip`` and ``tc`` (iproute2) and ``nft`` (nftables):
:func:`missing_requirements` names what is absent.
"""
from __future__ import annotations

import atexit
import os
import re
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence

PREFIX = "shx"                     # every namespace / interface this module creates starts with it
ADDR_A, ADDR_B = "198.18.0.1", "198.18.0.2"
_NETMASK = 30
_CMD_TIMEOUT = 10.0               # seconds for one ip/tc/nft call
_STOP_GRACE = 3.0                 # seconds a process gets between SIGTERM and SIGKILL


class NetLabError(RuntimeError):
    """An ip/tc/nft command failed (the message names the command and its stderr)."""


def missing_requirements() -> List[str]:
    """What this machine lacks to build a lab (empty when it can): root, ip, tc, nft."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (network namespaces need CAP_NET_ADMIN; run as root)")
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            missing.append(f"`{tool}` (Debian package {pkg})")
    return missing


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        cp = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        raise NetLabError(f"`{' '.join(argv)}` did not finish within {_CMD_TIMEOUT:.0f}s") from e
    if check and cp.returncode != 0:
        raise NetLabError(f"`{' '.join(argv)}` failed (exit {cp.returncode}): {cp.stderr.strip()}")
    return cp


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_NAME = re.compile(rf"^{PREFIX}([0-9a-f]+)x[0-9a-f]+[ab]0?$")


def _owner(name: str) -> Optional[int]:
    m = _NAME.match(name)
    return int(m.group(1), 16) if m else None


def _namespaces() -> List[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_pids_in(ns: str) -> None:
    pids = [int(p) for p in _run(["ip", "netns", "pids", ns], check=False).stdout.split() if p.isdigit()]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def sweep(prefix: str = PREFIX) -> List[str]:
    """Remove namespaces and veth ends left by dead owners (names ``<prefix><owner pid>x...``).

    Returns what was removed. A namespace whose owner still runs (another live lab) is left alone.
    """
    removed = []
    for ns in _namespaces():
        owner = _owner(ns)
        if ns.startswith(prefix) and owner is not None and not _pid_alive(owner):
            _kill_pids_in(ns)
            _run(["ip", "netns", "del", ns], check=False)
            removed.append(ns)
    links = _run(["ip", "-o", "link", "show"], check=False).stdout
    for m in re.finditer(r"^\d+:\s+([^:@\s]+)", links, re.M):
        name = m.group(1)
        owner = _owner(name)
        if name.startswith(prefix) and owner is not None and not _pid_alive(owner):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    return removed


_LIVE: Dict[int, "NetLab"] = {}
_HANDLERS_INSTALLED = False


def _close_all() -> None:
    for lab in list(_LIVE.values()):
        lab.close()


def _on_signal(signum, frame) -> None:
    _close_all()
    prev = _PREVIOUS.get(signum)
    if callable(prev):
        prev(signum, frame)
    raise SystemExit(128 + signum)


_PREVIOUS: Dict[int, object] = {}


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_close_all)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            prev = signal.getsignal(sig)
            _PREVIOUS[sig] = prev if prev not in (signal.SIG_DFL, signal.SIG_IGN, signal.default_int_handler) \
                else None
            signal.signal(sig, _on_signal)
    except ValueError:   # not the main thread: atexit still cleans up
        pass


class NetLab:
    """Namespaces ``a`` and ``b`` joined by a veth pair (``ADDR_A`` <-> ``ADDR_B``).

    ``with NetLab() as lab: lab.spawn("a", [...])``; shaping: :meth:`set_rate`, :meth:`set_loss`,
    :meth:`link_down` / :meth:`link_up`, :meth:`clear_shaping`.
    """

    _serial = 0

    def __init__(self, prefix: str = PREFIX):
        missing = missing_requirements()
        if missing:
            raise NetLabError("cannot build network namespaces: missing " + "; ".join(missing))
        NetLab._serial += 1
        tag = f"{prefix}{os.getpid():x}x{NetLab._serial:x}"
        if len(tag) + 2 > 15:   # interface names are at most 15 characters
            raise NetLabError(f"lab name {tag!r} too long for an interface name")
        self.ns = {"a": tag + "a", "b": tag + "b"}
        self.dev = {"a": tag + "a0", "b": tag + "b0"}
        self.addr = {"a": ADDR_A, "b": ADDR_B}
        self.procs: List[subprocess.Popen] = []
        self._closed = False
        _install_handlers()
        sweep(prefix)
        _LIVE[id(self)] = self
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- construction
    def _ip(self, side: str, *args: str, check: bool = True):
        return _run(["ip", "-n", self.ns[side], *args], check=check)

    def _build(self) -> None:
        for side in "ab":
            _run(["ip", "netns", "add", self.ns[side]])
        _run(["ip", "link", "add", self.dev["a"], "type", "veth", "peer", "name", self.dev["b"]])
        for side in "ab":
            _run(["ip", "link", "set", self.dev[side], "netns", self.ns[side]])
            self._ip(side, "addr", "add", f"{self.addr[side]}/{_NETMASK}", "dev", self.dev[side])
            self._ip(side, "link", "set", "lo", "up")
            self._ip(side, "link", "set", self.dev[side], "up")
            nft = ["ip", "netns", "exec", self.ns[side], "nft"]
            _run(nft + ["add", "table", "inet", "shx"])
            _run(nft + ["add", "chain", "inet", "shx", "in", "{ type filter hook input priority 0 ; }"])

    # ---------------------------------------------------------------- processes
    def command(self, side: str, argv: Sequence[str]) -> List[str]:
        """``argv`` run inside namespace ``side``."""
        return ["ip", "netns", "exec", self.ns[side], *argv]

    def spawn(self, side: str, argv: Sequence[str], **popen) -> subprocess.Popen:
        """Start ``argv`` in namespace ``side``; it is killed when the lab closes."""
        popen.setdefault("start_new_session", True)
        p = subprocess.Popen(self.command(side, argv), **popen)
        self.procs.append(p)
        return p

    # ---------------------------------------------------------------- shaping
    def set_rate(self, mbit: float) -> None:
        """Limit both directions to ``mbit`` Mbit/s (token bucket, 100 ms queue)."""
        burst = max(32 * 1024, int(mbit * 1e6 / 8 / 100))   # >= 10 ms worth of bytes
        for side in "ab":
            self._ip(side, "link", "show", self.dev[side])
            _run(["tc", "-n", self.ns[side], "qdisc", "replace", "dev", self.dev[side], "root", "tbf",
                  "rate", f"{mbit}mbit", "burst", str(burst), "latency", "100ms"])

    def set_loss(self, percent: int) -> None:
        """Drop ``percent`` % of the packets arriving on each side, at random."""
        if not 0 <= int(percent) <= 100:
            raise ValueError(f"loss percent must be within 0..100, got {percent}")
        for side in "ab":
            nft = ["ip", "netns", "exec", self.ns[side], "nft"]
            _run(nft + ["flush", "chain", "inet", "shx", "in"])
            if percent:
                _run(nft + ["add", "rule", "inet", "shx", "in", "iifname", self.dev[side], "numgen", "random",
                            "mod", "100", "lt", str(int(percent)), "counter", "drop"])

    def link_down(self) -> None:
        self._ip("a", "link", "set", self.dev["a"], "down")

    def link_up(self) -> None:
        self._ip("a", "link", "set", self.dev["a"], "up")
        # the address routes come back with the carrier; wait (bounded) until both ends are up
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            if all("LOWER_UP" in self._ip(s, "link", "show", self.dev[s]).stdout for s in "ab"):
                return
            time.sleep(0.05)
        raise NetLabError("the veth link did not come back up within 5 s")

    def clear_shaping(self) -> None:
        for side in "ab":
            _run(["tc", "-n", self.ns[side], "qdisc", "del", "dev", self.dev[side], "root"], check=False)
        self.set_loss(0)

    def stats(self, side: str) -> Dict[str, int]:
        """Packet counters of ``side``'s veth end (rx/tx packets and drops)."""
        out = self._ip(side, "-s", "link", "show", self.dev[side]).stdout.split("\n")
        nums = {}
        for i, line in enumerate(out):
            if line.strip().startswith("RX:") and i + 1 < len(out):
                f = out[i + 1].split()
                nums.update(rx_bytes=int(f[0]), rx_packets=int(f[1]))
            if line.strip().startswith("TX:") and i + 1 < len(out):
                f = out[i + 1].split()
                nums.update(tx_bytes=int(f[0]), tx_packets=int(f[1]))
        return nums

    def dropped(self) -> int:
        """Packets the loss rule has dropped so far (both sides together)."""
        total = 0
        for side in "ab":
            out = _run(["ip", "netns", "exec", self.ns[side], "nft", "list", "chain", "inet", "shx", "in"],
                       check=False).stdout
            total += sum(int(n) for n in re.findall(r"counter packets (\d+)", out))
        return total

    # ---------------------------------------------------------------- teardown
    def close(self) -> None:
        """Kill the lab's processes and delete its namespaces (idempotent, never raises)."""
        if self._closed:
            return
        self._closed = True
        _LIVE.pop(id(self), None)
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + _STOP_GRACE
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                try:
                    p.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
        for side in "ab":
            try:
                _kill_pids_in(self.ns[side])
                _run(["ip", "netns", "del", self.ns[side]], check=False)
            except Exception:
                pass
        try:
            _run(["ip", "link", "del", self.dev["a"]], check=False)   # only exists if never moved
        except Exception:
            pass

    def __enter__(self) -> "NetLab":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def exists(self) -> bool:
        return any(ns in _namespaces() for ns in self.ns.values())
