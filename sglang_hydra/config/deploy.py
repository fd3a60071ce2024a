"""Deployments: one server (``deploy=single``) or a prefill/decode pair behind a router (``deploy=pd``).

A PD deployment is two full records composed from one command line.  Everything written at top
level (``model=llama3_8b``, ``--page-size 16``, a ``--config`` file's namespaces) applies to both
sides; ``prefill.<ns>.<field>=...`` / ``decode.<ns>.<field>=...`` (or a ``prefill:`` / ``decode:``
section of the ``--config`` file) override one side, and always beat the shared value.  Each side
is composed exactly like a single record (the same presets, legacy flags, checks and rules), with
its ``disaggregation_mode`` set to its role.  Then the ports are laid out so that nothing on one
host is bound twice, and the two sides are checked to agree on what the KV transfer needs.

Deployment-level settings (``deploy.router_port=...``) live in ``conf/deploy/<option>.yaml``.
This module is pure configuration: it builds and checks, the ``launch`` job runs.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields as dc_fields
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import ConfigError, Problem, did_you_mean, problem_for
from .legacy import Setting
from .record import ServerArgs

SIDES = ("prefill", "decode")
DEFAULT_DEPLOY = "single"
DEPLOYMENT_JOBS = ("resolve", "launch")       # jobs that take a whole deployment
_SOURCE = "deploy=pd"
# deploy=..., deploy.x=..., prefill.x=..., decode.x=... (with Hydra's +/++ prefixes)
_TOKEN = re.compile(r"^(?P<plus>\+{0,2})(?P<head>deploy|prefill|decode)(?P<sep>[.=])(?P<rest>.*)$", re.S)
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")
_HELP_FLAGS = ("--help", "-h", "--hydra-help")


@dataclass
class DeploySettings:
    """The deployment-level keys (``deploy.<key>=...``); the router ones only mean something for pd."""

    name: str = DEFAULT_DEPLOY
    router_host: str = "127.0.0.1"
    router_port: int = 8000
    router_prometheus_port: int = 29000
    router_policy: Optional[str] = None          # None: the router's own default
    router_extra_args: List[str] = field(default_factory=list)   # passed to the router verbatim


ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
# router flags the deployment writes itself (router_argv); in router_extra_args they would fight it
_ROUTER_MANAGED = {
    "--pd-disaggregation": "deploy=pd", "--prefill": "the prefill server's URL and bootstrap port",
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

    @property
    def url(self) -> str:
        return f"http://{connect_host(self.record.host)}:{self.record.port}"


@dataclass(frozen=True)
class Deployment:
    """What ``job=resolve`` prints and ``job=launch`` starts."""

    name: str                          # single | pd
    servers: Tuple[Server, ...]
    router: Optional[Router] = None

    def server(self, role: str) -> Server:
        return next(s for s in self.servers if s.role == role)


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
    """``sglang_router.launch_router`` flags for a PD deployment (checked against sglang-router 0.3.2)."""
    r = dep.router
    if r is None:
        return []
    prefill, decode = dep.server("prefill"), dep.server("decode")
    out = ["--pd-disaggregation",
           "--prefill", prefill.url, str(prefill.record.disaggregation_bootstrap_port),
           "--decode", decode.url,
           "--host", r.host, "--port", str(r.port),
           "--prometheus-host", r.host, "--prometheus-port", str(r.prometheus_port)]
    if r.policy:
        out += ["--policy", r.policy]
    return out + list(r.extra_args)


# --------------------------------------------------------------------------- the command line
@dataclass
class DeployRequest:
    """A command line split into its shared part, each side's part and the deployment keys."""

    option: Optional[str] = None                          # deploy=<option>
    deploy_settings: List[Tuple[str, Any, str]] = field(default_factory=list)   # (key, value, source)
    shared_argv: List[str] = field(default_factory=list)
    side_argv: Dict[str, List[str]] = field(default_factory=lambda: {s: [] for s in SIDES})
    config_file: Optional[str] = None
    file_shared: Dict[str, Any] = field(default_factory=dict)
    file_sides: Dict[str, Any] = field(default_factory=dict)
    file_sections_read: bool = False           # the file was read here (it has deploy/prefill/decode)
    problems: List[Problem] = field(default_factory=list)

    @property
    def wants_sides(self) -> bool:
        return any(self.side_argv.values()) or bool(self.file_sides)

    def is_plain_single(self) -> bool:
        """Only ``deploy=single`` was written: the ordinary single-record path can run it."""
        return (self.option == "single" and not self.wants_sides and not self.deploy_settings
                and not self.problems and not self.config_file)


