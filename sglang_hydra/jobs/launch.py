"""``job=launch``: start the SGLang server(s) the record or deployment describes, and keep them as one.

Each server runs as ``<job.python> -m sglang.launch_server <flags>``: the record's flags (what
``job=resolve job.format=argv`` prints) and, for a server on a CPU, what SGLang needs there
(:mod:`.engine_process`: the CPU settings left unset, the torch ``sgl_kernel``, a shipped model
directory, the engine plugin when the policy needs it).  With a router (``deploy=pd`` or
``deploy.workers>1``) the router starts once every server answers ``/health`` and is ready when
it lists them all.  Their output is streamed with a role prefix (``[prefill] ...``).
The group lives and dies together: Ctrl-C or SIGTERM is passed to every child, and when one child
exits the others are stopped and the launch exits with that child's status.

Before anything starts, the interpreters are checked for the modules they must run and every
port the deployment binds is checked to be free; either failing is a configuration error (exit 2)
that says what to change.  ``job.dry_run=true`` prints the command lines, checks that each
interpreter imports what it must run, and starts nothing.

:func:`running_deployment` is the same for other jobs (``job=validate``, ``job=calibrate`` via
the engine): a context manager that yields the running deployment's URLs and stops it on exit.
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
import tempfile
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, TextIO, Tuple

from ..config.deploy import Deployment, as_deployment, listening_ports, router_argv
from ..config.errors import ConfigError, Problem
from ..utils.ports import port_is_free
from .context import JobContext
from .engine_process import (engine_python, has_plugin, import_check, needs_plugin, router_python, server_env,
                             server_flags, write_plugin_overlay)

EXIT_LAUNCH_FAILED = 1      # a server never became healthy, or exited by itself with status 0
_POLL_S = 0.2
_HEALTH_REQUEST_TIMEOUT_S = 2.0
_ROUTER_FIX = "pip install 'sglang-hydra[router]' (sglang-router==0.3.2)"
_SERVER_FIX = "pip install sglang"


@dataclass(frozen=True)
class ChildPlan:
    role: str                 # prefill | decode | server (or server0, ...) | router
    command: Tuple[str, ...]
    health_url: str
    env: Mapping[str, str] = field(default_factory=dict, compare=False)   # set on top of this environment
    workers: Tuple[str, ...] = ()     # a router: the worker URLs it must list (in /workers) to be ready

    def environment(self) -> Dict[str, str]:
        return dict(os.environ, PYTHONUNBUFFERED="1", **self.env)


def plan_children(dep: Deployment, job: dict, *, label_servers: bool = False,
                  plugin_overlay: Optional[Path] = None) -> List[ChildPlan]:
    """The command lines, in start order: the servers, then the router (pd, or several servers).

    ``label_servers`` gives each server its name as ``--weight-version`` (each response then
    says which server answered); ``plugin_overlay`` is put on the servers' PYTHONPATH."""
    python = engine_python(job)
    module = job.get("server_module") or "sglang.launch_server"
    real = _real_engine(job)         # a stand-in server module gets the record's flags as given
    out = []
    for s in dep.servers:
        env = server_env(s.record, plugin_overlay=plugin_overlay) if real else {}
        flags = server_flags(s.record, label=s.name if label_servers else None, adapt=real)
        out.append(ChildPlan(s.name, (python, "-m", module, *flags), f"{s.url}/health", env))
    if dep.router is not None:
        out.append(ChildPlan("router", (router_python(job), "-m", job.get("router_module") or
                                        "sglang_router.launch_router", *router_argv(dep)), f"{dep.router.url}/health",
                             workers=tuple(s.url for s in dep.servers) if _real_engine(job) else ()))
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


def _real_engine(job: dict) -> bool:
    return (job.get("server_module") or "sglang.launch_server") == "sglang.launch_server"


def run(record, job: dict, ctx: JobContext) -> int:
    dep = as_deployment(record)
    bad = _timeout_problems(job)
    if bad:
        raise ConfigError(bad)
    if job.get("dry_run"):
        return _dry_run(dep, job)
    with _plugin_overlay(dep, job) as overlay:
        children = plan_children(dep, job, plugin_overlay=overlay)
        _preflight(dep, job, plugin_provided=overlay is not None)
        return _Supervisor(children, float(job.get("health_timeout", 1800.0)),
                           float(job.get("stop_timeout", 30.0))).run()


