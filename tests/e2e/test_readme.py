"""Every command in README.md's ```bash blocks runs as written, from a copy of the repository.

Only the two set-up commands at the top (create the venv and install; run the test suite,
which is this very suite) are skipped, and the test asserts that exactly those two are
the ones skipped.  The commands run with the installed ``sglang-hydra`` (this venv's bin
directory first on PATH) in a temporary copy of the tracked and untracked-but-not-ignored
files, so nothing depends on outputs of an earlier run.  Long commands are marked slow; CI
still runs them (each within COMMAND_TIMEOUT_S).

Exit status 0 is not enough: :data:`EXPECTATIONS` says what each command is for (a figure its
output must show, the files it must write) and the test checks exactly that.  A README command
with no entry there fails, telling its author to add one.
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import time
from dataclasses import dataclass
from typing import Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _strip_comment(cmd: str) -> str:
    """``cmd`` without a trailing ``# comment`` (a ``#`` inside quotes is not one)."""
    quote = None
    for i, ch in enumerate(cmd):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i > 0 and cmd[i - 1].isspace():
            return cmd[:i].strip()
    return cmd.strip()
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


@dataclass(frozen=True)
class Expect:
    """What one README command is for: regexes its stdout must match, and files (globs relative to
    the working directory) it must write during this run."""
    stdout: Tuple[str, ...] = ()
    files: Tuple[str, ...] = ()
    #: exit statuses that mean the command did its job (job=validate exits 1 when a figure is outside
    #: its tolerance: the comparison it prints and writes is the result either way)
    returncodes: Tuple[int, ...] = (0,)


