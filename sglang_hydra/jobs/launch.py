"""``job=launch``: start the SGLang server(s) the record or deployment describes, and keep them as one.

Each server runs as ``<job.python> -m sglang.launch_server <the record's reference flags>`` (the
same flags ``job=resolve job.format=argv`` prints); with ``deploy=pd`` the router starts once both
servers answer ``/health``.  Their output is streamed with a role prefix (``[prefill] ...``).
The group lives and dies together: Ctrl-C or SIGTERM is passed to every child, and when one child
exits the others are stopped and the launch exits with that child's status.

Before anything starts, the interpreters are checked for the modules they must run and every
port the deployment binds is checked to be free; either failing is a configuration error (exit 2)
that says what to change.  ``job.dry_run=true`` prints the command lines and starts nothing.
"""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from ..config.deploy import Deployment, as_deployment, connect_host, listening_ports, router_argv
from ..config.errors import ConfigError, Problem
from ..utils.ports import port_is_free
from .context import JobContext
from .resolve import render

EXIT_LAUNCH_FAILED = 1      # a server never became healthy, or exited by itself with status 0
_POLL_S = 0.2
_HEALTH_REQUEST_TIMEOUT_S = 2.0
_ROUTER_FIX = "pip install 'sglang-hydra[router]' (sglang-router==0.3.2)"
_SERVER_FIX = "pip install sglang"


@dataclass(frozen=True)
class ChildPlan:
    role: str                 # prefill | decode | server | router
    command: Tuple[str, ...]
    health_url: str


def plan_children(dep: Deployment, job: dict) -> List[ChildPlan]:
    """The command lines, in start order: the servers, then (pd) the router."""
    python = job.get("python") or sys.executable
    out = [ChildPlan(s.name, (python, "-m", job.get("server_module") or "sglang.launch_server",
                              *shlex.split(render(s.record, "argv"))), f"{s.url}/health")
           for s in dep.servers]
    if dep.router is not None:
        router_python = job.get("router_python") or python
        out.append(ChildPlan("router", (router_python, "-m", job.get("router_module") or "sglang_router.launch_router",
                                        *router_argv(dep)), f"{dep.router.url}/health"))
    return out


def _timeout_problems(job: dict) -> List[Problem]:
    out = []
    for key, default in (("health_timeout", 1800.0), ("stop_timeout", 30.0)):
        value = job.get(key, default)
        try:
            ok = float(value) > 0 and float(value) != float("inf")
        except (TypeError, ValueError):
            ok = False
        if not ok:
            out.append(Problem(f"job.{key}", None, f"{value!r} is not a positive, finite number of seconds", "launch"))
    return out


def run(record, job: dict, ctx: JobContext) -> int:
    dep = as_deployment(record)
    bad = _timeout_problems(job)
    if bad:
        raise ConfigError(bad)
    children = plan_children(dep, job)
    if job.get("dry_run"):
        for c in children:
            print(f"# {c.role} (health: {c.health_url})")
            print(shlex.join(c.command))
        if (job.get("server_module") or "sglang.launch_server") == "sglang.launch_server":
            for p in _checkpoint_problems(dep) + _policy_problems(dep, job):   # said now, not first when the real launch refuses
                print(f"sglang-hydra: note: {p.key}: {p.message}", file=sys.stderr)
        return 0
    _preflight(dep, job)
    return _Supervisor(children, float(job.get("health_timeout", 1800.0)), float(job.get("stop_timeout", 30.0))).run()


# --------------------------------------------------------------------------- checks before starting
def _preflight(dep: Deployment, job: dict) -> None:
    """Every interpreter can import what it must run, and every port is free; else exit 2 with the fix."""
    problems: List[Problem] = []
    python = job.get("python") or sys.executable
    server_module = job.get("server_module") or "sglang.launch_server"
    problems += _module_problems("job.python", python, server_module, _SERVER_FIX)
    if server_module == "sglang.launch_server":
        problems += _checkpoint_problems(dep)
        problems += _policy_problems(dep, job)
    server_python_broken = any(p.key == "job.python" and "not an executable" in p.message for p in problems)
    if dep.router is not None and (job.get("router_python") or not server_python_broken):
        # the router may live in its own environment: job.router_python is the setting to change
        problems += _module_problems("job.router_python", job.get("router_python") or python,
                                     job.get("router_module") or "sglang_router.launch_router", _ROUTER_FIX)
    foreign = set()
    for label, host, port in listening_ports(dep):
        key, flag, what = _parse_label(label)
        bind_host = "0.0.0.0" if host in ("", "0.0.0.0") else host
        if ":" in bind_host:          # IPv6 binds are left to the server itself
            continue
        if not _is_local_address(bind_host):
            host_key, host_flag = _host_key(key)
            if (host_key, bind_host) not in foreign:
                foreign.add((host_key, bind_host))
                problems.append(Problem(host_key, host_flag, f"{bind_host} is not an address of this machine; "
                                        f"job=launch starts every server and the router here, so each must bind "
                                        f"a local address (127.0.0.1, 0.0.0.0 or one of this machine's); to run "
                                        f"servers on other machines, start each there", "launch"))
            continue
        if not port_is_free(port, bind_host):
            where = f" ({what})" if what else ""
            problems.append(Problem(key, flag, f"{bind_host}:{port}{where} is already in use; stop what listens "
                                    f"there or choose a free port with {key}=<port>", "launch"))
    if problems:
        raise ConfigError(problems)


def _parse_label(label: str) -> Tuple[str, Optional[str], str]:
    """(key, flag, what) from a ``listening_ports`` label: ``key (--flag) [what]``."""
    import re
    m = re.match(r"^(?P<key>\S+)(?: \((?P<flag>[^)]*)\))?(?: \[(?P<what>.*)\])?$", label)
    if not m:
        return label, None, ""
    return m["key"], m["flag"], m["what"] or ""


def _host_key(port_key: str) -> Tuple[str, Optional[str]]:
    """The host setting that goes with a port key: ``decode.serving.host (--host)``, ``deploy.router_host``."""
    from ..config.errors import problem_for
    if port_key.endswith("dist_init_addr"):       # that setting names its host itself
        return port_key, problem_for("dist_init_addr", "").flag
    if port_key.startswith("deploy."):
        return "deploy.router_host", None
    p = problem_for("host", "")
    role = port_key.split(".")[0]
    return (f"{role}.{p.key}" if role in ("prefill", "decode") else p.key), p.flag


def _is_local_address(host: str) -> bool:
    """Whether this machine can bind ``host`` (a wildcard, loopback or one of its own addresses)."""
    import errno
    import socket
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False
    for *_rest, addr in infos:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr[0], 0))
                return True
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    return True     # some other reason (permissions): not this check's business
    return False


def _checkpoint_problems(dep: Deployment) -> List[Problem]:
    """A model preset without a checkpoint (``tiny``: a geometry for tests and simulation)
    names nothing SGLang could load; say so before any server starts."""
    from ..config.presets import group_options, preset
    geometry_only = {name for name in group_options("model")
                     if ((preset("model", name)[0] or {}).get("model") or {}).get("model_path") == name}
    real = sorted(set(group_options("model")) - geometry_only)
    return [Problem("model.model_path", "--model-path",
                    f"{s.role}: {s.record.model_path!r} is a built-in test geometry with no checkpoint, so SGLang "
                    f"cannot load it; pass --model-path <Hugging Face id or checkpoint directory>, or select a "
                    f"model preset that names one (model={'|'.join(real)})", "launch")
            for s in dep.servers if s.record.model_path in geometry_only and not s.index]


def _policy_problems(dep: Deployment, job: dict) -> List[Problem]:
    """The servers' eviction policy must be one SGLang runs (ours need the engine plugin in job.python)."""
    from ..config.engine_check import eviction_policy_problems
    python = job.get("python") or sys.executable
    seen, out = set(), []
    for s in dep.servers:
        for p in eviction_policy_problems(s.record, python):
            if p.message not in seen:
                seen.add(p.message)
                out.append(p)
    return out


def _module_problems(key: str, python: str, module: str, fix: str) -> List[Problem]:
    exe = shutil.which(python) if os.sep not in python else (python if os.access(python, os.X_OK) else None)
    if exe is None:
        return [Problem(key, None, f"{python!r} is not an executable Python interpreter; set {key}=<path to the "
                        f"python that has {module.split('.')[0]}>", "launch")]
    top = module.split(".")[0]
    probe = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"
    try:
        r = subprocess.run([exe, "-c", probe, top], stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
        ok = r.returncode == 0
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [Problem(key, None, f"cannot run {exe} ({exc}); set {key}=<a working interpreter>", "launch")]
    if ok:
        return []
    return [Problem(key, None, f"{exe} cannot import {top!r} (needed for `python -m {module}`); install it there "
                    f"({fix}) or set {key}=<the python that has it>", "launch")]


# --------------------------------------------------------------------------- supervision
def _exit_status(returncode: int) -> int:
    """A child's status as a shell reports it (killed by signal N: 128 + N)."""
    return 128 - returncode if returncode < 0 else returncode


def _healthy(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))   # never via an http proxy
    try:
        with opener.open(url, timeout=_HEALTH_REQUEST_TIMEOUT_S) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