def deployment_request(argv: Sequence[str]) -> Optional[DeployRequest]:
    """The deployment part of a command line, or None for an ordinary single-record command.

    A command is a deployment when it names ``deploy=``/``deploy.*``, a ``prefill.*``/``decode.*``
    key, or a ``--config`` file with a ``deploy``/``prefill``/``decode`` section."""
    req = DeployRequest()
    found = False
    argv = list(argv)
    free = _free_tokens(argv)
    i = 0
    while i < len(argv):
        pos, tok = i, argv[i]
        i += 1
        if tok == "--config" or tok.startswith("--config="):
            path = tok.partition("=")[2] if "=" in tok else (argv[i] if i < len(argv) else None)
            if "=" not in tok:
                i += 1
            req.config_file = path
            req.shared_argv += [tok] if "=" in tok else [tok] + ([path] if path is not None else [])
            continue
        m = _TOKEN.match(tok) if pos in free else None
        if not m:
            req.shared_argv.append(tok)
            continue
        found = True
        head, sep, rest, plus = m["head"], m["sep"], m["rest"], m["plus"]
        if head == "deploy":
            _deploy_token(req, sep, rest, tok)
        elif sep == "=":
            req.problems.append(Problem(head, None, f"'{head}' is one side of a PD deployment, not a value; "
                                        f"set its keys ({head}.<namespace>.<field>=...)", f"override {tok}"))
        else:
            req.side_argv[head].append(plus + rest)
    if found and any(tok in _HELP_FLAGS for tok in req.shared_argv):
        # --help always answers: the ordinary help, with the deployment keys set aside
        return DeployRequest(option="single", shared_argv=req.shared_argv)
    if req.config_file and _load_file_sections(req):
        found = True
    return req if found else None


def _free_tokens(argv: Sequence[str]) -> set:
    """Positions of the tokens that stand for themselves: not a legacy flag's value (so
    ``--chat-template decode.jinja`` or ``--served-model-name deploy=x`` are values, not keys)."""
    if not any(_TOKEN.match(tok) for tok in argv):
        return set()
    from .legacy import split_argv
    return {pos for pos, _text in split_argv(argv).overrides}


def _deploy_token(req: DeployRequest, sep: str, rest: str, tok: str) -> None:
    before = len(req.problems)
    value, sweep = _parse_value(rest, tok, req)
    if len(req.problems) > before:         # unparsable: said once, not again as a missing value
        return
    if sweep:
        key = "deploy" if sep == "=" else f"deploy.{rest.partition('=')[0]}"
        req.problems.append(Problem(key, None, f"{tok!r} sweeps over the deployment, which is not supported; "
                                    f"run one deployment per command", f"override {tok}"))
        return
    if sep == "=":
        req.option = str(value)
    else:
        req.deploy_settings.append((rest.partition("=")[0], value, f"override {tok}"))


