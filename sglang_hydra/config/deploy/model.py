"""The deployment data model: what a deployment is (its servers, its router, its deploy keys) and
the router's command line.  Everything else in the package builds or checks these, so this module
depends on nothing else in it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..legacy import Setting
from ..record import ServerArgs

SIDES = ("prefill", "decode")
DEFAULT_DEPLOY = "single"
DEPLOYMENT_JOBS = ("resolve", "launch", "validate")   # jobs that take a whole deployment
PLANNING_JOBS = ("deploy_search",)            # jobs that read the deploy keys of a single record
SIMULATING_JOBS = ("replay",)                 # jobs that simulate a whole PD deployment (both records)
SIDE_PLANNING_JOBS = ("plan",)                # jobs that size each side of a PD deployment (both records)
_SOURCE = "deploy=pd"
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass
class DeploySettings:
    """The deployment-level keys (``deploy.<key>=...``); the router ones only mean something for pd."""

    name: str = DEFAULT_DEPLOY
    router_host: str = "127.0.0.1"
    router_port: int = 8000
    router_prometheus_port: int = 29000
    router_policy: Optional[str] = None          # None: the router's own default
    router_extra_args: List[str] = field(default_factory=list)   # passed to the router verbatim
    workers: int = 1                  # single: N aggregated servers behind the router's regular mode
    prefill_workers: int = 1          # pd: prefill servers (xPyD's x)
    decode_workers: int = 1           # pd: decode servers (xPyD's y)
    total_gpus: Optional[int] = None  # a GPU budget the servers must fit in (unset: one node)

    @property
    def has_router(self) -> bool:
        """pd always has a router; single gets one (regular mode) when it has several workers."""
        return self.name == "pd" or self.workers > 1


# sglang-router 0.3.2's --policy choices (`python -m sglang_router.launch_router --help`)
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
# deploy keys that count servers, with what they count
_WORKER_OPTION = {"workers": "single", "prefill_workers": "pd", "decode_workers": "pd"}
WORKER_KEYS = tuple(_WORKER_OPTION)


def deploy_settings_problems(settings: "DeploySettings", explicit: Sequence[str] = ()) -> List[Tuple[str, str]]:
    """(key, message) for every deploy key whose value does not fit the others (pure: the simulation
    and the search check settings they build themselves with it, without composing anything)."""
    out: List[Tuple[str, str]] = []
    for key in ("workers", "prefill_workers", "decode_workers", "total_gpus"):
        v = getattr(settings, key)
        if v is not None and (type(v) is not int or v < 1):
            out.append((f"deploy.{key}", f"{v!r} is not a positive whole number"))
    if settings.router_policy is not None and settings.router_policy not in ROUTER_POLICIES:
        out.append(("deploy.router_policy", f"{settings.router_policy!r} is not a policy sglang-router 0.3.2 offers "
                    f"(one of: {', '.join(ROUTER_POLICIES)})"))
    for key, option in _WORKER_OPTION.items():
        if key in explicit and settings.name != option and getattr(settings, key) != 1:
            own = {"single": "deploy.workers", "pd": "deploy.prefill_workers and deploy.decode_workers"}
            hint = own.get(settings.name, f"select deploy={option}")
            out.append((f"deploy.{key}", f"counts the servers of deploy={option}, but this is deploy={settings.name} "
                        f"(its servers are counted by {hint}; or select deploy={option})"))
    return out
# router flags the deployment writes itself (router_argv); in router_extra_args they would fight it
_ROUTER_MANAGED = {
    "--pd-disaggregation": "deploy=pd", "--prefill": "the prefill server's URL and bootstrap port",
    "--worker-urls": "deploy.workers",
    "--decode": "the decode server's URL", "--host": "deploy.router_host", "--port": "deploy.router_port",
    "--prometheus-host": "deploy.router_host", "--prometheus-port": "deploy.router_prometheus_port",
    "--policy": "deploy.router_policy",
}


def _managed_router_flags(args: Sequence[Any]) -> List[str]:
    """``router_extra_args`` entries that are flags the deployment sets itself, with what sets them."""
    out = []
    for a in args:
        flag = str(a).partition("=")[0]
        if flag in _ROUTER_MANAGED:
            out.append(f"{flag} (set by {_ROUTER_MANAGED[flag]})")
    return out


@dataclass(frozen=True)
class Router:
    host: str
    port: int
    prometheus_port: int
    policy: Optional[str]
    extra_args: Tuple[str, ...]

    @property
    def url(self) -> str:
        return f"http://{connect_host(self.host)}:{self.port}"


@dataclass(frozen=True)
class Server:
    role: str              # "server" (single), "prefill" or "decode"
    record: ServerArgs
    index: Optional[int] = None   # which of several servers of its role (None: the only one)

    @property
    def name(self) -> str:
        """``prefill`` when it is the only one, ``prefill0``, ``prefill1``... when there are several."""
        return self.role if self.index is None else f"{self.role}{self.index}"

    @property
    def url(self) -> str:
        return f"http://{connect_host(self.record.host)}:{self.record.port}"


@dataclass(frozen=True)
class Deployment:
    """What ``job=resolve`` prints and ``job=launch`` starts."""

    name: str                          # single | pd
    servers: Tuple[Server, ...]
    router: Optional[Router] = None
    settings: Optional[DeploySettings] = None    # the deploy keys it was composed from
    hardware: Any = None                         # config.hardware.Hardware it was composed with

    def server(self, role: str) -> Server:
        """The (first) server of a role, or the one of that name (``prefill1``)."""
        return next(s for s in self.servers if s.role == role or s.name == role)

    def of_role(self, role: str) -> List[Server]:
        return [s for s in self.servers if s.role == role]


def connect_host(host: Optional[str]) -> str:
    """Where a local client reaches a server bound to ``host`` (a wildcard bind answers on loopback)."""
    host = (host or "").strip()
    if host in _WILDCARD_HOSTS:
        return "127.0.0.1"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def as_deployment(target: Any) -> Deployment:
    """A deployment from either a deployment or a single record (``job=launch`` without deploy=)."""
    if isinstance(target, Deployment):
        return target
    mode = getattr(target, "disaggregation_mode", "null")
    return Deployment("single", (Server(mode if mode in SIDES else "server", target),))


def router_argv(dep: Deployment) -> List[str]:
    """``sglang_router.launch_router`` flags: PD mode for pd, regular mode for several aggregated servers
    (checked against sglang-router 0.3.2)."""
    r = dep.router
    if r is None:
        return []
    if dep.name == "pd":        # every prefill URL with its bootstrap port, then every decode URL
        out = ["--pd-disaggregation"]
        for s in dep.of_role("prefill"):
            out += ["--prefill", s.url, str(s.record.disaggregation_bootstrap_port)]
        for s in dep.of_role("decode"):
            out += ["--decode", s.url]
    else:                       # regular mode: the aggregated servers
        out = ["--worker-urls", *(s.url for s in dep.servers)]
    out += ["--host", r.host, "--port", str(r.port),
            "--prometheus-host", r.host, "--prometheus-port", str(r.prometheus_port)]
    if r.policy:
        out += ["--policy", r.policy]
    return out + list(r.extra_args)


@dataclass
class _Side:
    """One side's command: what is shared and what only this side says."""

    role: str
    cmd: Any                       # compose.Command, merged in precedence order
    side_settings: List[Setting]   # what only this side says
    shared_settings: List[Setting] # what the top level says
    hydra_flags: List[str]
    side_choices: Dict[str, str] = field(default_factory=dict)     # presets only this side selects
    shared_choices: Dict[str, str] = field(default_factory=dict)   # presets the top level selects

    @property
    def side_names(self) -> set:
        return {s.name for s in self.side_settings}

    @property
    def shared_names(self) -> set:
        return {s.name for s in self.shared_settings}