class _Supervisor:
    """Starts the children in order and keeps the group together until one ends or a signal comes."""

    def __init__(self, plans: List[ChildPlan], health_timeout: float, stop_timeout: float):
        self.plans = plans
        self.health_timeout = health_timeout
        self.stop_timeout = stop_timeout
        self.procs: Dict[str, subprocess.Popen] = {}
        self.pumps: List[threading.Thread] = []
        self.print_lock = threading.Lock()
        self.signum: Optional[int] = None

    # ---- output
    def say(self, text: str, *, err: bool = False) -> None:
        with self.print_lock:
            stream = sys.stderr if err else sys.stdout
            print(f"[launch] {text}", file=stream, flush=True)

    def _pump(self, role: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            with self.print_lock:
                print(f"[{role}] {line}", flush=True)
        stream.close()

    # ---- lifecycle
    def run(self) -> int:
        handlers = self._install_signal_handlers()
        try:
            return self._run()
        finally:
            self._stop_all(signal.SIGTERM)
            for t in self.pumps:
                t.join(timeout=5.0)
            for sig, old in handlers.items():
                signal.signal(sig, old)

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum, _frame):
            self.signum = signum

        old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, on_signal)
        return old

    def _run(self) -> int:
        servers = [p for p in self.plans if p.role != "router"]
        routers = [p for p in self.plans if p.role == "router"]
        for group in (servers, routers):
            if not group:
                continue
            for plan in group:
                self._start(plan)
            status = self._wait_healthy(group)
            if status is not None:
                return status
        ready = ", ".join(f"{p.role} {p.health_url.rsplit('/health', 1)[0]}" for p in self.plans)
        self.say(f"ready: {ready} (Ctrl-C stops all)")
        while True:
            status = self._check()
            if status is not None:
                return status
            time.sleep(_POLL_S)

    def _start(self, plan: ChildPlan) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.say(f"starting {plan.role}: {shlex.join(plan.command)}")
        proc = subprocess.Popen(list(plan.command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs[plan.role] = proc
        t = threading.Thread(target=self._pump, args=(plan.role, proc.stdout), daemon=True, name=f"log-{plan.role}")
        t.start()
        self.pumps.append(t)

    def _check(self) -> Optional[int]:
        """The launch's exit status once it must end (a signal came or a child exited), else None."""
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            self.say(f"{name} received; stopping {', '.join(self._alive())}", err=True)
            self._stop_all(self.signum)
            return 128 + self.signum
        for role, proc in self.procs.items():
            rc = proc.poll()
            if rc is None:
                continue
            status = _exit_status(rc)
            others = [r for r in self._alive() if r != role]
            self.say(f"{role} exited with status {status}" + (f"; stopping {', '.join(others)}" if others else ""),
                     err=True)
            self._stop_all(signal.SIGTERM)
            return status or EXIT_LAUNCH_FAILED
        return None

    def _wait_healthy(self, group: List[ChildPlan]) -> Optional[int]:
        deadline = time.monotonic() + self.health_timeout
        waiting = list(group)
        announced = set()
        while waiting:
            status = self._check()
            if status is not None:
                return status
            waiting = [p for p in waiting if not _healthy(p.health_url)]
            for p in group:
                if p not in waiting and p.role not in announced:
                    announced.add(p.role)
                    self.say(f"{p.role} is healthy ({p.health_url})")
            if not waiting:
                return None
            if time.monotonic() >= deadline:
                names = ", ".join(f"{p.role} ({p.health_url})" for p in waiting)
                self.say(f"not healthy after {self.health_timeout:g} s: {names}; stopping all "
                         f"(raise job.health_timeout if the model needs longer to load)", err=True)
                self._stop_all(signal.SIGTERM)
                return EXIT_LAUNCH_FAILED
            time.sleep(_POLL_S)
        return None

    def _alive(self) -> List[str]:
        return [r for r, p in self.procs.items() if p.poll() is None]

    def _stop_all(self, sig: int) -> None:
        """``sig`` to every child's process group, SIGKILL to what is left after stop_timeout.

        Each child leads its own group (a server's own workers join it), so nothing it spawned is
        left behind."""
        for proc in self.procs.values():
            if proc.poll() is None:
                _signal_group(proc, sig)
        deadline = time.monotonic() + self.stop_timeout
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for role, proc in self.procs.items():
            if proc.poll() is None:
                self.say(f"{role} did not stop within {self.stop_timeout:g} s; killing it", err=True)
            _signal_group(proc, signal.SIGKILL)      # also reaches workers the child left behind
            try:
                proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                pass


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