def _parse_value(rest: str, tok: str, req: DeployRequest) -> Tuple[Any, bool]:
    """(the value of a ``key=value`` token typed by Hydra's override grammar, whether it is a sweep)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    text = rest if "=" in rest else f"x={rest}"
    try:
        (ov,) = OverridesParser.create().parse_overrides([text])
        return ov.value(), ov.is_sweep_override()
    except HydraException as exc:
        req.problems.append(Problem(tok.split("=")[0], None, f"cannot parse override {tok!r}: "
                                    f"{str(exc).strip().splitlines()[0]}", "override"))
        return None, False


def _load_file_sections(req: DeployRequest) -> bool:
    """Take ``deploy``/``prefill``/``decode`` out of the --config file; True when it had any."""
    from .presets import yaml_load

    p = Path(req.config_file)
    if p.suffix.lower() not in (".yaml", ".yml") or not p.is_file():
        return False          # the ordinary --config loader reports these
    try:
        data = yaml_load(p)
    except Exception:          # invalid YAML: reported by the ordinary loader too
        return False
    if not isinstance(data, dict) or not ({"deploy", *SIDES} & set(map(str, data))):
        return False
    source = f"--config {req.config_file}"
    req.file_sections_read = True
    from_file: List[Tuple[str, Any, str]] = []
    for k, v in data.items():
        k = str(k)
        if k in SIDES:
            if not isinstance(v, dict):
                req.problems.append(Problem(k, "--config", f"{source}: section '{k}' must map namespaces to "
                                            f"settings, got {type(v).__name__}"))
            else:
                req.file_sides[k] = v
        elif k == "deploy":
            if isinstance(v, str):
                req.option = req.option or v      # the command line beats the file
            elif isinstance(v, dict):
                for dk, dv in v.items():
                    if str(dk) == "name":
                        req.option = req.option or str(dv)
                    else:
                        from_file.append((str(dk), dv, source))
            else:
                req.problems.append(Problem("deploy", "--config", f"{source}: 'deploy' must be an option name "
                                            f"(single, pd) or a mapping of deploy keys"))
        else:
            req.file_shared[k] = v
    req.deploy_settings[:0] = from_file          # the file's deploy keys, then the command line's
    return True


# --------------------------------------------------------------------------- composition
def deploy_options() -> List[str]:
    from .presets import group_options
    return group_options("deploy")


def _deploy_settings(req: DeployRequest, problems: List[Problem]) -> Tuple[DeploySettings, set]:
    from .compose import _coerce_job
    from .presets import no_such_option, preset

    option = req.option or (DEFAULT_DEPLOY if not req.wants_sides else "pd")
    out = DeploySettings()
    types = {f.name: f.type for f in dc_fields(DeploySettings)}
    data, _ = preset("deploy", option)
    if data is None:
        problems.append(Problem("deploy", None, no_such_option("deploy", option, deploy_options()), "preset"))
        return out, set()
    explicit = set()
    entries = [(k, v, f"preset deploy/{option}", False) for k, v in (data.get("deploy") or {}).items() if k != "name"]
    entries += [(k, v, src, True) for k, v, src in req.deploy_settings]
    for k, v, src, by_user in entries:
        if k not in types or k == "name":
            problems.append(Problem(f"deploy.{k}", None, f"deploy has no setting '{k}'"
                                    f"{did_you_mean(k, [n for n in types if n != 'name'])}", src))
            continue
        v, err = _coerce_job(types[k], v)
        if err is None and k == "router_policy" and v is not None and v not in ROUTER_POLICIES:
            err = f"{v!r} is not one of: {', '.join(ROUTER_POLICIES)}"
        if err is None and k in ("router_port", "router_prometheus_port") and not 0 < v < 65536:
            err = f"{v} is not a TCP port (1-65535)"
        if err is None and k == "router_extra_args" and _managed_router_flags(v):
            err = (f"{', '.join(_managed_router_flags(v))}: the deployment sets these router flags itself (and "
                   f"waits for the router where it put it); change them through the deploy keys named, and "
                   f"keep router_extra_args for other sglang_router flags")
        if err:
            problems.append(Problem(f"deploy.{k}", None, err, src))
            continue
        setattr(out, k, v)
        if by_user:
            explicit.add(k)
    out.name = option
    if option != "pd":
        for k in sorted(explicit):
            if k.startswith("router"):
                problems.append(Problem(f"deploy.{k}", None, f"the router only runs with deploy=pd "
                                        f"(this is deploy={option})", "deploy"))
        if req.wants_sides:
            problems.append(Problem("deploy", None, f"prefill./decode. settings need deploy=pd "
                                    f"(this is deploy={option})", "deploy"))
    return out, explicit


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


def _side_command(req: DeployRequest, role: Optional[str]) -> _Side:
    from .compose import Command, build_command, load_config_file, parse_overrides, settings_from_mapping

    shared, hydra_flags = build_command(argv=_without_config(req.shared_argv))
    file_shared, file_side, cli_side = Command(), Command(), Command()
    src = f"--config {req.config_file}"
    if req.file_sections_read:
        settings_from_mapping(req.file_shared, src, file_shared, choices_ok=True)
    elif req.config_file is not None:
        load_config_file(req.config_file, file_shared)
    if role in SIDES:
        if role in req.file_sides:
            settings_from_mapping(req.file_sides[role], f"{src} ({role}:)", file_side, choices_ok=True)
        parse_overrides(req.side_argv[role], cli_side, allow_sweep=False)
    cmd = Command()
    cmd.problems = shared.problems + file_shared.problems + file_side.problems + cli_side.problems
    cmd.choices = {**file_shared.choices, **file_side.choices, **shared.choices, **cli_side.choices}
    cmd.settings = file_shared.settings + file_side.settings + shared.settings + cli_side.settings
    cmd.job_settings = file_shared.job_settings + shared.job_settings
    cmd.hydra_overrides = shared.hydra_overrides + cli_side.hydra_overrides
    cmd.hydra_only = shared.hydra_only + cli_side.hydra_only
    cmd.sweep = shared.sweep or cli_side.sweep
    for k, _v, s in file_side.job_settings + cli_side.job_settings:
        cmd.problems.append(Problem(f"{role}.job.{k}", None, f"job settings apply to the whole deployment; "
                                    f"set job.{k}=... at top level", s))
    if "job" in file_side.choices or "job" in cli_side.choices:
        cmd.problems.append(Problem(f"{role}.job", None, "the job applies to the whole deployment; set job=... "
                                    "at top level", "deploy"))
    return _Side(role or "server", cmd, file_side.settings + cli_side.settings,
                 file_shared.settings + shared.settings, hydra_flags,
                 {**file_side.choices, **cli_side.choices}, {**file_shared.choices, **shared.choices})


def _without_config(argv: Sequence[str]) -> List[str]:
    """The command line without its --config file (the file is read separately, sections and all)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--config":
            skip = True
        elif not a.startswith("--config="):
            out.append(a)
    return out


