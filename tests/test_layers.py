"""The layer contract: config imports nothing above it, and the layers above fill its registries.

The import-linter contracts in pyproject.toml are run one by one (``lint-imports --contract``),
so a broken one names itself; `.ci/run` runs all of them before the tests as well.
"""
from __future__ import annotations

import ast
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "sglang_hydra"


def _contract_ids():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return [c["id"] for c in data["tool"]["importlinter"]["contracts"]]


def test_contracts_are_declared():
    assert set(_contract_ids()) >= {"layers", "config-pure", "no-hydra-below-config", "acyclic"}
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "ignore_imports" not in text.split("[tool.importlinter]", 1)[1]


@pytest.mark.parametrize("contract", _contract_ids())
def test_import_contract(contract):
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install -e .[test])")
    proc = subprocess.run([exe, "--no-cache", "--contract", contract], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[proc.stdout.find("Broken contracts"):] or proc.stdout + proc.stderr


# --------------------------------------------------------------------- Hydra's runtime
#: Hydra pieces the config layer may use: the override grammar, the Compose API, ConfigStore
#: and the help page.  ``hydra.main``, ``HydraConfig`` (the runtime of a launched job) and the
#: launchers/callbacks belong to ``cli`` and ``jobs``.
CONFIG_HYDRA_MODULES = {"hydra.core.override_parser.overrides_parser", "hydra.errors", "hydra.core.global_hydra",
                        "hydra.core.config_store", "hydra.conf"}
CONFIG_HYDRA_NAMES = {"compose", "initialize_config_dir"}   # from hydra import ...


def _hydra_imports(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "hydra" or alias.name.startswith("hydra."):
                    yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                (node.module == "hydra" or node.module.startswith("hydra.")):
            for alias in node.names:
                yield node.lineno, node.module, alias.name


def test_hydra_runtime_only_in_cli_and_jobs():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        top = rel.parts[0].removesuffix(".py")
        if top in ("cli", "jobs"):
            continue
        for line, module, name in _hydra_imports(path):
            allowed = top == "config" and (
                module in CONFIG_HYDRA_MODULES or (module == "hydra" and name in CONFIG_HYDRA_NAMES))
            if not allowed:
                bad.append(f"{rel}:{line}: {module}{'.' + name if name else ''}")
    assert not bad, "Hydra's runtime used outside cli/jobs:\n" + "\n".join(bad)


def test_hydra_check_catches_runtime_use(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("from hydra.core.hydra_config import HydraConfig\nimport hydra\nfrom hydra import main\n")
    assert [(m, n) for _, m, n in _hydra_imports(sample)] == [
        ("hydra.core.hydra_config", "HydraConfig"), ("hydra", None), ("hydra", "main")]


# ----------------------------------------------------------------- config imports nothing above
def test_config_modules_import_nothing_above_config():
    """Also imports inside functions: every ``sglang_hydra.*`` import in config/ stays in config/."""
    bad = []
    for path in sorted((PACKAGE / "config").rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        depth = len(rel.parts) - 1            # package depth below sglang_hydra
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    target = list(rel.parts[:-1])[: depth - node.level + 1] if node.level <= depth else []
                    full = ".".join(target + ([node.module] if node.module else []))
                else:
                    full = (node.module or "").removeprefix("sglang_hydra.") if (node.module or "").startswith(
                        "sglang_hydra") else "config"
                if not (full == "config" or full.startswith("config.")):
                    bad.append(f"{rel}:{node.lineno}: {full or '.'}")
            elif isinstance(node, ast.Import):
                bad += [f"{rel}:{node.lineno}: {a.name}" for a in node.names
                        if a.name.startswith("sglang_hydra") and not a.name.startswith("sglang_hydra.config")]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
                bad.append(f"{rel}:{node.lineno}: __import__(...)")
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module":
                bad.append(f"{rel}:{node.lineno}: importlib.import_module(...)")
    assert not bad, "\n".join(bad)


def test_importing_the_config_layer_loads_only_pure_python_layers():
    code = ("import sys, sglang_hydra.config.compose, sglang_hydra.config.resolve\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy') or "
            "m.startswith(('sglang_hydra.memory', 'sglang_hydra.disagg', 'sglang_hydra.workload')))\n"
            "assert not heavy, heavy\n"
            "from sglang_hydra.config.registry import job_schemas\n"
            "assert 'replay' in job_schemas()\n"          # the first read runs the deferred registration
            "assert 'sglang_hydra.jobs.specs' in sys.modules and 'sglang_hydra.cache.policies' in sys.modules\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy') or "
            "m.startswith(('sglang_hydra.memory', 'sglang_hydra.disagg', 'sglang_hydra.workload')))\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------------- the registries
def test_builtin_plugins_fill_the_registries():
    import sglang_hydra  # noqa: F401  (runs the registration)
    from sglang_hydra.config.choices import choices
    from sglang_hydra.config.registry import job_schemas
    from sglang_hydra.jobs.specs import JOB_SPECS

    assert set(JOB_SPECS) <= set(job_schemas())
    for name, spec in JOB_SPECS.items():
        assert job_schemas()[name].config_cls is spec.config_cls
        assert dict(job_schemas()[name].choices) == {k: tuple(v) for k, v in spec.choices.items()}
    assert "ghost_lru" in choices("RADIX_EVICTION_POLICY")
    assert "belady" not in choices("RADIX_EVICTION_POLICY")   # replay-only


def test_policy_parameter_errors_reach_the_config_layer():
    import sglang_hydra  # noqa: F401
    from sglang_hydra.config.policy_params import validate_policy_config

    assert validate_policy_config("slru", None) == []
    errors = validate_policy_config("slru", {"nope": 1})
    assert len(errors) == 1 and "'nope'" in errors[0] and "slru" in errors[0]
    assert validate_policy_config("not_a_policy", {"x": 1}) == []   # the choices check reports it


def test_registered_checker_decides_for_its_own_policies(monkeypatch):
    from sglang_hydra.config import registry
    from sglang_hydra.config.policy_params import validate_policy_config

    monkeypatch.setattr(registry, "_POLICY_PARAM_CHECKERS", list(registry._POLICY_PARAM_CHECKERS))

    def mine(policy, cfg):
        return [f"{policy}: bad {sorted(cfg)}"] if policy == "my_policy" else None

    registry.register_policy_param_checker(mine)
    registry.register_policy_param_checker(mine)      # idempotent
    assert registry.policy_param_checkers().count(mine) == 1
    assert validate_policy_config("my_policy", {"k": 1}) == ["my_policy: bad ['k']"]
    assert validate_policy_config("lru", {}) == []


@dataclasses.dataclass
class _ToyJob:
    name: str = "toy"
    level: int = 1
    style: str = "a"


def test_register_job_schema_checks_its_input(monkeypatch):
    from sglang_hydra.config import registry

    monkeypatch.setattr(registry, "_JOB_SCHEMAS", dict(registry._JOB_SCHEMAS))
    schema = registry.register_job_schema("toy", _ToyJob, {"style": ["a", "b"]})
    assert registry.job_schemas()["toy"] is schema and schema.choices["style"] == ("a", "b")
    assert registry.register_job_schema("toy", _ToyJob).config_cls is _ToyJob     # same class again: fine
    with pytest.raises(ValueError, match="already registered"):
        registry.register_job_schema("toy", dataclasses.make_dataclass("Other", [("name", str, "toy")]))
    with pytest.raises(ValueError, match="name: str = 'other'"):
        registry.register_job_schema("other", _ToyJob)
    with pytest.raises(ValueError, match="does not have"):
        registry.register_job_schema("toy", _ToyJob, {"colour": ["red"]}, replace=True)
    with pytest.raises(TypeError, match="dataclass"):
        registry.register_job_schema("toy", dict)


def test_a_registered_job_is_composable(monkeypatch):
    from sglang_hydra.config import registry
    from sglang_hydra.config.compose import build_command, compose_values
    from sglang_hydra.config.errors import ConfigError

    monkeypatch.setattr(registry, "_JOB_SCHEMAS", dict(registry._JOB_SCHEMAS))
    registry.register_job_schema("toy", _ToyJob, {"style": ("a", "b")})
    cmd, _ = build_command(["job=toy", "job.level=3", "job.style=b"])
    composed = compose_values(cmd)
    assert composed.job_name == "toy" and composed.job == {"name": "toy", "level": 3, "style": "b"}
    cmd, _ = build_command(["job=toy", "job.style=c", "job.colour=1"])
    with pytest.raises(ConfigError) as err:
        compose_values(cmd)
    text = err.value.render()
    assert "job.style" in text and "'c' is not one of: a, b" in text and "job.colour" in text