_RESOLVED = r"(?m)^model_path: tiny$"
# Keyed by the command without its trailing comment and with runs of spaces collapsed (`_key`).
EXPECTATIONS = {
    "sglang-hydra job=resolve": Expect(stdout=(_RESOLVED, r"(?m)^enable_hierarchical_cache: false$")),
    "sglang-hydra memory=hicache memory.hicache_ratio=3 job=resolve":
        Expect(stdout=(r"(?m)^enable_hierarchical_cache: true$", r"(?m)^hicache_ratio: 3(\.0)?$")),
    "sglang-hydra --enable-hierarchical-cache --hicache-ratio 3 --disaggregation-mode prefill job=resolve":
        Expect(stdout=(r"(?m)^enable_hierarchical_cache: true$", r"(?m)^hicache_ratio: 3(\.0)?$",
                       r"(?m)^disaggregation_mode: prefill$")),
    "sglang-hydra -m memory.radix_eviction_policy=lru,slru job=resolve":
        Expect(files=("multirun/*/*/0/record.yaml", "multirun/*/*/1/record.yaml")),
    "sglang-hydra --config docs/examples/server.yaml job=resolve job.format=argv":
        Expect(stdout=(r"^--model-path meta-llama/Meta-Llama-3-8B-Instruct .*--hicache-ratio 3\.0",)),
    "sglang-hydra --model-path meta-llama/Llama-3.1-8B-Instruct --tp 2 --quantization fp8 --attention-backend fa3 "
    "--context-length 32768 --enable-metrics job=resolve job.format=argv":
        Expect(stdout=(r"--tp-size 2", r"--quantization fp8", r"--attention-backend fa3",
                       r"--context-length 32768", r"--enable-metrics")),
    "python -m sglang_hydra --help":
        Expect(stdout=(r"== Config groups ==", r"(?m)^job: .*pd_pair", r"job=replay: ")),
    "sglang-hydra": Expect(stdout=(r"1 server\(s\) x dp 8 x tp 1 = 8 GPU\(s\)", r"TTFT P50 / P90 / P99",
                                   r"token hit rate", r"wrote outputs/.*/metrics\.json"),
                           files=("outputs/*/*/metrics.json",)),
    "sglang-hydra job=setup model=llama3_8b memory=hicache schedule.max_total_tokens=4096 job.verify=true "
    "hardware.host_memory_gb=16":
        Expect(stdout=(r"verify OK: \d+ rounds x \d+ pages", r"host \[\w+\] [\d,]+ tokens")),
    "sglang-hydra job=pd_pair model=tiny disagg.disaggregation_transfer_backend=zmq job.requests=200":
        Expect(stdout=(r"backend=zmq requests=200 .*ok=200 failed=0", r"verified ok=200/200",
                       r"requests written to .*pd_pair\.json"), files=("outputs/*/*/pd_pair.json",)),
    "sglang-hydra deploy=pd prefill.parallel.tp_size=4 decode.memory.hicache_ratio=3 job=resolve":
        Expect(stdout=(r"(?m)^deploy: pd$", r"(?m)^prefill:$", r"(?m)^decode:$", r"(?m)^  tp_size: 4$",
                       r"(?m)^  hicache_ratio: 3(\.0)?$")),
    "sglang-hydra deploy=pd model=llama3_8b job=launch job.dry_run=true":
        Expect(stdout=(r"(?m)^# prefill .*\n.*sglang\.launch_server .*--disaggregation-mode prefill",
                       r"(?m)^# decode .*\n.*--disaggregation-mode decode",
                       r"(?m)^# router .*\n.*sglang_router\.launch_router --pd-disaggregation")),
    "sglang-hydra job=validate model=tiny_llama hardware=local job.calibrate=true "
    "job.python=$SGLANG_HYDRA_REFERENCE_PYTHON":
        Expect(stdout=(r"token hit rate", r"TTFT P50 ms", r"relative error per request",
                       r"wrote .*validation\.csv, validation\.json, validation\.png"),
               files=("outputs/*/*/validation.csv", "outputs/*/*/validation.png", "outputs/*/*/predicted.jsonl"),
               returncodes=(0, 1)),
    # the what-if section (job=replay simulates the deployment; every figure needs a target GPU)
    "sglang-hydra job=plan model=llama3_1_8b hardware=h100_80gb memory=hicache memory.hicache_ratio=2":
        Expect(stdout=(r"KV memory plan \(mha, 32 layers", r"target h100_80gb: 80 GB GPU",
                       r"host \[\w+\] [\d,]+ tokens .* sized by hicache_ratio 2 x [\d,]+ device tokens")),
    "sglang-hydra job=replay model=llama3_1_8b hardware=h100_80gb job.trace=conversation parallel.dp_size=8":
        Expect(stdout=(r"1 server\(s\) x dp 8 x tp 1 = 8 GPU\(s\)", r"TTFT P50 / P90 / P99", r"TPOT P50 / P90",
                       r"requests served / rejected +│ +12,031 / 0", r"status +│ +ok"),
               files=("outputs/*/*/metrics.json",)),
    "sglang-hydra -m job=replay model=llama3_1_8b hardware=h100_80gb parallel.dp_size=1,2,4,8 "
    "parallel.load_balance_method=round_robin,total_tokens":
        Expect(files=("multirun/*/*/summary.csv", "multirun/*/*/summary.png", "multirun/*/*/7/metrics.json")),
    "sglang-hydra job=replay model=llama3_1_8b hardware=h100_80gb deploy.workers=4 deploy.router_policy=cache_aware":
        Expect(stdout=(r"4 server\(s\) x dp 1 x tp 1 = 4 GPU\(s\), router cache_aware", r"TTFT P50 / P90 / P99"),
               files=("outputs/*/*/metrics.json",)),
    "sglang-hydra job=replay deploy=pd deploy.prefill_workers=3 deploy.decode_workers=1 prefill.parallel.tp_size=1 "
    "decode.parallel.tp_size=4 model=llama3_1_8b hardware=h100_80gb job.trace=conversation":
        Expect(stdout=(r"3P \(dp 1 x tp 1\) \+ 1D \(dp 1 x tp 4\), mooncake over nic = 7 GPU\(s\)",
                       r"TTFT P50 / P90 / P99"),
               files=("outputs/*/*/metrics.json",)),
    "sglang-hydra -m job=replay deploy=pd deploy.prefill_workers=2,3,4 disagg.disaggregation_transfer_backend="
    "mooncake,zmq model=llama3_1_8b hardware=h100_80gb job.max_requests=300":
        Expect(stdout=(r"sweep summary: 6 points in \S+: 6 ok",),
               files=("multirun/*/*/summary.csv", "multirun/*/*/summary.png", "multirun/*/*/pareto.png",
                      "multirun/*/*/best_config.yaml", "multirun/*/*/5/metrics.json")),
    "sglang-hydra -m model=llama3_1_8b hardware=h100_80gb memory=hicache job.trace=conversation parallel.dp_size=8 "
    "memory.hicache_ratio=1,2,4 memory.radix_eviction_policy=lru,ghost_lru hydra/launcher=joblib "
    "hydra.launcher.n_jobs=2":
        Expect(files=("multirun/*/*/summary.csv", "multirun/*/*/summary.png", "multirun/*/*/pareto.png",
                      "multirun/*/*/best_config.yaml", "multirun/*/*/5/metrics.json")),
    "sglang-hydra -m hydra/sweeper=optuna hydra.sweeper.n_trials=8 model=llama3_1_8b hardware=h100_80gb "
    "memory=hicache job.trace=conversation parallel.dp_size=8 'memory.hicache_ratio=interval(1,8)' "
    "'memory.radix_eviction_policy=choice(lru,lfu,ghost_lru)'":
        Expect(files=("multirun/*/*/optimization_results.yaml", "multirun/*/*/best_config.yaml",
                      "multirun/*/*/7/metrics.json")),
    "sglang-hydra job=replay model=llama3_1_8b hardware=h100_80gb job.trace=conversation schedule.page_size=512 "
    "schedule.max_total_tokens=2048000 memory.radix_eviction_policy=ghost_lru job.format=json":
        Expect(stdout=(r'"schema_version": 3', r'"token_hit_rate"', r'"ttft_p90_ms"', r'"tpot_p90_ms"'),
               files=("outputs/*/*/metrics.json",)),
    "sglang-hydra -m job=replay model=llama3_1_8b hardware=h100_80gb memory.radix_eviction_policy=lru,lfu,slru,ghost_lru "
    "schedule.max_total_tokens=2048000,8192000 schedule.page_size=512":
        Expect(files=("multirun/*/*/summary.csv", "multirun/*/*/summary.png", "multirun/*/*/failed.csv",
                      "multirun/*/*/7/metrics.json")),
    "sglang-hydra job=replay memory=hicache job.mode=full job.max_requests=100 model=tiny "
    "schedule.max_total_tokens=65536 schedule.page_size=16 model.context_length=131072 hardware=h100_80gb "
    "hardware.host_memory_gb=16":
        Expect(stdout=(r"TTFT P50 / P90 / P99",), files=("outputs/*/*/metrics.json",)),
    # job=estimate: one static batch
    "sglang-hydra job=estimate model=llama3_1_8b hardware=h100_80gb parallel.tp_size=2 job.isl=4096 job.osl=512 "
    "job.batch_size=64 job.prefix=1024":
        Expect(stdout=(r"(?m)^  ttft_ms +\d+\.\d+", r"(?m)^  tpot_ms +\d+\.\d+", r"(?m)^  tokens_per_s_per_gpu +\d",
                       r"memory per GPU: weights .* fits")),
    "sglang-hydra job=estimate model=llama3_1_70b hardware=h200_141gb --tp 8 job.isl=8192 job.osl=256 "
    "job.format=json":
        Expect(stdout=(r'"ttft_ms": \d', r'"tpot_ms": \d', r'"tokens_per_s_per_user": \d', r'"fits": true')),
    "sglang-hydra -m job=estimate model=qwen3_32b hardware=h100_80gb parallel.tp_size=1,2,4 "
    "job.batch_size=1,16,64,256":
        Expect(files=("multirun/*/*/summary.csv", "multirun/*/*/11/metrics.json")),
    # job=deploy_search and launching what it recommends (the launch reads the search's output)
    "sglang-hydra job=deploy_search model=llama3_1_8b hardware=h100_80gb deploy.total_gpus=8 "
    "job.trace=conversation job.sla.ttft_ms=2000 job.sla.tpot_ms=50 job.output_dir=outputs/search8":
        Expect(files=("outputs/search8/summary.csv", "outputs/search8/pareto.png",
                      "outputs/search8/best_deploy.yaml", "outputs/search8/deploy_search.json")),
    "sglang-hydra --config outputs/search8/best_deploy.yaml job=launch job.dry_run=true":
        Expect(stdout=(r"sglang\.launch_server .*--model-path meta-llama/Meta-Llama-3\.1-8B",)),
    "sglang-hydra -m job=replay model=llama3_1_8b hardware=h100_80gb deploy.workers=4 "
    "deploy.router_policy=round_robin,cache_aware":
        Expect(stdout=(r"sweep summary: 2 points",),
               files=("multirun/*/*/summary.csv", "multirun/*/*/best_config.yaml", "multirun/*/*/1/metrics.json")),
}