def _compose(side: _Side, extra: Sequence[Setting], env=None, *, quiet: bool = False
             ) -> Tuple[Optional[ServerArgs], Any, List[Problem]]:
    """One side's record (or its problems); ``quiet`` keeps a first pass from logging the notes twice."""
    import logging

    from .compose import resolve_command

    cmd = side.cmd
    saved = list(cmd.settings)
    cmd.settings = saved + list(extra)
    logger = logging.getLogger("sglang_hydra.config")
    was_disabled = logger.disabled
    logger.disabled = was_disabled or quiet
    label = _RoleLabel(side.role)       # both sides log the same kinds of notes: say whose
    logger.addFilter(label)
    try:
        record, composed = resolve_command(cmd, env=env)
        return record, composed, []
    except ConfigError as err:
        return None, None, list(err.problems)
    finally:
        cmd.settings = saved
        logger.disabled = was_disabled
        logger.removeFilter(label)


class _Once:
    """A logging filter that lets each distinct message through once."""

    def __init__(self) -> None:
        self.seen: set = set()

    def filter(self, record) -> bool:
        text = record.getMessage()
        if text in self.seen:
            return False
        self.seen.add(text)
        return True


class _RoleLabel:
    """A logging filter that puts the side's role in front of each note it resolves."""

    def __init__(self, role: str) -> None:
        self.role = role

    def filter(self, record) -> bool:
        record.msg = f"{self.role}: {record.msg}"
        return True


