"""The command-line pre-scan: which tokens of a command (and which sections of its --config file)
belong to the deployment, to each side or to both, before anything is composed.  It only splits and
types the input; composing it is :mod:`.assemble`'s job."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import Problem
from .model import SIDES

# deploy=..., deploy.x=..., prefill.x=..., decode.x=... (with Hydra's +/++ prefixes)
_TOKEN = re.compile(r"^(?P<plus>\+{0,2})(?P<head>deploy|prefill|decode)(?P<sep>[.=])(?P<rest>.*)$", re.S)
_HELP_FLAGS = ("--help", "-h", "--hydra-help")


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
    file_option: Optional[str] = None          # the file's deploy=<option> (the command line's may win)
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
    from ..legacy import split_argv
    return {pos for pos, _text in split_argv(argv).overrides}


def _deploy_token(req: DeployRequest, sep: str, rest: str, tok: str) -> None:
    before = len(req.problems)
    value, sweep = _parse_value(rest, tok, req)
    if len(req.problems) > before:         # unparsable: said once, not again as a missing value
        return
    if sweep:
        key = "deploy" if sep == "=" else f"deploy.{rest.partition('=')[0]}"
        req.problems.append(Problem(key, None, f"{tok!r} lists several values: add -m to run one deployment "
                                    f"per value (a sweep)", f"override {tok}"))
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
    from ..presets import yaml_load

    p = Path(req.config_file)
    if p.suffix.lower() not in (".yaml", ".yml") or not p.is_file():
        return False          # the ordinary --config loader reports these
    try:
        data = yaml_load(p)
    except Exception:          # invalid YAML: reported by the ordinary loader too
        return False
    if not isinstance(data, dict):
        return False
    data = _nest_dotted(data)
    if not ({"deploy", *SIDES} & set(map(str, data))):
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
                req.file_option = v
            elif isinstance(v, dict):
                for dk, dv in v.items():
                    if str(dk) == "name":
                        req.option = req.option or str(dv)
                        req.file_option = str(dv)
                    else:
                        from_file.append((str(dk), dv, source))
            else:
                req.problems.append(Problem("deploy", "--config", f"{source}: 'deploy' must be an option name "
                                            f"(single, pd) or a mapping of deploy keys"))
        else:
            req.file_shared[k] = v
    req.deploy_settings[:0] = from_file          # the file's deploy keys, then the command line's
    return True


def _nest_dotted(data: Dict[str, Any]) -> Dict[str, Any]:
    """``deploy.x: v`` / ``prefill.ns.f: v`` written flat (as a sweep's best_config.yaml has them)
    moved into their sections; ``deploy: pd`` beside them becomes the section's ``name``."""
    heads = ("deploy", *SIDES)
    if not any(str(k).partition(".")[0] in heads and "." in str(k) for k in data):
        return data
    out: Dict[str, Any] = {}
    for k, v in data.items():
        head, dot, rest = str(k).partition(".")
        if not dot or head not in heads:
            out[k] = v
            continue
        section = out.get(head)
        if isinstance(section, str):          # deploy: pd, then deploy.x: ...
            section = {"name": section}
        section = dict(section or {})
        section[rest] = v
        out[head] = section
    if isinstance(out.get("deploy"), dict) and isinstance(data.get("deploy"), str):
        out["deploy"].setdefault("name", data["deploy"])
    return out