def _dry_run(dep: Deployment, job: dict) -> int:
    """Print every command line (with the environment it adds) and whether its interpreter
    imports what it must run; start nothing."""
    children = plan_children(dep, job)
    for c in children:
        print(f"# {c.role} (health: {c.health_url})")
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(c.env.items()))
        print((prefix + " " if prefix else "") + shlex.join(c.command))
    checked = {}
    for c in children:
        module = c.command[2].split(".")[0]
        key = (c.command[0], module, tuple(sorted(c.env.items())))
        if key in checked:
            continue
        checked[key] = why = import_check(c.command[0], module, c.environment())
        verdict = "ok" if why is None else f"NOT OK: {why}"
        print(f"sglang-hydra: {'' if why is None else 'warning: '}{c.command[0]} imports {module} "
              f"({c.role}): {verdict}", file=sys.stderr)
    if _real_engine(job):
        notes = _checkpoint_problems(dep) + _policy_problems(dep, job, plugin_provided=True)
        for p in notes:   # said now, not first when the real launch refuses
            print(f"sglang-hydra: note: {p.key}: {p.message}", file=sys.stderr)
        python = engine_python(job)
        if any(needs_plugin(s.record) for s in dep.servers) and not has_plugin(python):
            print(f"sglang-hydra: note: {python} does not have sglang-hydra's engine plugin; the launch puts it "
                  f"on the servers' PYTHONPATH", file=sys.stderr)
    return 0


@contextmanager
def _plugin_overlay(dep: Deployment, job: dict) -> Iterator[Optional[Path]]:
    """A temporary directory with the engine plugin when a server's policy needs it and
    ``job.python`` does not have it installed; None otherwise."""
    if not _real_engine(job) or not any(needs_plugin(s.record) for s in dep.servers) \
            or has_plugin(engine_python(job)):
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="sglang-hydra-plugin-") as tmp:
        yield write_plugin_overlay(Path(tmp))


