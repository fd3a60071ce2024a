"""Composing a deployment: the deploy keys, each side's command and record, the two passes (learn
the addresses, then compose with the laid-out ports and GPUs) and the checks the two sides must
pass together.  It sits on top of the rest of the package and ties it together."""
from __future__ import annotations

import re
from dataclasses import fields as dc_fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ConfigError, Problem, did_you_mean, problem_for
from ..legacy import Setting
from ..record import ServerArgs
from .gpus import _lay_out_gpus, gpu_budget_problems
from .model import (PLANNING_JOBS, SIDE_PLANNING_JOBS, SIMULATING_JOBS, WORKER_KEYS, deploy_settings_problems, DEFAULT_DEPLOY, DEPLOYMENT_JOBS, ROUTER_POLICIES, SIDES, _SOURCE, Deployment, DeploySettings,
                    Router, Server, _managed_router_flags, _Side)
from .ports import _lay_out_ports
from .request import DeployRequest

# --------------------------------------------------------------------------- composition
def deploy_options() -> List[str]:
    from ..presets import group_options
    return group_options("deploy")


def _deploy_settings(req: DeployRequest, problems: List[Problem]) -> Tuple[DeploySettings, set]:
    from ..compose import _coerce_job
    from ..presets import no_such_option, preset

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
            err = f"{v!r} is not a policy sglang-router 0.3.2 offers (one of: {', '.join(ROUTER_POLICIES)})"
        if err is None and k in WORKER_KEYS + ("total_gpus",) and v is not None and (type(v) is not int or v < 1):
            err = f"{v!r} is not a positive whole number"
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
    problems += [Problem(key, None, message, "deploy")
                 for key, message in deploy_settings_problems(out, sorted(explicit))
                 if key.partition(".")[2] not in ("router_policy",) and key.partition(".")[2] in WORKER_KEYS]
    planning = any(str(t) in {f"job={j}" for j in PLANNING_JOBS} for t in req.shared_argv)
    if not out.has_router and not planning:      # a search chooses the server counts itself
        for k in sorted(explicit):
            if k.startswith("router"):
                problems.append(Problem(f"deploy.{k}", None, f"the router only runs with deploy=pd or with "
                                        f"deploy.workers above 1 (this is deploy={option} with one server)", "deploy"))
        if req.wants_sides:
            problems.append(Problem("deploy", None, f"prefill./decode. settings need deploy=pd "
                                    f"(this is deploy={option})", "deploy"))
    return out, explicit


