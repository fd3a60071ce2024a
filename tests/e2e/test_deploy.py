"""deploy=pd through the real command line: job=resolve output and configuration errors."""
import json
import os
import subprocess
import sys

import pytest
import yaml


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))


def test_pd_resolve_prints_both_records_and_the_router(tmp_path):
    r = run("deploy=pd", "model=llama3_8b", "prefill.parallel.tp_size=4", "decode.memory.hicache_ratio=3",
            "job=resolve", f"job.output={tmp_path}/dep.yaml", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = yaml.safe_load(r.stdout)
    assert list(data) == ["deploy", "prefill", "decode", "router"] and data["deploy"] == "pd"
    assert data["prefill"]["tp_size"] == 4 and data["decode"]["tp_size"] == 1
    assert data["decode"]["hicache_ratio"] == 3.0 and data["prefill"]["hicache_ratio"] == 2.0
    assert data["prefill"]["model_path"] == data["decode"]["model_path"] == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert (data["prefill"]["port"], data["decode"]["port"]) == (30000, 30001)
    assert data["router"]["url"] == "http://127.0.0.1:8000"
    assert yaml.safe_load((tmp_path / "dep.yaml").read_text()) == data
    # a deprecated shared flag is one warning, not one per side
    dep = run("deploy=pd", "--tp", "2", "--dp", "2", "--enable-dp-attention", "--device", "cuda", "job=resolve",
              "job.format=argv", cwd=tmp_path)
    assert dep.returncode == 0, dep.stderr
    assert dep.stderr.count("--enable-dp-attention (command line) is deprecated") == 1
    # each side's notes say whose they are, once each
    assert r.stderr.count("decode: memory.disable_radix_cache: False -> True (D-PD)") == 1
    assert "prefill: memory.disable_radix_cache" not in r.stderr

    r = run("deploy=pd", "job=resolve", "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["prefill"]["disaggregation_mode"] == "prefill" and data["decode"]["disaggregation_mode"] == "decode"

    r = run("deploy=pd", "prefill.parallel.tp_size=2", "job=resolve", "job.format=argv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "prefill: --model-path tiny --tp-size 2 --disaggregation-mode prefill",   # record (reference) order
        "decode: --model-path tiny --base-gpu-id 2 --port 30001 --disaggregation-mode decode",   # after prefill's 2 GPUs
        "router: --pd-disaggregation --prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30001 "
        "--host 127.0.0.1 --port 8000 --prometheus-host 127.0.0.1 --prometheus-port 29000",
    ]


def test_pd_from_a_config_file_with_side_sections(tmp_path):
    (tmp_path / "server.yaml").write_text(
        "deploy: pd\nmodel: {model_path: meta-llama/Llama-3.1-8B-Instruct}\nschedule: {page_size: 16}\n"
        "prefill:\n  parallel: {tp_size: 2}\ndecode:\n  serving: {port: 31000}\n")
    r = run("--config", "server.yaml", "job=resolve", "job.format=argv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == ("prefill: --model-path meta-llama/Llama-3.1-8B-Instruct --page-size 16 "
                        "--tp-size 2 --disaggregation-mode prefill")
    assert lines[1].endswith("--page-size 16 --base-gpu-id 2 --port 31000 --disaggregation-mode decode")
    assert "--decode http://127.0.0.1:31000" in lines[2]


def test_pd_configuration_errors_exit_2_with_every_problem(tmp_path):
    r = run("deploy=pd", "prefill.serving.port=31000", "decode.serving.port=31000",
            "decode.schedule.page_size=64", "prefill.memory.hicache_ratio=x", "job=resolve", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert "prefill.memory.hicache_ratio (--hicache-ratio): 'x' is not a number" in r.stderr
    # one run says everything it can: the clash and the disagreement come with the bad value
    assert "decode.serving.port (--port): port 31000 is also prefill.serving.port (--port)" in r.stderr
    assert "schedule.page_size (--page-size): prefill has 1 but decode has 64" in r.stderr
    r = run("deploy=pd", "prefill.serving.port=31000", "decode.serving.port=31000",
            "decode.schedule.page_size=64", "job=resolve", cwd=tmp_path)
    assert r.returncode == 2
    assert "decode.serving.port (--port): port 31000 is also prefill.serving.port (--port)" in r.stderr
    assert "copied to both sides" not in r.stderr
    r = run("deploy=pd", "decode.schedule.page_size=64", "job=resolve", cwd=tmp_path)
    assert r.returncode == 2
    assert "schedule.page_size (--page-size): prefill has 1 but decode has 64" in r.stderr
    r = run("deploy=pd", "job=setup", cwd=tmp_path)
    assert r.returncode == 2 and "job=setup works on one record" in r.stderr


def test_deploy_single_is_the_ordinary_record(tmp_path):
    a = run("deploy=single", "schedule.page_size=16", "job=resolve", cwd=tmp_path)
    b = run("schedule.page_size=16", "job=resolve", cwd=tmp_path)
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout


# ---------------------------------------------------------------- job.check=engine on both sides
REFERENCE_PYTHON = os.environ.get("SGLANG_HYDRA_REFERENCE_PYTHON")


def _engine_rejecting_decode(tmp_path) -> str:
    """An interpreter that answers like engine_probe.py: it accepts prefill and rejects decode,
    naming a field, so each side's verdict can be told apart without SGLang."""
    import stat
    script = tmp_path / "fake_python"
    script.write_text(
        f"#!{sys.executable}\nimport sys, json\nreq = json.loads(sys.stdin.read())\nargv = req['argv']\n"
        "mode = argv[argv.index('--disaggregation-mode') + 1]\n"
        "verdict = {'ok': True, 'error': ''} if mode == 'prefill' else "
        "{'ok': False, 'error': 'ValueError: --max-running-requests must be larger on decode'}\n"
        "print(json.dumps({'installed': True, 'version': '9.9', 'schema': None, 'verdict': verdict}))\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_pd_check_engine_without_sglang_is_one_clear_error(tmp_path):
    r = run("deploy=pd", "decode.parallel.tp_size=2", "job=resolve", "job.check=engine",
            f"job.python={sys.executable}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "AttributeError" not in r.stderr and r.stdout == ""
    assert r.stderr.count(f"job.check: SGLang is not installed in {sys.executable}") == 1


def test_pd_check_engine_keys_each_sides_verdict_by_role(tmp_path):
    r = run("deploy=pd", "job=resolve", "job.check=engine", f"job.python={_engine_rejecting_decode(tmp_path)}",
            cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert ("decode.schedule.max_running_requests (--max-running-requests): SGLang 9.9 rejects this configuration"
            in r.stderr)
    assert "prefill.schedule" not in r.stderr
    assert "check=engine: prefill: SGLang 9.9 accepts this configuration" in r.stderr


@pytest.mark.reference
@pytest.mark.skipif(not REFERENCE_PYTHON, reason="set SGLANG_HYDRA_REFERENCE_PYTHON to a venv with sglang 0.5.23")
def test_pd_check_engine_with_the_real_engine(tmp_path):
    r = run("deploy=pd", "decode.parallel.tp_size=2", "job=resolve", "job.check=engine", "job.format=argv",
            f"job.python={REFERENCE_PYTHON}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].startswith("decode: --model-path tiny --tp-size 2")
    for role in ("prefill", "decode"):
        assert f"check=engine: {role}: SGLang 0.5.23 accepts this configuration" in r.stderr
    r = run("deploy=pd", "--page-size", "16", "--attention-backend", "torch_native",
            "decode.spec.speculative_algorithm=EAGLE", "decode.spec.speculative_eagle_topk=4",
            "decode.spec.speculative_num_draft_tokens=8", "job=resolve", "job.check=engine",
            f"job.python={REFERENCE_PYTHON}", cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "check=engine: prefill: SGLang 0.5.23 accepts this configuration" in r.stderr
    assert "  - decode" in r.stderr and "SGLang 0.5.23 rejects this configuration" in r.stderr


def test_pd_with_attention_dp_lays_decode_past_prefills_derived_ports(tmp_path):
    r = run("deploy=pd", "--device", "cuda", "--tp", "2", "--dp", "2", "--enable-dp-attention", "job=resolve",
            "job.format=argv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    decode = r.stdout.splitlines()[1].split()
    port = int(decode[decode.index("--port") + 1])
    assert port + 233 > 30000 + 239         # SGLang binds --port + 233 .. + 239 on each side under attention DP
    r = run("deploy=pd", "--nccl-port", "5000", "job=resolve", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "decode.parallel.nccl_port (--nccl-port): port 5000 is also prefill.parallel.nccl_port" in r.stderr


def test_flag_values_that_look_like_deployment_keys_stay_values(tmp_path):
    r = run("--chat-template", "decode.jinja", "job=resolve", "job.format=argv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "--model-path tiny --chat-template decode.jinja"
    # `key=value` after a valued flag whose key is a config group is read as that override (so a
    # forgotten value is reported, not swallowed); `--flag=value` keeps such a value literal.
    r = run("--served-model-name", "deploy=x", "job=resolve", "job.format=argv", cwd=tmp_path)
    assert r.returncode == 2 and "--served-model-name" in r.stderr and "expects a value" in r.stderr
    r = run("--served-model-name=deploy=x", "job=resolve", "job.format=argv", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "--model-path tiny --served-model-name=deploy=x"     # and exported so


def test_pd_records_show_settings_only(tmp_path):
    for fmt in ("yaml", "json"):
        r = run("deploy=pd", "job=resolve", f"job.format={fmt}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        data = yaml.safe_load(r.stdout)           # JSON is YAML too
        for role in ("prefill", "decode"):
            assert not [k for k in data[role] if k.startswith("_")], fmt


def test_pd_messages_name_what_to_change(tmp_path):
    r = run("deploy=pd", "decode.parallel.tp_sise=2", "job=resolve", cwd=tmp_path)
    assert r.returncode == 2 and "did you mean 'decode.parallel.tp_size'?" in r.stderr
    r = run("deploy=pd,single", "job=resolve", cwd=tmp_path)
    assert r.returncode == 2 and "ChoiceSweep" not in r.stderr
    assert "deploy: 'deploy=pd,single' lists several values: add -m" in r.stderr
    r = run("deploy=pd", "--info", "job=resolve", cwd=tmp_path)
    assert r.returncode == 2 and "  - deploy: " in r.stderr and "  - config: " not in r.stderr


def test_an_output_path_that_is_a_directory_is_a_config_error(tmp_path):
    for argv in (("job=resolve",), ("deploy=pd", "job=resolve")):
        r = run(*argv, f"job.output={tmp_path}", cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        assert f"job.output: '{tmp_path}' is a directory" in r.stderr
        assert "IsADirectoryError" not in r.stderr and r.stdout == ""


def test_help_answers_with_a_deployment_on_the_line(tmp_path):
    r = run("deploy=pd", "decode.parallel.tp_size=2", "job=launch", "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "== Config groups ==" in r.stdout and "Hydra's runtime" not in r.stderr