def _key(cmd: str) -> str:
    return " ".join(_strip_comment(cmd).split())


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


# Commands that launch a real SGLang server: they need the engine's interpreter
# ($SGLANG_HYDRA_REFERENCE_PYTHON), so they run with the reference tests (.ci/run sets it there).
REFERENCE_PATTERNS = (r"job=validate",)


def _param(cmd: str):
    marks = [pytest.mark.slow] if any(re.search(p, cmd) for p in SLOW_PATTERNS) else []
    if any(re.search(p, cmd) for p in REFERENCE_PATTERNS):
        marks.append(pytest.mark.reference)
    return pytest.param(cmd, marks=marks, id=_strip_comment(cmd)[:80])


def test_only_the_setup_commands_are_skipped():
    skipped = [c for c in COMMANDS if c in SETUP_COMMANDS]
    assert skipped == list(SETUP_COMMANDS), "README's set-up commands changed; update SETUP_COMMANDS"
    assert COMMANDS[:2] == list(SETUP_COMMANDS)          # ... and they are the two at the top
    assert len(RUNNABLE) >= 10                           # the tour and the jobs are all found


def test_every_expectation_belongs_to_a_readme_command():
    stale = sorted(set(EXPECTATIONS) - {_key(c) for c in RUNNABLE})
    assert not stale, f"EXPECTATIONS has entries for commands README.md no longer has: {stale}"


def test_expectations_are_checked_against_the_output():
    """The checker itself: a missing figure or file is reported, a present one is not."""
    e = Expect(stdout=(r"ok=\d+",), files=("*.json",))
    assert _unmet(e, "ok=3", [Path("x.json")]) == []
    assert len(_unmet(e, "nothing", [])) == 2


def _unmet(e: Expect, stdout: str, written) -> list:
    problems = [f"stdout does not match {rx!r}" for rx in e.stdout if not re.search(rx, stdout)]
    problems += [f"no file matching {g!r} was written" for g in e.files
                 if not any(Path(w).match(g) or Path(w).match("*/" + g) for w in written)]
    return problems


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
    expect = EXPECTATIONS.get(_key(command))
    assert expect is not None, (
        f"README command {_key(command)!r} has no entry in EXPECTATIONS (tests/e2e/test_readme.py): add one "
        "saying what it is for (a regex its stdout must match and/or the files it writes)")
    started = time.time() - 1.0
    r = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=repo_copy, capture_output=True, text=True,
                       timeout=COMMAND_TIMEOUT_S, env=env)
    assert r.returncode in expect.returncodes, f"{command}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr
    written = [p.relative_to(repo_copy) for p in repo_copy.rglob("*")
               if p.is_file() and p.stat().st_mtime >= started and ".hydra" not in p.parts]
    problems = _unmet(expect, r.stdout, written)
    assert not problems, f"{command}\n" + "\n".join(problems) + f"\n--- stdout\n{r.stdout[-3000:]}"
