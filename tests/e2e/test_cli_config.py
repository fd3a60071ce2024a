"""The real command line, in subprocesses."""
import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args, cwd=None, timeout=120, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=e)


def test_resolve_formats(tmp_path):
    r = run("--enable-hierarchical-cache", "--hicache-ratio", "3", "--disaggregation-mode", "prefill",
            "job=resolve", "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["hicache_ratio"] == 3.0 and rec["disaggregation_mode"] == "prefill"
    # Record order is the reference's positional order (all 546 fields, then the KV geometry).
    assert list(rec)[:3] == ["model_path", "tokenizer_path", "tokenizer_mode"]
    mem = [k for k in rec if k.startswith(("radix_eviction_policy", "hicache_ratio"))]
    assert mem[:3] == ["radix_eviction_policy", "radix_eviction_policy_config", "hicache_ratio"]
    r = run("memory=hicache", "memory.hicache_ratio=3", "job=resolve", "job.format=argv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["--model-path", "tiny", "--enable-hierarchical-cache", "--hicache-ratio", "3.0"]
    r = run("job=resolve", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("model_path: tiny\n")
    assert not (tmp_path / "outputs").exists()  # a plain resolve writes nothing


def test_argv_round_trips_through_the_legacy_parser(tmp_path):
    r = run("--enable-hicache", "--radix-eviction-policy", "tlru",
            "--radix-eviction-policy-config", '{"threshold": 100, "next_prompt_estimate": 10}',
            "--encoder-urls", "http://a", "http://b", "job=resolve", "job.format=argv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    import shlex
    from sglang_hydra import compose_record
    again = compose_record(argv=shlex.split(r.stdout))
    assert again.radix_eviction_policy_config == {"threshold": 100, "next_prompt_estimate": 10}
    assert again.encoder_urls == ["http://a", "http://b"] and again.enable_hierarchical_cache


def test_bad_input_exits_2_with_every_problem_and_no_traceback(tmp_path):
    out = tmp_path / "rec.yaml"
    r = run("--hicache-ratio", "abc", "memory.nope=1", "--radix-eviction-policy", "fifo", "disagg=prefil",
            "job=resolve", f"job.output={out}", cwd=tmp_path)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    for text in ("memory.hicache_ratio (--hicache-ratio)", "invalid choice: 'fifo'", "memory.nope"):
        assert text in r.stderr
    assert "4 configuration problems" in r.stderr
    assert not out.exists()
    r = run("--enable-hicache", "--disable-radix-cache", "--hicache-host-memory-fraction", "2", "job=resolve", cwd=tmp_path)
    assert r.returncode == 2 and "memory.enable_hierarchical_cache" in r.stderr
    assert "memory.hicache_host_memory_fraction" in r.stderr  # rule problems are reported together too


def test_multirun_writes_one_output_per_job(tmp_path):
    r = run("-m", "memory.radix_eviction_policy=lru,slru", "--hicache-ratio", "3", "job=resolve",
            f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path, timeout=180)
    assert r.returncode == 0, r.stderr
    outs = sorted((tmp_path / "sweep").glob("*/record.yaml"))
    assert len(outs) == 2
    import yaml
    pols = [yaml.safe_load(p.read_text())["radix_eviction_policy"] for p in outs]
    assert pols == ["lru", "slru"]
    assert all(yaml.safe_load(p.read_text())["hicache_ratio"] == 3.0 for p in outs)


def test_hydra_flags(tmp_path):
    r = run("--cfg", "job", "memory=hicache", "--hicache-ratio", "5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "hicache_ratio: 5.0" in r.stdout and "enable_hierarchical_cache: true" in r.stdout
    r = run("--help", cwd=tmp_path)
    assert r.returncode == 0
    assert "memory.hicache_ratio=None  [--hicache-ratio]" in r.stdout
    assert "disagg.disaggregation_mode='null'  [--disaggregation-mode]" in r.stdout
    assert "deploy: pd, single" in r.stdout and "job: calibrate, deploy_search, estimate, launch, pd, pd_pair" in r.stdout
    # The page is printed without Hydra (which took ~10 s over it), whatever else is on the line.
    for extra in (["deploy=pd", "job=launch"], ["-m", "parallel.tp_size=1,2"], ["-h"]):
        again = run(*extra, "--help", cwd=tmp_path)
        assert again.returncode == 0 and again.stdout == r.stdout, (extra, again.stderr)
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()
    r = run("--info", "defaults", cwd=tmp_path)
    # Namespaces with nothing to set select no preset (null): Hydra loads nothing for them.
    assert r.returncode == 0 and "model/tiny" in r.stdout and "memory/" not in r.stdout, r.stdout
    r = run("--info", "defaults", "memory=hicache", "schedule=default", cwd=tmp_path)
    assert r.returncode == 0 and "memory/hicache" in r.stdout and "schedule/default" in r.stdout, r.stdout


@pytest.mark.slow
def test_wheel_ships_conf_and_runs_elsewhere(tmp_path):
    """Build the wheel, install it into a fresh venv (dependencies borrowed read-only) and run it."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("sglang_hydra-*.whl")
    import zipfile
    names = zipfile.ZipFile(wheel).namelist()
    assert "sglang_hydra/conf/config.yaml" in names and "sglang_hydra/conf/memory/hicache.yaml" in names
    for data in ("conversation_trace.jsonl", "conversation_sample.jsonl", "NOTICE", "README.md"):
        assert f"sglang_hydra/workload/data/{data}" in names   # the traces and their license note ship
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    import sysconfig
    deps = sysconfig.get_paths()["purelib"]
    py = env_dir / "bin" / "python"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import sys; sys.path[:0] = [%r, %r]; import sglang_hydra, sglang_hydra.cli as c; "
            "assert sglang_hydra.__file__.startswith(%r), sglang_hydra.__file__; sys.exit(c.main(['job=resolve', 'memory=hicache']))"
            % (str(target), deps, str(target)))
    r = subprocess.run([str(py), "-c", code], cwd=elsewhere, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "enable_hierarchical_cache: true" in r.stdout


@pytest.mark.parametrize("line,expected", [
    ("sglang-hydra memory.hicache_r", {"memory.hicache_ratio="}),
    ("sglang-hydra memory=", {"memory=default", "memory=hicache", "memory=hicache_file"}),
    ("sglang-hydra disagg=de", {"disagg=decode"}),
    ("sglang-hydra memory=hicache memory.hicache_write_p", {"memory.hicache_write_policy="}),
])
def test_tab_completion_queries(tmp_path, line, expected):
    # What the bash script installed by `sglang-hydra -sc install=bash` asks on every <TAB>.
    r = run("-sc", "query=bash", cwd=tmp_path, env={"COMP_LINE": line, "COMP_POINT": str(len(line))})
    assert r.returncode == 0, r.stderr
    assert set(r.stdout.split()) == expected


def test_tab_completion_install_script(tmp_path):
    r = run("--shell-completion", "install=bash", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "hydra_bash_completion" in r.stdout and "complete -o nospace -o default -F hydra_bash_completion" in r.stdout


def test_tab_completion_in_bash(tmp_path):
    # The installed completion function, driven the way bash drives it on <TAB>.
    script = ('eval "$(sglang-hydra -sc install=bash)"; COMP_LINE="sglang-hydra memory=hi"; '
              'COMP_POINT=${#COMP_LINE}; COMP_WORDS=(sglang-hydra memory=hi); COMP_CWORD=1; '
              'hydra_bash_completion; echo "${COMPREPLY[@]}"')
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["memory=hicache", "memory=hicache_file"]


# Runs the CLI in a child process with Hydra's compose_config counted, so the test sees how
# many times a command composes without touching this process's Hydra state.
_COUNTING_CLI = """
import sys
from hydra._internal.hydra import Hydra
calls = []
compose = Hydra.compose_config
def counted(self, *a, **k):
    calls.append(k.get("run_mode"))
    return compose(self, *a, **k)
Hydra.compose_config = counted
from sglang_hydra.cli import main
code = main(sys.argv[1:])
print("COMPOSES", len(calls), file=sys.stderr)
sys.exit(code)
"""


def _counted(*args, cwd):
    r = subprocess.run([sys.executable, "-c", _COUNTING_CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("COMPOSES ")]
    return r, int(line[-1].split()[1]) if line else None


def test_a_hydra_setting_composes_once_and_still_runs_as_a_single_run(tmp_path):
    """A plain run with a hydra.* setting skips Hydra's compose that only reads hydra.mode."""
    r, n = _counted("--tp", "2", "memory=hicache", "job=resolve", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert n == 1
    hydra_yaml = (tmp_path / "run" / ".hydra" / "hydra.yaml").read_text()
    assert "\n  mode: RUN\n" in hydra_yaml
    assert "tp_size: 2" in (tmp_path / "run" / ".hydra" / "config.yaml").read_text()
    # A sweep skips the probe too (-m alone makes it a multirun); each point is still composed.
    r, n = _counted("-m", "job=resolve", "parallel.tp_size=1,2", f"hydra.sweep.dir={tmp_path}/m", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert n == 1 and "tp_size: 2" in (tmp_path / "m" / "1" / ".hydra" / "config.yaml").read_text()
    # Asking for the mode on the command line keeps Hydra's probe, and the probe is obeyed.
    r, n = _counted("job=resolve", "hydra.mode=MULTIRUN", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert n == 2 and (tmp_path / "sweep" / "0" / ".hydra" / "config.yaml").is_file()


def test_no_shipped_config_sets_hydra_mode():
    """The one-compose shortcut relies on conf/ never choosing the run mode itself."""
    from sglang_hydra.config.presets import conf_dir, yaml_load
    paths = sorted(conf_dir().rglob("*.yaml"))
    assert any(p.name == "config.yaml" for p in paths)
    for path in paths:
        data = yaml_load(path) or {}
        hydra = data.get("hydra") if isinstance(data, dict) else None
        assert not (isinstance(hydra, dict) and "mode" in hydra), path