def _merge_side_problems(per_side: Dict[str, List[Problem]], side_argv: Dict[str, List[str]]) -> List[Problem]:
    """A problem both sides have is the shared input's: say it once; otherwise name the side (and
    quote a side's own override as it was written)."""
    keyed = {role: [(p.key, p.message) for p in probs] for role, probs in per_side.items()}
    roles = list(per_side)
    out: List[Problem] = []
    seen = set()
    for role in roles:
        for p in per_side[role]:
            k = (p.key, p.message)
            shared = all(k in keyed[r] for r in roles)
            if shared:
                if k not in seen:
                    seen.add(k)
                    out.append(p)
                continue
            key = p.key if p.key.startswith(f"{role}.") else (f"{role}.{p.key}" if p.key else role)
            message = p.message
            if key != p.key and p.key:     # a suggestion for a side's key is a side key too
                message = re.sub(r"did you mean '(?!" + role + r"\.)([a-z_]+\.[\w.]+)'", rf"did you mean '{role}.\1'",
                                 message)
            source = p.source
            for tok in side_argv.get(role, ()):
                if source in (f"override {tok}", "override") and p.key.lstrip("+") and tok.lstrip("+").startswith(p.key):
                    source = f"override {role}.{tok}"
            out.append(Problem(key, p.flag, message, source))
    return out


