"""Every command in README.md's ```bash blocks runs as written, from a copy of the repository.

Only the two set-up commands at the top (create the venv and install; run the test suite,
which is this very suite) are skipped, and the test asserts that exactly those two are
the ones skipped.  The commands run with the installed ``sglang-hydra`` (this venv's bin
directory first on PATH) in a temporary copy of the tracked and untracked-but-not-ignored
files, so nothing depends on outputs of an earlier run.  Long commands are marked slow; CI
still runs them (each within COMMAND_TIMEOUT_S).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COMMAND_TIMEOUT_S = 600

# The set-up commands, skipped by name: installing is what produced this environment, and the
# test command runs this suite (recursion).
SETUP_COMMANDS = (
    'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e ".[mooncake,nixl,slurm,optuna,ray,router,test]" && sglang-hydra',
    ". .venv/bin/activate && python -m pytest -q --durations=15",
)

# Commands that take more than a few seconds on a 2-core machine (a sweep, real allocations,
# real byte movement, two processes): still run, but marked so `-m "not slow"` can leave them out.
SLOW_PATTERNS = (r"^sglang-hydra -m job=replay", r"model=llama3_8b", r"job\.mode=full", r"job=pd_pair",
                 r"job\.trace=conversation", r"hydra/sweeper=optuna", r"deploy=pd",
                 r"outputs/search8/best_deploy\.yaml")   # launches what the (slow) search before it wrote


def readme_commands(text: str):
    """The commands of every ```bash block, with backslash-continued lines joined."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        pending = ""
        for line in block.splitlines():
            if not line.strip() and not pending:
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1].rstrip() + " "
                continue
            commands.append((pending + line.strip()).strip())
            pending = ""
        if pending:
            commands.append(pending.strip())
    return commands


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))
RUNNABLE = [c for c in COMMANDS if c not in SETUP_COMMANDS]


def _strip_comment(cmd: str) -> str:
    return re.sub(r"\s+#[^'\"]*$", "", cmd).strip()


def _param(cmd: str):
    marks = [pytest.mark.slow] if any(re.search(p, cmd) for p in SLOW_PATTERNS) else []
    return pytest.param(cmd, marks=marks, id=_strip_comment(cmd)[:80])


def test_only_the_setup_commands_are_skipped():
    skipped = [c for c in COMMANDS if c in SETUP_COMMANDS]
    assert skipped == list(SETUP_COMMANDS), "README's set-up commands changed; update SETUP_COMMANDS"
    assert COMMANDS[:2] == list(SETUP_COMMANDS)          # ... and they are the two at the top
    assert len(RUNNABLE) >= 10                           # the tour and the jobs are all found


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    """The repository as a fresh clone would have it (no venv, no outputs of earlier runs)."""
    dest = tmp_path_factory.mktemp("readme") / "repo"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.mark.parametrize("command", [_param(c) for c in RUNNABLE])
def test_readme_command_runs(repo_copy, command):
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "sglang-hydra").exists(), "the sglang-hydra console script is not installed in this venv"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    for var in ("SGLANG_HYDRA_TRACEBACK", "HYDRA_FULL_ERROR"):
        env.pop(var, None)
    r = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=repo_copy, capture_output=True, text=True,
                       timeout=COMMAND_TIMEOUT_S, env=env)
    assert r.returncode == 0, f"{command}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr
