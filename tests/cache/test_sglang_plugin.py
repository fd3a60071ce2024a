"""The engine plugin: what it imports, how it is declared, and the checks that need it.

That SGLang itself loads it and uses its strategy (identical hits) is
tests/cache/test_engine_radix_differential.py (reference venv)."""
import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from sglang_hydra.cache.policies import (
    available_policies,
    make_policy,
    policy_needs_plugin,
    policy_runs_in_sglang,
    validate_policy_config,
)
from sglang_hydra.cache import sglang_plugin

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "sglang_hydra" / "cache" / "sglang_plugin.py"


def test_entry_point_declared_in_the_plugin_group():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["sglang.srt.plugins"]
    assert eps == {sglang_plugin.PLUGIN_NAME: "sglang_hydra.cache.sglang_plugin:register"}


def test_plugin_module_imports_only_the_standard_library_and_sglang():
    tree = ast.parse(PLUGIN.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            assert top == "sglang" or top in sys.stdlib_module_names or name == "__future__", name


def test_importing_the_plugin_pulls_in_no_hydra_omegaconf_or_torch():
    code = ("import sys, sglang_hydra.cache.sglang_plugin as p; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('hydra', 'omegaconf', 'torch', 'numpy', 'yaml', 'triton')); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr


def test_which_policies_need_the_plugin():
    assert policy_needs_plugin("span_lru")
    assert not policy_needs_plugin("lru") and not policy_needs_plugin("ghost_lru")
    assert policy_runs_in_sglang("lru") and policy_runs_in_sglang("span_lru")
    assert not policy_runs_in_sglang("ghost_lru") and not policy_runs_in_sglang("belady")
    # the ghost-history policies need insert/evict hooks: replay-only until a radix-cache backend ships
    for name in ("ghost_lfu", "auto_ghost_lfu", "hit_density"):
        assert name in available_policies() and not policy_runs_in_sglang(name)
    # every plugin policy is one of ours with the same parameters
    for name, params in sglang_plugin.PLUGIN_POLICIES.items():
        assert name in available_policies()
        assert make_policy(name).params() == params


def test_span_lru_config_keys_are_checked():
    assert validate_policy_config("span_lru", {"alpha": 2}) == []
    (msg,) = validate_policy_config("span_lru", {"beta": 1})
    assert "unknown key 'beta'" in msg and "'alpha'" in msg


def _no_plugin_python(tmp_path):
    """An interpreter that sees no installed distributions (isolated, no site-packages)."""
    exe = tmp_path / "bare-python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


def test_check_engine_says_how_to_install_the_plugin(tmp_path):
    py = _no_plugin_python(tmp_path)
    r = run("job=resolve", "job.check=engine", "memory.radix_eviction_policy=span_lru", f"job.python={py}",
            cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("  - ")]
    assert len(lines) == 1 and "memory.radix_eviction_policy (--radix-eviction-policy)" in lines[0]
    assert f"{py} -m pip install --no-deps sglang-hydra" in lines[0]


def test_replay_only_policies_cannot_be_deployed(tmp_path):
    r = run("job=resolve", "job.check=engine", "memory.radix_eviction_policy=ghost_lru", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "'ghost_lru' is a replay-only policy" in r.stderr and "span_lru" in r.stderr
    r = run("job=launch", "job.dry_run=true", "memory.radix_eviction_policy=ghost_lru", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--radix-eviction-policy ghost_lru" in r.stdout
    assert "note: memory.radix_eviction_policy: 'ghost_lru' is a replay-only policy" in r.stderr
    r = run("job=launch", "memory.radix_eviction_policy=span_lru", f"job.python={_no_plugin_python(tmp_path)}",
            cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "'span_lru' runs in SGLang only through sglang-hydra's engine plugin" in r.stderr