def compose_deployment(req: DeployRequest, *, env=None) -> Tuple[Any, str, Dict[str, Any]]:
    """(record or Deployment, job name, job settings) for a deployment command.

    ``deploy=single`` gives the one record (any job runs on it); ``deploy=pd`` gives a
    :class:`Deployment` (``job=resolve`` or ``job=launch``; resolve when no job is named).
    Raises one ConfigError listing every problem of both sides."""
    problems = list(req.problems)
    settings, explicit_deploy = _deploy_settings(req, problems)
    roles = SIDES if settings.name == "pd" else (None,)
    import logging
    once = _Once()              # both sides parse the shared flags: their notes (deprecations) once
    logging.getLogger("sglang_hydra.config").addFilter(once)
    try:
        sides = [_side_command(req, role) for role in roles]
    finally:
        logging.getLogger("sglang_hydra.config").removeFilter(once)
    first = sides[0]
    if first.hydra_flags or first.cmd.sweep or first.cmd.hydra_only:
        what = (first.hydra_flags or first.cmd.hydra_only or ["a sweep"])[0]
        problems.append(Problem("deploy", None, f"{what}: a deployment runs without Hydra's runtime (no -m sweeps, "
                                "Hydra flags or hydra.* settings); run one record at a time for those", "deploy"))
    if settings.name != "pd":
        record, composed, probs = _compose(first, (), env)
        if problems or probs:
            raise ConfigError(problems + probs)
        return record, composed.job_name, composed.job

    for s in sides:
        s.cmd.choices.setdefault("job", "resolve")
    # pass 1: each side with its role, to learn its addresses
    problems += [problem_for("disaggregation_mode", f"deploy=pd sets each side's mode itself (prefill, decode); "
                             f"drop {st.value!r}", st.source)
                 for st in first.shared_settings
                 if st.name == "disaggregation_mode" and st.value not in (None, "null")]
    shared_mode = _preset_mode(first.shared_choices.get("disagg"))
    if shared_mode:
        problems.append(Problem("disagg", None, f"disagg={first.shared_choices['disagg']} sets disaggregation_mode="
                                f"{shared_mode}, but deploy=pd sets each side's mode itself (prefill, decode); "
                                f"drop the disagg selection", "deploy"))
    per_side = {}
    for s in sides:
        per_side[s.role] = [problem_for("disaggregation_mode", f"is {s.role} on this side (set by deploy=pd); "
                                        f"drop {st.value!r}", st.source)
                            for st in s.side_settings
                            if st.name == "disaggregation_mode" and str(st.value) != s.role]
        side_mode = _preset_mode(s.side_choices.get("disagg"))
        if side_mode and side_mode != s.role:
            per_side[s.role].append(Problem(f"{s.role}.disagg", None, f"disagg={s.side_choices['disagg']} sets "
                                            f"disaggregation_mode={side_mode}, but this side is {s.role} (set by "
                                            f"deploy=pd); drop the selection", "deploy"))
    first_pass = {s.role: _compose(s, [Setting("disaggregation_mode", s.role, _SOURCE)], env, quiet=True)
                  for s in sides}
    for s in sides:
        per_side[s.role] += first_pass[s.role][2]
    problems += _merge_side_problems(per_side, req.side_argv)
    # every check that can run on what composed goes on, so one run reports all it can
    job_name = str(first.cmd.choices.get("job"))
    from .presets import group_options
    if job_name not in DEPLOYMENT_JOBS and job_name in group_options("job"):
        problems.append(Problem("job", None, f"job={job_name} works on one record, not a deployment; deploy=pd "
                                f"supports job={' and job='.join(DEPLOYMENT_JOBS)}", "deploy"))
    records = {role: rec for role, (rec, _c, _p) in first_pass.items()}
    by_role = {s.role: s for s in sides}
    if all(records.values()):
        assigned, router_ports = _lay_out_ports(records, by_role, settings, explicit_deploy, problems)
        assigned["decode"].update(_lay_out_gpus(records, by_role, problems))
        problems += cross_side_problems(records["prefill"], records["decode"])
    else:       # a side failed: check the rest on a stand-in without the settings that failed
        stand_in, dropped = {}, set()
        for s in sides:
            stand_in[s.role], gone = (records[s.role], set()) if records[s.role] else _stand_in(s, first_pass[s.role][2], env)
            dropped |= {f"{s.role}.{name}" for name in gone}
        if all(stand_in.values()):
            port_problems: List[Problem] = []
            _lay_out_ports(stand_in, by_role, settings, explicit_deploy, port_problems)
            problems += [p for p in port_problems if not _mentions(p, dropped)]
            problems += [p for p in cross_side_problems(stand_in["prefill"], stand_in["decode"])
                         if not any(d.endswith("." + _field_of(p.key)) for d in dropped)]
    if problems:
        raise ConfigError(_dedupe(problems))

    # pass 2: the same commands with the ports laid out
    final: Dict[str, ServerArgs] = {}
    composed_job = None
    for s in sides:
        extra = [Setting("disaggregation_mode", s.role, _SOURCE)]
        extra += [Setting(name, value, f"{_SOURCE} (assigned)") for name, value in assigned[s.role].items()]
        rec, composed, probs = _compose(s, extra, env)
        problems += [Problem(f"{s.role}.{p.key}", p.flag, p.message, p.source) for p in probs]
        if rec is not None:
            final[s.role] = rec
            composed_job = composed_job or composed
    if not problems:
        problems += cross_side_problems(final["prefill"], final["decode"])
    if problems:
        raise ConfigError(problems)
    router = Router(settings.router_host, router_ports[0], router_ports[1], settings.router_policy,
                    tuple(settings.router_extra_args))
    dep = Deployment("pd", (Server("prefill", final["prefill"]), Server("decode", final["decode"])), router)
    return dep, composed_job.job_name, composed_job.job


