"""The two-namespace lab: it links, shapes, cuts, and leaves nothing behind (also when killed).

These tests need root, iproute2 and nftables. They skip, naming what is missing, only outside
CI; with CI=true a missing requirement fails the run (CI installs both and runs as root).
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sglang_hydra.utils.netns import ADDR_B, NetLab, missing_requirements, sweep

MISSING = missing_requirements()
if MISSING and os.environ.get("CI", "").lower() in ("1", "true", "yes"):
    pytest.fail("CI=true but the namespace tests cannot run: missing " + "; ".join(MISSING), pytrace=False)
needs_lab = pytest.mark.skipif(bool(MISSING), reason="network namespaces need " + "; ".join(MISSING))

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

_SERVER = textwrap.dedent(f"""
    import socket, time
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("{ADDR_B}", 5001)); s.listen(); s.settimeout(60)
    c, _ = s.accept(); c.settimeout(60); n = 0; t = None
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        if t is None:
            t = time.perf_counter()
        n += len(d)
    print(n, time.perf_counter() - (t or time.perf_counter()), flush=True)
""")
_CLIENT = textwrap.dedent(f"""
    import socket, sys, time
    for attempt in range(100):              # the server may not listen yet (bounded: 100 x 0.1 s)
        try:
            s = socket.create_connection(("{ADDR_B}", 5001), timeout=30)
            break
        except ConnectionRefusedError:
            time.sleep(0.1)
    s.settimeout(60)
    n = int(sys.argv[1]); t = time.perf_counter(); s.sendall(b"x" * n); s.close()
    print(time.perf_counter() - t, flush=True)
""")


def _send(lab, nbytes):
    """Send ``nbytes`` from a to b over TCP; (bytes b received, seconds from b's first byte to its last).

    Timed at the receiver: the sender's ``sendall`` returns once the bytes sit in its socket
    buffer, which on a shaped link is long before they have crossed it."""
    srv = lab.spawn("b", [sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    subprocess.run(lab.command("a", [sys.executable, "-c", _CLIENT, str(nbytes)]), capture_output=True,
                   text=True, timeout=90)
    got, seconds = srv.communicate(timeout=90)[0].split()
    return int(got), float(seconds)


def _namespaces():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@needs_lab
def test_the_lab_links_two_namespaces_and_shapes_the_link():
    with NetLab() as lab:
        assert lab.exists()
        got, clean_s = _send(lab, 4 << 20)
        assert got == 4 << 20
        lab.set_rate(50)                               # 50 Mbit/s: 4 MiB take >= 0.66 s on the wire
        got, slow_s = _send(lab, 4 << 20)
        assert got == 4 << 20 and slow_s > 0.5 and slow_s > 3 * clean_s
        lab.clear_shaping()
        lab.set_loss(10)                               # every byte still arrives (TCP), packets were dropped
        got, _ = _send(lab, 2 << 20)
        assert got == 2 << 20 and lab.dropped() > 0
        lab.set_loss(0)
        assert lab.dropped() == 0                      # the rule (and its counter) is gone
    assert lab.ns["a"] not in _namespaces() and lab.ns["b"] not in _namespaces()


@needs_lab
def test_link_down_cuts_the_link_and_up_restores_it():
    with NetLab() as lab:
        lab.link_down()
        probe = [sys.executable, "-c", f"import socket; socket.create_connection(('{ADDR_B}', 9), timeout=1)"]
        down = subprocess.run(lab.command("a", probe), capture_output=True, text=True, timeout=10)
        assert down.returncode != 0 and ("unreachable" in down.stderr or "timed out" in down.stderr)
        lab.link_up()
        got, _ = _send(lab, 1 << 20)
        assert got == 1 << 20


@needs_lab
def test_sigterm_removes_everything_and_sweep_removes_what_a_kill9_left():
    code = textwrap.dedent("""
        import sys, time
        from sglang_hydra.utils.netns import NetLab
        lab = NetLab()
        lab.spawn("a", [sys.executable, "-c", "import time; time.sleep(60)"])
        print(lab.ns["a"], lab.ns["b"], flush=True)
        time.sleep(60)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
        names = p.stdout.readline().split()
        assert len(names) == 2 and all(n in _namespaces() for n in names)
        p.send_signal(sig)
        p.wait(timeout=20)
        if sig == signal.SIGKILL:                      # nothing could run: the leftovers stay ...
            assert all(n in _namespaces() for n in names)
            removed = sweep()                          # ... until the next lab (or sweep) clears them
            assert set(names) <= set(removed)
        assert not any(n in _namespaces() for n in names), sig


def test_missing_requirements_exit_2_naming_them(monkeypatch, capsys):
    import scripts.fault_matrix as fm
    monkeypatch.setattr("sglang_hydra.utils.netns.missing_requirements",
                        lambda: ["root (network namespaces need CAP_NET_ADMIN; run as root)", "`nft` (nftables)"])
    assert fm.main([]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["fault_matrix: missing root (network namespaces need CAP_NET_ADMIN; run as root)",
                   "fault_matrix: missing `nft` (nftables)"]


def test_missing_requirements_names_root_and_each_tool(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("PATH", "/nonexistent")
    got = missing_requirements()
    assert got[0].startswith("root") and [g.split("`")[1] for g in got[1:]] == ["ip", "tc", "nft"]