def _side_command(req: DeployRequest, role: Optional[str]) -> _Side:
    from ..compose import Command, build_command, load_config_file, parse_overrides, settings_from_mapping

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

    from ..compose import resolve_command

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
        problems.append(Problem("deploy", None, f"{what}: a deployment runs without the rest of Hydra's runtime; it "
                                "takes -m (a sweep of deployments), hydra.run.dir, hydra.sweep.dir and "
                                "hydra.sweep.subdir, and no other Hydra flag", "deploy"))
    if settings.name != "pd":
        if settings.workers > 1:           # several servers: a deployment, resolved unless a job is named
            first.cmd.choices.setdefault("job", "resolve")
        record, composed, probs = _compose(first, (), env)
        if record is not None:
            probs += _budget(settings, [("deploy.workers", settings.workers, record)], composed)
        if problems or probs:
            raise ConfigError(problems + probs)
        if composed.job_name in PLANNING_JOBS and settings.workers == 1:     # it needs the deploy keys
            return (Deployment(settings.name, (Server("server", record),), None, settings, composed.hardware),
                    composed.job_name, composed.job)
        if settings.workers == 1 or composed.job_name not in DEPLOYMENT_JOBS:
            # one server, or a job that works on the record and reads the deploy keys from its context
            # (job=replay simulates deploy.workers servers itself)
            return record, composed.job_name, composed.job
        return _aggregated(first, record, composed, settings, explicit_deploy, env)

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
    from ..presets import group_options
    pd_jobs = DEPLOYMENT_JOBS + SIMULATING_JOBS + SIDE_PLANNING_JOBS
    if job_name not in pd_jobs and job_name in group_options("job"):
        problems.append(Problem("job", None, f"job={job_name} works on one record, not a deployment; deploy=pd "
                                f"supports job={', job='.join(pd_jobs)}", "deploy"))
    records = {role: rec for role, (rec, _c, _p) in first_pass.items()}
    if all(records.values()):
        problems += _budget(settings, [("deploy.prefill_workers", settings.prefill_workers, records["prefill"]),
                                       ("deploy.decode_workers", settings.decode_workers, records["decode"])],
                            first_pass["prefill"][1])
    by_role = {s.role: s for s in sides}
    counts = {"prefill": settings.prefill_workers, "decode": settings.decode_workers}
    node_gpus = getattr(getattr(first_pass["prefill"][1], "hardware", None), "gpus_per_node", None)
    if all(records.values()):
        workers = _workers(counts, records)
        assigned, router_ports = _lay_out_ports(workers, by_role, settings, explicit_deploy, problems)
        for name, values in _lay_out_gpus(workers, by_role, problems, node_gpus).items():
            assigned[name].update(values)
        problems += cross_side_problems(records["prefill"], records["decode"])
    else:       # a side failed: check the rest on a stand-in without the settings that failed
        stand_in, dropped = {}, set()
        for s in sides:
            stand_in[s.role], gone = (records[s.role], set()) if records[s.role] else _stand_in(s, first_pass[s.role][2], env)
            dropped |= {f"{s.role}.{name}" for name in gone}
        if all(stand_in.values()):
            port_problems: List[Problem] = []
            _lay_out_ports(_workers(counts, stand_in), by_role, settings, explicit_deploy, port_problems)
            problems += [p for p in port_problems if not _mentions(p, dropped)]
            problems += [p for p in cross_side_problems(stand_in["prefill"], stand_in["decode"])
                         if not any(d.endswith("." + _field_of(p.key)) for d in dropped)]
    if problems:
        raise ConfigError(_dedupe(problems))

    # pass 2: the same commands with the ports laid out, once per server
    servers: List[Server] = []
    composed_job = None
    for name, role, _rec, index in workers:
        s = by_role[role]
        extra = [Setting("disaggregation_mode", role, _SOURCE)]
        extra += [Setting(field, value, f"{_SOURCE} (assigned)") for field, value in assigned[name].items()]
        rec, composed, probs = _compose(s, extra, env, quiet=index > 0)
        problems += [Problem(f"{role}.{p.key}", p.flag, p.message, p.source) for p in probs]
        if rec is not None:
            servers.append(Server(role, rec, index if counts[role] > 1 else None))
            composed_job = composed_job or composed
    if problems:
        raise ConfigError(_dedupe(problems))
    final = {s.role: s.record for s in servers if not s.index}
    problems += cross_side_problems(final["prefill"], final["decode"])
    if problems:
        raise ConfigError(problems)
    router = Router(settings.router_host, router_ports[0], router_ports[1], settings.router_policy,
                    tuple(settings.router_extra_args))
    dep = Deployment("pd", tuple(servers), router, settings)
    return dep, composed_job.job_name, composed_job.job


def _aggregated(side: _Side, record: ServerArgs, composed, settings: DeploySettings, explicit_deploy: set,
                env) -> Tuple[Deployment, str, Dict[str, Any]]:
    """``deploy.workers`` N copies of one record behind the router's regular mode, each with its own
    port and GPUs."""
    problems: List[Problem] = []
    if composed.job_name not in DEPLOYMENT_JOBS:
        problems.append(Problem("job", None, f"job={composed.job_name} works on one record, not deploy.workers="
                                f"{settings.workers} servers; use job={' or job='.join(DEPLOYMENT_JOBS)}", "deploy"))
    workers = _workers({"server": settings.workers}, {"server": record})
    sides = {"server": side}
    assigned, router_ports = _lay_out_ports(workers, sides, settings, explicit_deploy, problems)
    node_gpus = getattr(getattr(composed, "hardware", None), "gpus_per_node", None)
    for name, values in _lay_out_gpus(workers, sides, problems, node_gpus).items():
        assigned[name].update(values)
    if problems:
        raise ConfigError(_dedupe(problems))
    servers = []
    for name, _role, _rec, index in workers:
        extra = [Setting(field, value, "deploy.workers (assigned)") for field, value in assigned[name].items()]
        rec, _c, probs = _compose(side, extra, env, quiet=True)
        if probs:
            raise ConfigError(probs)
        servers.append(Server("server", rec, index))
    router = Router(settings.router_host, router_ports[0], router_ports[1], settings.router_policy,
                    tuple(settings.router_extra_args))
    return Deployment("single", tuple(servers), router, settings), composed.job_name, composed.job


def _workers(counts: Dict[str, int], records: Dict[str, ServerArgs]) -> List[Tuple[str, str, ServerArgs, int]]:
    """(name, role, record, index) for every server, in start order: ``prefill`` alone, or
    ``prefill0``, ``prefill1``... when a role has several."""
    return [(role if counts[role] == 1 else f"{role}{i}", role, records[role], i)
            for role in records for i in range(counts[role])]


def _budget(settings: DeploySettings, groups, composed) -> List[Problem]:
    """The servers' GPUs against deploy.total_gpus, or the hardware's node when that is unset."""
    hardware = getattr(composed, "hardware", None)
    return gpu_budget_problems(groups, settings.total_gpus, getattr(hardware, "gpus_per_node", None),
                               getattr(hardware, "name", ""))


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
    from ..record import FIELDS
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
    from ..presets import preset
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