def _field_of(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _mentions(problem: Problem, dropped: set) -> bool:
    """Whether a stand-in's problem involves a setting that was dropped to build it."""
    text = f"{problem.key} {problem.message}"
    return any(re.search(rf"\b{re.escape(d.split('.')[0])}\.[\w.]*\b{re.escape(_field_of(d))}\b", text)
               for d in dropped)


def _stand_in(side: _Side, failed: List[Problem], env) -> Tuple[Optional[ServerArgs], set]:
    """(record, dropped field names): the side composed without the settings its problems name, so
    the cross-side and port checks can still run in the same pass; None when that fails too."""
    from .record import FIELDS
    names = {_field_of(p.key) for p in failed} & set(FIELDS)
    if not names:
        return None, set()
    saved = side.cmd.settings
    side.cmd.settings = [st for st in saved if st.name not in names]
    try:
        record, _composed, probs = _compose(side, [Setting("disaggregation_mode", side.role, _SOURCE)], env,
                                            quiet=True)
    finally:
        side.cmd.settings = saved
    return (record if not probs else None), names


def _preset_mode(option: Optional[str]) -> Optional[str]:
    """The disaggregation mode a ``disagg`` preset selects (None for none, or no such preset)."""
    if not option:
        return None
    from .presets import preset
    data, _ = preset("disagg", str(option))
    mode = ((data or {}).get("disagg") or {}).get("disaggregation_mode")
    return None if mode in (None, "null") else str(mode)


def _dedupe(problems: List[Problem]) -> List[Problem]:
    seen, out = set(), []
    for p in problems:
        if (p.key, p.message) not in seen:
            seen.add((p.key, p.message))
            out.append(p)
    return out


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


def _lay_out_ports(records: Dict[str, ServerArgs], sides: Dict[str, _Side], settings: DeploySettings,
                   explicit_deploy: set, problems: List[Problem]) -> Tuple[Dict[str, Dict[str, int]], Tuple[int, int]]:
    """Give every listening socket of the deployment its own port.

    Ports the user wrote are kept (two of them clashing is an error naming both); the others
    start from their defaults and move up past anything taken on the same host, together with
    the ports SGLang derives from them (attention DP's block at --port + 233, the gRPC mode's
    ports).  A top-level ``serving.port`` is the prefill server's port; decode then takes the
    first port whose whole block is free."""
    pre = records["prefill"]

    def explicit_for(role: str):
        def is_explicit(name: str) -> Optional[str]:
            """Where ``name`` was written for this side: "side", "top level" or None (not written)."""
            if name in sides[role].side_names:
                return "side"
            if role == "decode" and name == "port":      # a shared --port is prefill's
                return None
            return "top level" if name in sides[role].shared_names else None
        return is_explicit

    claims = [c for role in SIDES for c in _side_claims(role, records[role], explicit_for(role))]
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
    assigned: Dict[str, Dict[str, int]] = {"prefill": {}, "decode": {}, "router": {}}
    for c in claims:
        if c.explicit:
            continue
        base = c.base
        if c.assign == ("decode", "port"):      # decode's --port starts right after prefill's
            base = assigned["prefill"].get("port", pre.port) + 1
        while _first_clash(c, base, taken) and base < 65535:
            base += 1
        c.base = base
        taken.append(c)
        role, name = c.assign
        assigned[role][name] = base
    for c in claims:
        if c.explicit and c.assign and c.assign[0] in ("prefill", "decode"):
            assigned[c.assign[0]].setdefault(c.assign[1], c.base)
    router = assigned.pop("router")
    return assigned, (router.get("router_port", settings.router_port),
                      router.get("router_prometheus_port", settings.router_prometheus_port))


def listening_ports(dep: Deployment) -> List[Tuple[str, str, int]]:
    """(what to change, host, port) for every socket the deployment binds, for the launch's port check."""
    out = []
    for s in dep.servers:
        role = s.role if dep.name == "pd" else None
        for c in _side_claims(role, s.record, lambda name: True):
            for port, host, what in c.ports():
                out.append((c.label + (f" [{what}]" if what else ""), host, port))
    if dep.router:
        out.append(("deploy.router_port", dep.router.host, dep.router.port))
        out.append(("deploy.router_prometheus_port", dep.router.host, dep.router.prometheus_port))
    return out


# --------------------------------------------------------------------------- GPUs
def gpus_per_node(record: ServerArgs) -> int:
    """How many GPUs one server takes on each of its nodes.

    Every data-parallel replica (``dp_size``) is a full ``tp_size`` x ``pp_size`` group of GPUs;
    attention DP (``attn_dp_size``) splits the TP group and adds none.  A multi-node server
    (``nnodes``) spreads its GPUs evenly over its nodes."""
    total = max(1, record.tp_size) * max(1, record.pp_size) * max(1, record.dp_size)
    nodes = max(1, record.nnodes)
    return -(-total // nodes)


def gpu_ids(record: ServerArgs) -> List[int]:
    """The GPU ids a server uses on its node: ``base_gpu_id`` then every ``gpu_id_step``-th one."""
    step = max(1, record.gpu_id_step)
    return [record.base_gpu_id + i * step for i in range(gpus_per_node(record))]


def _on_gpus(record: ServerArgs, device_written: bool) -> bool:
    """Whether a server's GPUs need laying out.  A device the user did not write was detected on the
    machine that resolves the command (a login node without a GPU driver says ``cpu``); the servers
    run on a GPU node, so they are laid out as GPU servers: an unused ``--base-gpu-id`` on a real CPU
    run is harmless, while two sides on one GPU would fail at start."""
    return str(record.device or "cuda").lower() != "cpu" or not device_written


def _lay_out_gpus(records: Dict[str, ServerArgs], sides: Dict[str, _Side], problems: List[Problem]) -> Dict[str, int]:
    """Give decode its own GPUs when both sides run on one node.

    Prefill keeps its ``base_gpu_id`` (a top-level value is prefill's, like ``serving.port``);
    decode starts right after prefill's last GPU unless decode's value was written, in which case
    it is kept and must not share a GPU with prefill.  Servers on different hosts are left alone."""
    import logging

    pre, dec = records["prefill"], records["decode"]
    written = {role: "device" in s.side_names or "device" in s.shared_names for role, s in sides.items()}
    if not _hosts_overlap(pre.host, dec.host) or not (_on_gpus(pre, written["prefill"])
                                                       and _on_gpus(dec, written["decode"])):
        return {}
    detected = [role for role, rec in records.items() if str(rec.device).lower() == "cpu" and not written[role]]
    if detected and "base_gpu_id" not in sides["decode"].side_names and not problems:
        logging.getLogger("sglang_hydra.config").warning(
            "deploy=pd: no GPU was found here (device detected as cpu), so decode is placed after prefill's GPUs "
            "as on a GPU node; set device.device=cpu if both sides really run on the CPU")
    if "base_gpu_id" not in sides["decode"].side_names:
        return {"base_gpu_id": pre.base_gpu_id + gpus_per_node(pre) * max(1, pre.gpu_id_step)}
    shared = sorted(set(gpu_ids(pre)) & set(gpu_ids(dec)))
    if shared:
        key = problem_for("base_gpu_id", "")
        problems.append(Problem(
            f"decode.{key.key}", key.flag,
            f"decode GPUs {gpu_ids(dec)} overlap {_label('prefill', 'base_gpu_id')} GPUs {gpu_ids(pre)} "
            f"(GPU {', '.join(map(str, shared))}) on host {dec.host}; each side needs its own GPUs (move one of "
            f"them, leave decode's unset to have it placed after prefill, or run the sides on different hosts "
            f"with prefill.serving.host / decode.serving.host)", _SOURCE))
    return {}


# --------------------------------------------------------------------------- cross-side checks
_MUST_AGREE = (
    ("model_path", "the decode side receives the prefill side's KV cache, so both must serve the same model"),
    ("page_size", "KV pages are transferred whole, so both sides must use the same page size"),
    ("kv_cache_dtype", "KV bytes are copied as they are, so both sides must store the same KV dtype"),
    ("disaggregation_transfer_backend", "both sides must speak the same KV transfer backend"),
)


def cross_side_problems(prefill: ServerArgs, decode: ServerArgs) -> List[Problem]:
    """What the two sides of a PD pair must agree on, checked before anything starts."""
    out = []
    for name, why in _MUST_AGREE:
        a, b = getattr(prefill, name), getattr(decode, name)
        if a != b:
            p = problem_for(name, "")
            out.append(Problem(p.key, p.flag, f"prefill has {a!r} but decode has {b!r}: {why}; set it once at "
                               f"top level or the same on both sides", _SOURCE))
    return out
