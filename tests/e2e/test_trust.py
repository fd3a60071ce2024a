"""What a person can rely on from the command line, through real subprocesses.

Exit status 2 and one line per problem (no traceback) for every configuration or input
problem on the direct path, the @hydra.main path and inside sweeps; 1 and one line for any
other failure; sweeps that run every good point; traceable output directories.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def run(*args, cwd, timeout=240, env=None):
    e = dict(os.environ, PYTHONUNBUFFERED="1")
    e.pop("SGLANG_HYDRA_TRACEBACK", None)
    e.pop("HYDRA_FULL_ERROR", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=e)


def assert_config_error(r, *texts):
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "Traceback" not in out and "HYDRA_FULL_ERROR" not in out, out
    assert "configuration problem" in r.stderr, r.stderr
    for t in texts:
        assert t in r.stderr, (t, r.stderr)


# --------------------------------------------------------------------------- 1. exit codes
# A host pool far larger than any machine: the setup job's own check fails (no allocation).
HUGE_HOST_POOL = ("job=setup", "memory=hicache", "model=tiny", "memory.hicache_size=100000",
                  "schedule.max_total_tokens=2048", "job.progress=false")
MHA_WITH_MLA_LAYOUT = ("job=setup", "memory=hicache", "model=tiny", "memory.hicache_mem_layout=page_first_kv_split",
                       "schedule.max_total_tokens=2048", "job.progress=false")


@pytest.mark.parametrize("args,texts", [
    (HUGE_HOST_POOL, ("memory.hicache_size (--hicache-size)", "not enough host memory", "100000")),
    (MHA_WITH_MLA_LAYOUT, ("memory.hicache_mem_layout (--hicache-mem-layout)", "'page_first_kv_split'",
                           "layer_first, page_first")),
], ids=["host-pool-too-big", "mla-layout-on-mha"])
@pytest.mark.parametrize("path", ["direct", "hydra.main"])
def test_a_config_error_inside_a_job_exits_2_on_both_paths(tmp_path, args, texts, path):
    extra = (f"hydra.run.dir={tmp_path}/run",) if path == "hydra.main" else ()
    r = run(*args, *extra, cwd=tmp_path)
    assert_config_error(r, *texts)
    assert r.stderr.count("configuration problem") == 1       # printed once, not again by Hydra
    if path == "hydra.main":
        err = json.loads((tmp_path / "run" / "error.json").read_text())
        assert err["exit_code"] == 2 and texts[0] in err["error"]
        assert "memory=hicache" in err["overrides"]


def test_hydra_composition_errors_exit_2(tmp_path):
    r = run("memory=nonexistent", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert_config_error(r, "no preset 'nonexistent' in group 'memory'", "default, hicache")
    r = run("hydra/launcher=nonexistent", "job=resolve", cwd=tmp_path)
    assert_config_error(r, "hydra/launcher/nonexistent")


def test_an_unexpected_error_is_one_line_and_exit_1_unless_the_traceback_is_asked_for(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    args = ("job=resolve", f"job.output={blocker}/record.yaml")
    for extra in ((), (f"hydra.run.dir={tmp_path}/run",)):
        r = run(*args, *extra, cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr and "HYDRA_FULL_ERROR" not in r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("sglang-hydra:")]
        assert len(lines) == 1 and "error:" in lines[0] and "SGLANG_HYDRA_TRACEBACK=1" in lines[0], r.stderr
    r = run(*args, cwd=tmp_path, env={"SGLANG_HYDRA_TRACEBACK": "1"})
    assert r.returncode == 1 and "Traceback" in r.stderr


# --------------------------------------------------------------------------- 2. sweeps keep going
@pytest.mark.parametrize("launcher", [(), ("hydra/launcher=joblib", "hydra.launcher.n_jobs=2")], ids=["basic", "joblib"])
def test_a_bad_sweep_point_does_not_lose_the_others(tmp_path, launcher):
    sweep = tmp_path / "sweep"
    r = run("-m", "--enable-hicache", "memory.hicache_host_memory_fraction=0.5,2,0.25", "job=resolve",
            f"hydra.sweep.dir={sweep}", *launcher, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert sorted(p.parent.name for p in sweep.glob("*/record.yaml")) == ["0", "2"]   # the good points ran
    err = json.loads((sweep / "1" / "error.json").read_text())
    assert err["exit_code"] == 2
    assert "memory.hicache_host_memory_fraction=2" in err["overrides"]
    assert "memory.hicache_host_memory_fraction (--hicache-host-memory-fraction)" in err["error"]
    assert not (sweep / "0" / "error.json").exists()
    assert "1 of 3 sweep jobs failed" in r.stderr and "job 1 [" in r.stderr and "error.json" in r.stderr


def test_a_sweep_with_an_unexpected_failure_exits_1_and_a_rerun_never_mixes_verdicts(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    sweep = tmp_path / "sweep"
    r = run("-m", f"job.output={tmp_path}/ok.yaml,{blocker}/no.yaml", "job=resolve",
            f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert json.loads((sweep / "1" / "error.json").read_text())["exit_code"] == 1
    assert "Traceback" not in r.stderr and "1 of 2 sweep jobs failed" in r.stderr
    # the rerun into the same directory is refused (its verdicts would mix with the first's) ...
    again = run("-m", f"job.output={tmp_path}/ok.yaml,{tmp_path}/ok2.yaml", "job=resolve",
                f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert again.returncode == 2 and "already holds a sweep" in again.stderr, again.stderr
    assert json.loads((sweep / "1" / "error.json").read_text())["exit_code"] == 1
    # ... and runs clean in a directory of its own
    r = run("-m", f"job.output={tmp_path}/ok.yaml,{tmp_path}/ok2.yaml", "job=resolve",
            f"hydra.sweep.dir={tmp_path}/rerun", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not list((tmp_path / "rerun").glob("*/error.json"))


def test_sweep_values_that_can_never_work_are_rejected_before_anything_runs(tmp_path):
    r = run("-m", "memory.hicache_ratio=2,abc", "memory=default,nosuch", "job=resolve",
            f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path)
    assert_config_error(r, "memory.hicache_ratio (--hicache-ratio): sweep value 'abc'", "no preset 'nosuch'")
    assert not (tmp_path / "sweep").exists()


def test_a_bad_environment_variable_is_a_config_error():
    from sglang_hydra.cli import _input_error
    from sglang_hydra.utils.envflags import EnvValueError
    err = _input_error(EnvValueError("SGLANG_X", "maybe", "a boolean"))
    assert err is not None and err.key == "SGLANG_X" and "'maybe'" in err.render()
    assert _input_error(RuntimeError("boom")) is None


def test_failed_return_value_is_nan_only_for_jobs_with_an_objective():
    from omegaconf import OmegaConf

    from sglang_hydra.jobs.failures import failed_return_value
    v = failed_return_value(OmegaConf.create({"job": {"name": "replay", "objective": "token_hit_rate"}}))
    assert v != v  # NaN: Optuna marks the trial failed and the study goes on
    assert failed_return_value(OmegaConf.create({"job": {"name": "replay"}})) is None


# --------------------------------------------------------------------------- 3. inputs
def test_trace_inputs_that_cannot_be_replayed_exit_2(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    r = run("job=replay", f"job.trace={empty}", cwd=tmp_path)
    assert_config_error(r, "job.trace", "empty.jsonl", "holds no requests")
    assert "0.00" not in r.stdout
    r = run("job=replay", f"job.trace={tmp_path}", cwd=tmp_path)
    assert_config_error(r, "is a directory", "conversation")
    r = run("job=replay", f"job.trace={tmp_path}/missing.jsonl", cwd=tmp_path)
    assert_config_error(r, "no such trace file")
    if os.geteuid() != 0:   # root reads any file
        locked = tmp_path / "locked.jsonl"
        locked.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n')
        locked.chmod(0)
        r = run("job=replay", f"job.trace={locked}", cwd=tmp_path)
        assert_config_error(r, "permission denied")


def test_config_file_yaml_errors_name_file_line_and_column(tmp_path):
    bad = tmp_path / "server.yaml"
    bad.write_text("memory:\n  hicache_ratio: 3\n bad: [\n")
    r = run("--config", str(bad), "job=resolve", cwd=tmp_path)
    assert_config_error(r, f"{bad}:3:2: not valid YAML")


def test_an_unparsable_override_gets_a_quoting_hint(tmp_path):
    r = run("job=resolve", 'memory.radix_eviction_policy_config={"a":1}', cwd=tmp_path)
    assert_config_error(r, "memory.radix_eviction_policy_config (--radix-eviction-policy-config)",
                        "cannot parse override", "single quotes around the whole override")
    # ... and the spelling the hint gives works
    r = run("job=resolve", "job.format=json", "--radix-eviction-policy", "tlru",
            'memory.radix_eviction_policy_config="{\\"threshold\\": 100}"', cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["radix_eviction_policy_config"] == {"threshold": 100}


# --------------------------------------------------------------------------- 4. outputs
def _replay_dirs_of_two_runs_at_once(args, cwd):
    """Start the same command twice at once; both must succeed. The run dirs holding a metrics.json."""
    procs = [subprocess.Popen([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for p in procs:
            _, err = p.communicate(timeout=240)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return sorted(p.parent for p in (cwd / "outputs").glob("*/*/metrics.json"))


def test_direct_runs_save_config_and_overrides_in_unique_dirs(tmp_path):
    args = ("job=replay", "hardware=h100_80gb", "job.max_requests=20", "job.format=json", "job.progress=false",
            "--hicache-ratio", "3")
    runs = _replay_dirs_of_two_runs_at_once(args, tmp_path)
    assert len(runs) == 2                                   # never one shared directory
    for d in runs:
        cfg = yaml.safe_load((d / ".hydra" / "config.yaml").read_text())
        assert cfg["memory"]["hicache_ratio"] == 3.0 and cfg["job"]["max_requests"] == 20
        assert "_radix_eviction_policy_explicitly_set" not in cfg["memory"]
        ovs = yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text())
        assert "memory.hicache_ratio=3.0" in ovs and "job.max_requests=20" in ovs   # as Hydra would get them


def test_hydra_run_dirs_are_unique_per_run(tmp_path):
    cfg = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())["hydra"]
    assert "%f" in cfg["run"]["dir"] and "%f" in cfg["sweep"]["dir"]
    args = ("job=replay", "hardware=h100_80gb", "job.max_requests=20", "job.progress=false", "hydra.job.chdir=false")
    runs = _replay_dirs_of_two_runs_at_once(args, tmp_path)
    assert len(runs) == 2
    assert all((d / ".hydra" / "config.yaml").is_file() and (d / ".hydra" / "overrides.yaml").is_file() for d in runs)


def test_help_lists_job_keys_and_config_file_and_version(tmp_path):
    r = run("--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from sglang_hydra.jobs.specs import JOB_SPECS
    import dataclasses
    for name, spec in JOB_SPECS.items():
        assert f"job={name}:" in r.stdout
        for f in dataclasses.fields(spec.config_cls):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):          # a group (job.sla.*): each of its keys
                for sub in dataclasses.fields(default):
                    assert f"  job.{f.name}.{sub.name}=" in r.stdout, (name, f.name, sub.name)
            elif f.name != "name":
                assert f"  job.{f.name}=" in r.stdout, (name, f.name)
    words = " ".join(r.stdout.split())
    assert "Choices: fail, skip." in words and "job.trace=None" in r.stdout
    assert "--config FILE" in r.stdout and "docs/examples/server.yaml" in r.stdout and "Precedence" in r.stdout
    assert "explicitly_set" not in r.stdout
    r = run("--version", cwd=tmp_path)
    from sglang_hydra import __version__
    assert r.returncode == 0 and r.stdout.startswith(f"sglang-hydra {__version__}")


def test_the_example_config_file_works(tmp_path):
    r = run("--config", str(ROOT / "docs" / "examples" / "server.yaml"), "job=resolve", "job.format=json",
            "schedule.page_size=32", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["enable_hierarchical_cache"] and rec["hicache_ratio"] == 3.0
    assert rec["radix_eviction_policy"] == "slru" and rec["max_total_tokens"] == 65536
    assert rec["page_size"] == 32                           # the command line wins over the file
    assert not any(k.startswith("_") for k in rec)          # internal fields are not shown
    # the same file launches (the issue's `--config server.yaml job=launch`), here as a dry run
    r = run("--config", str(ROOT / "docs" / "examples" / "server.yaml"), "job=launch", "job.dry_run=true",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    server = r.stdout.splitlines()[1].split()
    assert server[1:3] == ["-m", "sglang.launch_server"]
    assert "--hicache-ratio" in server and server[server.index("--hicache-ratio") + 1] == "3.0"
    assert server[server.index("--page-size") + 1] == "16"


def test_problem_lines_explain_rule_codes(tmp_path):
    r = run("--enable-hicache", "--disable-radix-cache", "job=resolve", cwd=tmp_path)
    assert_config_error(r, "[M-CC: cache features that cannot be combined]")
    from sglang_hydra.config.errors import SOURCE_TITLES
    from sglang_hydra.config.resolve import RULES, _load_rules
    _load_rules()
    assert all(SOURCE_TITLES.get(rl.rule_id) for rl in RULES)


# --------------------------------------------------------------------------- 5. the packaged trace
def test_the_conversation_trace_ships_and_loads_by_name_and_path(tmp_path):
    from sglang_hydra.workload.trace import load_trace, trace_path
    p = trace_path("conversation")
    assert p.is_file() and "sglang_hydra" in str(p)
    assert (p.parent / "NOTICE").is_file() and "Apache" in (p.parent / "README.md").read_text()
    assert len(load_trace("conversation", max_requests=5)) == 5
    r = run("job=replay", "hardware=h100_80gb", "job.trace=conversation", "job.max_requests=1500", "job.format=json",
            "job.progress=false", "schedule.page_size=512", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["requests"]["requests_total"] == 1500   # more than the 1,000-line sample
    r = run("job=replay", "hardware=h100_80gb", f"job.trace={p}", "job.max_requests=10", "job.format=json",
            "job.progress=false", cwd=tmp_path)
    assert r.returncode == 0 and json.loads(r.stdout)["requests"]["requests_total"] == 10


def test_hydra_path_stdout_is_the_jobs_output_and_the_log_file_keeps_the_details(tmp_path):
    r = run("job=resolve", "job.format=json", "memory=hicache", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["enable_hierarchical_cache"] is True      # no log lines mixed in
    log = (tmp_path / "run" / "sglang_hydra.log").read_text()
    assert "memory.hicache_ratio: None -> 2.0 (M-HR)" in log and "explicitly_set" not in log
    saved = tmp_path / "run" / ".hydra"
    assert (saved / "config.yaml").is_file() and "memory=hicache" in (saved / "overrides.yaml").read_text()


def test_empty_model_path_and_preset_less_groups_are_explained(tmp_path):
    r = run("--model-path", "", "job=resolve", cwd=tmp_path)
    assert_config_error(r, "model.model_path (--model-path): is empty; give a Hugging Face id")
    r = run("lora=default", "job=resolve", cwd=tmp_path)
    assert_config_error(r, "group 'lora' has no presets to select ('default' given); set its fields instead")