# --------------------------------------------------------------------------- checks before starting
def _preflight(dep: Deployment, job: dict, *, plugin_provided: bool = False) -> None:
    """Every interpreter can import what it must run, and every port is free; else exit 2 with the fix."""
    problems: List[Problem] = []
    python = engine_python(job)
    server_module = job.get("server_module") or "sglang.launch_server"
    problems += _module_problems("job.python", python, server_module, _SERVER_FIX)
    if server_module == "sglang.launch_server":
        problems += _checkpoint_problems(dep)
        problems += _policy_problems(dep, job, plugin_provided=plugin_provided)
    server_python_broken = any(p.key == "job.python" and "not an executable" in p.message for p in problems)
    if dep.router is not None and (job.get("router_python") or not server_python_broken):
        # the router may live in its own environment: job.router_python is the setting to change
        problems += _module_problems("job.router_python", router_python(job),
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
    names nothing SGLang could load; say so before any server starts.  A preset shipped with a
    checkpoint directory (``tiny_llama``) is launched from that directory."""
    from ..config.presets import group_options, preset
    from .engine_process import shipped_model_dir
    geometry_only = {name for name in group_options("model")
                     if ((preset("model", name)[0] or {}).get("model") or {}).get("model_path") == name
                     and shipped_model_dir(name) is None}
    real = sorted(set(group_options("model")) - geometry_only)
    return [Problem("model.model_path", "--model-path",
                    f"{s.role}: {s.record.model_path!r} is a built-in test geometry with no checkpoint, so SGLang "
                    f"cannot load it; pass --model-path <Hugging Face id or checkpoint directory>, or select a "
                    f"model preset that names one (model={'|'.join(real)})", "launch")
            for s in dep.servers if s.record.model_path in geometry_only and not s.index]


def _policy_problems(dep: Deployment, job: dict, *, plugin_provided: bool = False) -> List[Problem]:
    """The servers' eviction policy must be one SGLang runs (ours need the engine plugin: in
    job.python, or ``plugin_provided`` by the launch on the servers' path)."""
    from ..config.engine_check import eviction_policy_problems
    python = engine_python(job)
    seen, out = set(), []
    for s in dep.servers:
        for p in eviction_policy_problems(s.record, python, plugin_provided=plugin_provided):
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


def _lists_workers(plan: ChildPlan) -> bool:
    """Whether a router lists every worker of the plan as registered (and healthy when it says).

    sglang-router 0.3.2 answers /health at once and registers its workers in the background;
    a request sent before that gets 503, so the router is ready when ``/workers`` lists them all."""
    if not plan.workers:
        return True
    import json
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(plan.health_url.rsplit("/health", 1)[0] + "/workers", timeout=_HEALTH_REQUEST_TIMEOUT_S) as r:
            listed = json.loads(r.read().decode("utf-8", "replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return False
    entries = listed.get("workers", []) if isinstance(listed, dict) else listed
    ready = set()
    for w in entries if isinstance(entries, list) else []:
        if isinstance(w, dict) and w.get("is_healthy", True) is not False:   # any field that holds its URL
            ready.update(str(v).rstrip("/") for v in w.values() if isinstance(v, str))
        elif isinstance(w, str):
            ready.add(w.rstrip("/"))
    return all(u.rstrip("/") in ready for u in plan.workers)


def _parent_death_signal() -> Optional[Callable[[], None]]:
    """A pre-exec hook that has Linux SIGKILL the child when the launching thread dies, so a
    launcher killed outright (SIGKILL, an OOM kill) leaves no server behind (SGLang's own workers
    do the same towards their launcher)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl     # resolved here, before any fork
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(1, int(signal.SIGKILL))       # PR_SET_PDEATHSIG
    return hook


class _Supervisor:
    """Starts the children in order and keeps the group together until one ends or a signal comes.

    ``out`` receives every child's output line by line with its role in front (default: stdout)."""

    def __init__(self, plans: List[ChildPlan], health_timeout: float, stop_timeout: float,
                 out: Optional[TextIO] = None, say: Optional[Callable[[str], None]] = None):
        self.plans = plans
        self.health_timeout = health_timeout
        self.stop_timeout = stop_timeout
        self.out = out
        self._say = say
        self.procs: Dict[str, subprocess.Popen] = {}
        self.pumps: List[threading.Thread] = []
        self.print_lock = threading.Lock()
        self.signum: Optional[int] = None
        self.stopped: List[int] = []       # every process id the stop had to end (children and theirs)

    # ---- output
    def say(self, text: str, *, err: bool = False) -> None:
        if self._say is not None:
            self._say(text)
        if self._say is None or self.out is not None:
            with self.print_lock:
                stream = self.out or (sys.stderr if err else sys.stdout)
                print(f"[launch] {text}", file=stream, flush=True)

    def _pump(self, role: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            with self.print_lock:
                print(f"[{role}] {line}", file=self.out or sys.stdout, flush=True)
        stream.close()

    # ---- lifecycle (the job)
    def run(self) -> int:
        handlers = self._install_signal_handlers()
        try:
            status = self.start()
            if status is not None:
                return status
            while True:
                status = self._check()
                if status is not None:
                    return status
                time.sleep(_POLL_S)
        finally:
            self.stop()
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

    # ---- lifecycle (the parts)
    def start(self) -> Optional[int]:
        """Start the servers, wait for their health, then the router; None when all are ready,
        else the launch's exit status (everything is stopped by then)."""
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
        return None

    def stop(self) -> None:
        self._stop_all(signal.SIGTERM)
        for t in self.pumps:
            t.join(timeout=5.0)

    def _start(self, plan: ChildPlan) -> None:
        self.say(f"starting {plan.role}: {shlex.join(plan.command)}")
        proc = subprocess.Popen(list(plan.command), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=plan.environment(), start_new_session=True,
                                preexec_fn=_parent_death_signal())
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
            waiting = [p for p in waiting if not (_healthy(p.health_url) and _lists_workers(p))]
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

        Each child leads its own group (a server's own workers join it); the process ids of
        every descendant are recorded before the signal, so one that left the group is killed
        too.  SGLang's launcher on a CPU does not end within seconds of SIGTERM (its workers do):
        whatever is left when the timeout ends is killed."""
        family = {}
        for proc in self.procs.values():
            if proc.poll() is None:
                family.update(_descendants(proc.pid))
                _signal_group(proc, sig)
        deadline = time.monotonic() + self.stop_timeout
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pid, started in family.items():          # workers still ending: their share of the timeout
            while _same_process(pid, started) and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        for role, proc in self.procs.items():
            if proc.poll() is None:
                self.say(f"{role} did not stop within {self.stop_timeout:g} s; killing it", err=True)
            _signal_group(proc, signal.SIGKILL)      # also reaches workers the child left behind
            try:
                proc.wait(timeout=10.0)
            except subprocess.TimeoutExpired:
                pass
        for pid, started in family.items():
            if _same_process(pid, started):
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.stopped = sorted(set(self.stopped) | set(family) | {p.pid for p in self.procs.values()})


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _start_time(pid: int) -> Optional[str]:
    """The process's start time (field 22 of /proc/PID/stat), None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    rest = stat.rsplit(")", 1)[-1].split()
    if len(rest) < 20 or rest[0] == "Z":
        return None
    return rest[19]


def _same_process(pid: int, started: Optional[str]) -> bool:
    """Whether ``pid`` still runs and is the process recorded then (not a reused id)."""
    now = _start_time(pid)
    return now is not None and now == started


def _descendants(pid: int) -> Dict[int, Optional[str]]:
    """Every living descendant of ``pid`` with its start time (Linux /proc; empty elsewhere)."""
    children: Dict[int, List[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return {}
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read().decode("utf-8", "replace")
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) > 1 and rest[1].isdigit():
            children.setdefault(int(rest[1]), []).append(int(name))
    out: Dict[int, Optional[str]] = {}
    todo = list(children.get(pid, ()))
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out[p] = _start_time(p)
        todo.extend(children.get(p, ()))
    return {p: t for p, t in out.items() if t is not None}


# --------------------------------------------------------------------------- the Python API
class LaunchFailed(RuntimeError):
    """A deployment did not come up (a server exited or never answered /health)."""


@dataclass
class RunningDeployment:
    """A deployment started by :func:`running_deployment`, while its ``with`` block runs."""

    url: str                           # where clients send requests: the router, else the one server
    worker_urls: List[str]             # every server's base URL, in deployment order
    worker_names: List[str]            # their names (server, server0..., prefill, decode...)
    router_metrics_url: Optional[str]  # the router's Prometheus endpoint, None without a router
    log_path: Optional[Path]           # every child's output, one prefixed line each
    pids: Dict[str, int]               # each child's process id, by name

    def worker_counts(self) -> Dict[str, int]:
        """The router's own count of requests it sent to each server, by server name."""
        if self.router_metrics_url is None:
            raise LaunchFailed("this deployment has no router, so nothing counts requests per worker")
        from .router_metrics import router_worker_counts
        by_url = router_worker_counts(self.router_metrics_url)
        out = {name: by_url.pop(url.rstrip("/"), 0) for url, name in zip(self.worker_urls, self.worker_names)}
        out.update(by_url)          # a worker the router knows that this deployment did not start
        return out


@contextmanager
def running_deployment(target, job: Optional[Mapping] = None, ctx: Optional[JobContext] = None, *,
                       label_servers: bool = False, say: Optional[Callable[[str], None]] = None,
                       log_path: Optional[Path] = None) -> Iterator[RunningDeployment]:
    """Start a record's server or a deployment's servers and router as ``job=launch`` does, wait
    until all answer ``/health``, yield a :class:`RunningDeployment`, and stop everything on exit
    (also on an exception, Ctrl-C or SIGTERM), leaving no process behind.

    ``job`` holds launch settings (``python``, ``router_python``, ``health_timeout``,
    ``stop_timeout``, ``server_module``, ``router_module``; missing ones take job=launch's
    defaults).  ``label_servers`` gives each server its name as ``--weight-version``, so each
    response's ``meta_info.weight_version`` names the server that answered.  Child output goes to
    ``log_path`` (default: ``launch.log`` in ``ctx``'s output directory, or a temporary file).
    A bad setting raises ConfigError (what job=launch exits 2 on); a deployment that does not come
    up raises :class:`LaunchFailed` with the end of its log."""
    job = dict(job or {})
    dep = as_deployment(target)
    bad = _timeout_problems(job)
    if bad:
        raise ConfigError(bad)
    if log_path is None and ctx is not None:
        log_path = ctx.out_dir() / "launch.log"
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="sglang-hydra-launch-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with _plugin_overlay(dep, job) as overlay, open(log_path, "a", encoding="utf-8", buffering=1) as out:
        plans = plan_children(dep, job, label_servers=label_servers, plugin_overlay=overlay)
        _preflight(dep, job, plugin_provided=overlay is not None)
        sup = _Supervisor(plans, float(job.get("health_timeout", 1800.0)), float(job.get("stop_timeout", 30.0)),
                          out=out, say=say)
        restore = _sigterm_raises()
        try:
            status = sup.start()
            if status is not None:
                raise LaunchFailed(f"the deployment did not come up (status {status}); the end of {log_path}:\n"
                                   + _tail(log_path))
            yield RunningDeployment(
                url=dep.router.url if dep.router is not None else dep.servers[0].url,
                worker_urls=[s.url for s in dep.servers], worker_names=[s.name for s in dep.servers],
                router_metrics_url=(f"http://{_metrics_host(dep.router.host)}:{dep.router.prometheus_port}/metrics"
                                    if dep.router is not None else None),
                log_path=log_path, pids={role: p.pid for role, p in sup.procs.items()})
        finally:
            try:
                sup.stop()
            finally:
                restore()


def _metrics_host(host: str) -> str:
    from ..config.deploy import connect_host
    return connect_host(host)


def _sigterm_raises() -> Callable[[], None]:
    """While a deployment runs in this process, SIGTERM ends the process through the ``with``
    block's exit (so the servers are stopped) instead of killing it outright.  Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_sigterm(signum, _frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, on_sigterm)
    return lambda: signal.signal(signal.SIGTERM, old)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
