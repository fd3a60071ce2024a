"""The port layout: every socket a deployment binds (including the ports SGLang derives from
--port), kept as written or moved up until nothing on one host is bound twice.  Kept apart because
the launch's port check (:func:`listening_ports`) needs it without composing anything."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..errors import Problem, problem_for
from ..record import ServerArgs
from .model import SIDES, _SOURCE, _WILDCARD_HOSTS, Deployment, DeploySettings, _Side

# --------------------------------------------------------------------------- ports
# SGLang 0.5.23 (server_args.PortArgs.init_new): with attention data parallelism on one node and no
# --dist-init-addr, a server binds --port + 233 for torch.distributed's rendezvous and the six ZMQ
# ports after it (+234..+239); past 65535 the block is taken below --port instead.
ZMQ_TCP_PORT_DELTA = 233
_ZMQ_PORTS = 6
_GRPC_PORT_DELTA = 10000          # legacy SMG gRPC mode without --grpc-port
_LOOPBACK = "127.0.0.1"


@dataclass
class _Claim:
    """Ports one setting makes a server bind: ``base`` and the ports SGLang derives from it.

    ``explicit`` claims keep their value (two clashing is an error); the others start at their
    default and move up until none of their ports is taken on the same host."""

    key: str                        # what to change, e.g. "decode.serving.port"
    flag: Optional[str]             # its legacy flag, e.g. "--port"
    host: str
    base: int
    explicit: bool
    derive: Any = None              # base -> [(port, what it is)]; None: just the base port
    assign: Optional[Tuple[str, str]] = None    # (role, field) that receives the laid-out value
    top_level: bool = False         # written once at top level, so both sides have it
    host_for: Any = None            # port -> the host that port is bound on (None: ``host``)

    @property
    def label(self) -> str:
        return f"{self.key} ({self.flag})" if self.flag else self.key

    def ports(self, base: Optional[int] = None) -> List[Tuple[int, str, str]]:
        """(port, host, what it is) for every port bound when the setting is ``base``."""
        base = self.base if base is None else base
        pairs = self.derive(base) if self.derive else [(base, "")]
        return [(port, (self.host_for(what) if self.host_for else self.host), what) for port, what in pairs]


def _hosts_overlap(a: str, b: str) -> bool:
    norm = {"localhost": "127.0.0.1"}
    a, b = norm.get(a, a), norm.get(b, b)
    return a == b or a in _WILDCARD_HOSTS or b in _WILDCARD_HOSTS


def _machine_loopback(host: str) -> str:
    """The host a server's internal sockets (ZMQ, NCCL rendezvous) bind on: loopback on a local
    (loopback or wildcard) server, else the server's own address, which stands for its machine."""
    host = (host or "").strip()
    if host in _WILDCARD_HOSTS or host == "localhost" or host.startswith("127."):
        return _LOOPBACK
    return host


def _label(role: Optional[str], name: str) -> str:
    """``decode.serving.port (--port)``: the key to change (with its side) and its flag."""
    key, flag = _key_flag(role, name)
    return key + (f" ({flag})" if flag else "")


def _key_flag(role: Optional[str], name: str) -> Tuple[str, Optional[str]]:
    p = problem_for(name, "")
    return (f"{role}.{p.key}" if role else p.key), p.flag


def attn_dp_ports(port: int, scale_joiner: bool = False) -> List[int]:
    """The dist-init port and the ZMQ ports SGLang derives from ``port`` under attention DP."""
    if scale_joiner:            # an elastic-EP joiner binds no rendezvous; its ZMQ block starts at +233
        base = port + ZMQ_TCP_PORT_DELTA
        if base + _ZMQ_PORTS > 65535:
            base = port - ZMQ_TCP_PORT_DELTA
        return list(range(base, base + _ZMQ_PORTS))
    dist = port + ZMQ_TCP_PORT_DELTA
    if dist > 65535:
        dist = port - ZMQ_TCP_PORT_DELTA
    base = dist - _ZMQ_PORTS - 1 if dist + _ZMQ_PORTS > 65535 else dist + 1
    return [dist] + list(range(base, base + _ZMQ_PORTS))


def _attn_dp(record: ServerArgs) -> bool:
    return record.attn_dp_size > 1 or record.ep_join_mode == "scale"


def _legacy_grpc(record: ServerArgs) -> bool:
    return bool(record.smg_grpc_mode or record.grpc_mode)


def _dist_init_port(record: ServerArgs) -> Optional[Tuple[str, int]]:
    """(host, port) of an explicit --dist-init-addr, None when unset or unreadable."""
    addr = str(record.dist_init_addr or "").strip()
    host, _, port = addr.rpartition(":")
    try:
        return host.strip("[]") or _LOOPBACK, int(port)
    except ValueError:
        return None


