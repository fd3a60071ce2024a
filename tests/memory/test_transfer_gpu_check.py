"""scripts/gpu_check.sh, the one prepared GPU run, rehearsed here so that the device call
cannot fail on a typo: syntax, arguments, step bookkeeping and a real CPU rehearsal."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
BASH = shutil.which("bash")

pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def run(args=(), env=None, timeout=300):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([BASH, str(SCRIPT), *args], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def summary(out: Path):
    rows = {}
    for line in (out / "summary.txt").read_text().splitlines():
        step, status = line.split()[:2]
        rows.setdefault(step, []).append(status)
    return rows


def test_syntax():
    subprocess.run([BASH, "-n", str(SCRIPT)], check=True, timeout=30)


def test_help_and_bad_arguments():
    assert run(["--help"]).returncode == 0
    bad = run(["--rehaerse"])
    assert bad.returncode == 2 and "unknown argument '--rehaerse'" in bad.stderr


def test_failing_steps_do_not_stop_the_rest(tmp_path):
    """With a python that always fails every step fails, each is still run and recorded,
    and the script exits 1."""
    proc = run(["--rehearse"], env={"OUT": str(tmp_path), "PYTHON": "false", "GPU_CHECK_ONLY": ""}, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = summary(tmp_path)
    for step in ("env", "transfer_cuda", "disagg_cuda", "bench_transfer", "setup_keys", "setup_verify"):
        assert rows[step] == ["FAIL"], rows
        assert (tmp_path / f"{step}.log").is_file()
    assert rows["calibrate"] == ["SKIP"]      # the job check itself needs python


def test_rehearsal_checks_the_gpu_command_line(tmp_path):
    """The GPU setup command (override keys, job settings) composes on this machine."""
    proc = run(["--rehearse"], env={"OUT": str(tmp_path), "GPU_CHECK_ONLY": "setup_keys"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = summary(tmp_path)
    assert rows == {"env": ["PASS"], "setup_keys": ["PASS"]}, rows
    log = (tmp_path / "setup_keys.log").read_text()
    assert "setup {'name': 'setup'" in log and "'verify': True" in log and "cuda 0.5" in log
    assert "cuda available" in (tmp_path / "env.log").read_text()
