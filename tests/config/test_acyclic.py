"""No import cycles inside the config layer (nor memory, jobs, utils), at any depth.

``tests/test_layers.py`` runs the project-wide ``acyclic`` contract; this runs the same kind
of contract over only these packages, so a cycle here is named on its own even while
another package's cycle is still being cut.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sglang_hydra.config", "sglang_hydra.memory", "sglang_hydra.jobs", "sglang_hydra.utils")


def _lint(tmp_path: Path, root: str, ancestors, pythonpath: str = "") -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(exe).exists():
        pytest.skip("import-linter is not installed (pip install -e .[test])")
    cfg = tmp_path / "acyclic.ini"
    cfg.write_text(f"[importlinter]\nroot_package = {root}\n\n"
                   "[importlinter:contract:acyclic-here]\nname = acyclic here\ntype = acyclic_siblings\n"
                   "ancestors =\n" + "".join(f"    {a}\n" for a in ancestors), encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([exe, "--no-cache", "--config", str(cfg)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def test_config_memory_jobs_and_utils_have_no_import_cycles(tmp_path):
    proc = _lint(tmp_path, "sglang_hydra", PACKAGES)
    assert proc.returncode == 0, proc.stdout[proc.stdout.find("Broken contracts"):] or proc.stdout + proc.stderr


def test_the_check_names_a_cycle_between_siblings(tmp_path):
    """Also one made by an import inside a function."""
    pkg = tmp_path / "cyclepkg" / "inner"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from . import high\n    return high\n")
    (pkg / "high.py").write_text("from . import low\n")
    proc = _lint(tmp_path, "cyclepkg", ["cyclepkg"], pythonpath=str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "No cycles are allowed in cyclepkg.inner." in proc.stdout