def _server_port_claim(role: Optional[str], record: ServerArgs, explicit: bool) -> _Claim:
    """A server's --port and every port SGLang derives from it."""
    attn_dp = _attn_dp(record) and record.nnodes == 1 and not record.dist_init_addr
    joiner = record.ep_join_mode == "scale"
    grpc_from_port = _legacy_grpc(record) and record.grpc_port is None
    sidecar_from_port = _legacy_grpc(record) and record.smg_http_sidecar_port is None

    def derive(port: int) -> List[Tuple[int, str]]:
        out = [(port, "")]
        if sidecar_from_port:
            out.append((port + 1, "the gRPC mode's HTTP sidecar port (--port + 1)"))
        if attn_dp:
            ports = attn_dp_ports(port, joiner)
            if not joiner:
                out.append((ports.pop(0), f"attention DP's dist-init port (--port + {ZMQ_TCP_PORT_DELTA})"))
            out += [(q, "one of attention DP's ZMQ ports") for q in ports]
        if grpc_from_port:
            out.append((port + _GRPC_PORT_DELTA, f"the gRPC mode's port (--port + {_GRPC_PORT_DELTA})"))
        return out

    key, flag = _key_flag(role, "port")
    return _Claim(key, flag, record.host, record.port, explicit, derive, (role or "server", "port"),
                  host_for=lambda what: _machine_loopback(record.host) if "attention DP" in what else record.host)


def _side_claims(role: Optional[str], record: ServerArgs, is_explicit) -> List[_Claim]:
    """Every listening socket of one server, in layout order (its --port first)."""
    def claim(name: str, host: Optional[str] = None, *, as_given: bool = False) -> _Claim:
        """``as_given``: a port that is bound only when written, so it is kept as written."""
        key, flag = _key_flag(role, name)
        return _Claim(key, flag, record.host if host is None else host, getattr(record, name),
                      as_given or bool(is_explicit(name)), assign=None if as_given else (role or "server", name),
                      top_level=is_explicit(name) == "top level")

    out = [_server_port_claim(role, record, bool(is_explicit("port")))]
    if record.disaggregation_mode == "prefill":
        out.append(claim("disaggregation_bootstrap_port"))
    if record.nccl_port is not None:
        out.append(claim("nccl_port", _machine_loopback(record.host), as_given=True))
    if record.grpc_port is not None:
        out.append(claim("grpc_port", as_given=True))
    if _legacy_grpc(record) and record.smg_http_sidecar_port is not None:
        out.append(claim("smg_http_sidecar_port", as_given=True))
    if record.remote_instance_weight_loader_start_seed_via_transfer_engine and record.node_rank == 0:
        out.append(claim("engine_info_bootstrap_port"))
    if record.language_only:
        out.append(claim("encoder_bootstrap_port"))
    dist = _dist_init_port(record) if _attn_dp(record) and record.dist_init_addr else None
    if dist is not None and record.node_rank == 0:
        host, port = dist
        key, flag = _key_flag(role, "dist_init_addr")
        out.append(_Claim(key, flag, host, port, True,
                          lambda p: [(p, "")] + [(q, "one of attention DP's ZMQ ports") for q in attn_dp_ports(p)[1:]],
                          top_level=is_explicit("dist_init_addr") == "top level"))
    return out


def _router_claims(settings: DeploySettings, explicit_deploy: set) -> List[_Claim]:
    return [_Claim(f"deploy.{name}", None, settings.router_host, getattr(settings, name), name in explicit_deploy,
                   assign=("router", name))
            for name in ("router_port", "router_prometheus_port")]


def _clash_message(c: _Claim, port: int, what: str, t: _Claim, t_what: str, t_host: str) -> str:
    mine = f"port {port}" + (f" ({what} of {c.flag or c.key} {c.base})" if what else "")
    theirs = t.label + (f" ({t_what} of {t.base})" if t_what else "")
    same_field = c.key.partition(".")[2] == t.key.partition(".")[2] and c.key != t.key
    if same_field and c.top_level and t.top_level and not what and not t_what:   # one value, copied to both
        field_key = c.key.partition(".")[2]
        fix = (f"a top-level {field_key} is copied to both sides: set prefill.{field_key} and "
               f"decode.{field_key} to different {'host:port addresses' if field_key.endswith('addr') else 'ports'}")
    else:
        fix = "change one of them, or leave one unset to have it assigned"
    return (f"{mine} is also {theirs} on {t_host}; every server, the bootstrap server, the router and the "
            f"ports SGLang derives from them need their own port ({fix})")


def _first_clash(c: _Claim, base: int, taken: List[_Claim]):
    for port, host, what in c.ports(base):
        if not 0 < port < 65536:
            return port, what, None, "", host
        for t in taken:
            for t_port, t_host, t_what in t.ports():
                if t_port == port and _hosts_overlap(t_host, host):
                    return port, what, t, t_what, t_host
    return None


# settings every server of a role has its own value of: a written one is the first server's, the
# others are laid out after it
_PER_SERVER = ("port", "disaggregation_bootstrap_port")


def _lay_out_ports(workers: List[Tuple[str, str, ServerArgs, int]], sides: Dict[str, _Side], settings: DeploySettings,
                   explicit_deploy: set, problems: List[Problem]) -> Tuple[Dict[str, Dict[str, int]], Tuple[int, int]]:
    """Give every listening socket of the deployment its own port.

    ``workers`` is (name, role, record, index among its role) for every server, in start order.
    Ports the user wrote are kept (two of them clashing is an error naming both); the others
    start from their defaults and move up past anything taken on the same host, together with
    the ports SGLang derives from them (attention DP's block at --port + 233, the gRPC mode's
    ports).  A top-level ``serving.port`` is the first server's port; each later server's
    ``--port`` starts right after the one before it and takes the first port whose whole block
    is free.  A written port or bootstrap port is the first server of its role's; the other
    servers of that role get the next free ones."""

    def explicit_for(role: str, index: int):
        def is_explicit(name: str) -> Optional[str]:
            """Where ``name`` was written for this server: "side", "top level" or None (not written)."""
            if index > 0 and name in _PER_SERVER:
                return None
            if role in SIDES and name in sides[role].side_names:
                return "side"
            if role == "decode" and name == "port":      # a shared --port is prefill's
                return None
            return "top level" if name in sides[role].shared_names else None
        return is_explicit

    claims: List[_Claim] = []
    for name, role, record, index in workers:
        for c in _side_claims(role if role in SIDES else None, record, explicit_for(role, index)):
            if c.assign:
                c.assign = (name, c.assign[1])
            claims.append(c)
    claims += _router_claims(settings, explicit_deploy)
    taken: List[_Claim] = []
    for c in claims:
        if not c.explicit:
            continue
        clash = _first_clash(c, c.base, taken)
        if clash and clash[2] is None:
            problems.append(Problem(c.key, c.flag, f"{c.base} puts {clash[1] or 'a port'} at {clash[0]}, which is "
                                    f"not a TCP port (1-65535)", _SOURCE))
        elif clash:
            port, what, t, t_what, t_host = clash
            problems.append(Problem(c.key, c.flag, _clash_message(c, port, what, t, t_what, t_host), _SOURCE))
        taken.append(c)
    assigned: Dict[str, Dict[str, int]] = {name: {} for name, *_ in workers}
    assigned["router"] = {}
    last_server_port: Optional[int] = None
    for c in claims:
        is_server_port = c.assign is not None and c.assign[1] == "port"
        if c.explicit:
            if is_server_port:
                last_server_port = c.base
            continue
        base = c.base
        if is_server_port and last_server_port is not None:    # right after the server before it
            base = last_server_port + 1
        while _first_clash(c, base, taken) and base < 65535:
            base += 1
        c.base = base
        taken.append(c)
        name, field_name = c.assign
        assigned[name][field_name] = base
        if is_server_port:
            last_server_port = base
    for c in claims:
        if c.explicit and c.assign and c.assign[0] != "router":
            assigned[c.assign[0]].setdefault(c.assign[1], c.base)
    router = assigned.pop("router")
    return assigned, (router.get("router_port", settings.router_port),
                      router.get("router_prometheus_port", settings.router_prometheus_port))


def listening_ports(dep: Deployment) -> List[Tuple[str, str, int]]:
    """(what to change, host, port) for every socket the deployment binds, for the launch's port check."""
    out = []
    for s in dep.servers:
        role = s.role if s.role in SIDES else None
        for c in _side_claims(role, s.record, lambda name: True):
            for port, host, what in c.ports():
                if s.index is not None:        # one of several servers of its role: say which
                    what = f"{s.name}'s" + (f" {what}" if what else " port")
                out.append((c.label + (f" [{what}]" if what else ""), host, port))
    if dep.router:
        out.append(("deploy.router_port", dep.router.host, dep.router.port))
        out.append(("deploy.router_prometheus_port", dep.router.host, dep.router.prometheus_port))
    return out
