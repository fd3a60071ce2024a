"""job=launch end to end: the real CLI supervising stand-in servers (and the real sglang-router)."""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from sglang_hydra.utils.ports import port_is_free

from .conftest import STANDIN, pid_alive, router_installed

TIMEOUT = 120


def cli(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=TIMEOUT, env=dict(os.environ, **(env or {})))


def _all_gone(run):
    pids = run.standin_pids()
    assert pids, "no stand-in started"
    return not any(pid_alive(p) for p in pids)


def test_dry_run_prints_every_command_and_starts_nothing(tmp_path):
    # device.device=cuda: the lines a GPU machine runs (tests/launch/test_cpu_engine.py has the CPU's)
    r = cli("deploy=pd", "model=llama3_8b", "prefill.parallel.tp_size=4", "job=launch", "job.dry_run=true",
            "job.python=/opt/sglang/bin/python", "device.device=cuda", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "# prefill (health: http://127.0.0.1:30000/health)"
    assert lines[1] == ("/opt/sglang/bin/python -m sglang.launch_server --model-path meta-llama/Meta-Llama-3-8B-Instruct "
                        "--tp-size 4 --device cuda --disaggregation-mode prefill")
    assert lines[3].endswith("--device cuda --base-gpu-id 4 --port 30001 --disaggregation-mode decode")
    assert lines[4] == "# router (health: http://127.0.0.1:8000/health)"
    assert lines[5].startswith("/opt/sglang/bin/python -m sglang_router.launch_router --pd-disaggregation "
                               "--prefill http://127.0.0.1:30000 8998 --decode http://127.0.0.1:30001")
    assert len(lines) == 6
    r = cli("schedule.page_size=16", "job=launch", "job.dry_run=true", "device.device=cuda", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1] == (f"{sys.executable} -m sglang.launch_server --model-path tiny --page-size 16 "
                                        f"--device cuda")
    assert not (tmp_path / "outputs").exists()


def test_single_server_healthy_then_sigterm_is_forwarded(launch, ports, tmp_path):
    (port,) = ports(1)
    (tmp_path / "server.yaml").write_text(f"port: {port}\nschedule: {{page_size: 16}}\n")
    run = launch(["--config", str(tmp_path / "server.yaml"), *STANDIN])
    run.wait_for_output("[launch] ready:")
    assert "[server] standin server (healthy) listening on 127.0.0.1:" in run.stdout
    (start,) = [e for e in run.events("server") if e["event"] == "start"]
    assert start["argv"] == ["--model-path", "tiny", "--page-size", "16", "--port", str(port)]
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(TIMEOUT) == 128 + signal.SIGTERM
    assert [e["event"] for e in run.events("server")][-2:] == ["signal", "exit"]
    assert run.events("server")[-2]["signum"] == signal.SIGTERM
    assert _all_gone(run)
    assert "SIGTERM received; stopping server" in run.stderr


def test_one_child_crashing_stops_the_others_with_its_status(launch, ports, tmp_path):
    p, d, b, r, m = ports(5)
    run = launch(["deploy=pd", f"prefill.serving.port={p}", f"decode.serving.port={d}",
                  f"disagg.disaggregation_bootstrap_port={b}", f"deploy.router_port={r}",
                  f"deploy.router_prometheus_port={m}", *STANDIN, "job.router_module=standin_server"],
                 modes="decode=crash",
                 extra_env={"STANDIN_CRASH_CODE": "7", "STANDIN_CRASH_FILE": str(tmp_path / "crash-now")})
    run.wait_for_output("[launch] ready:")                     # all three up, then decode dies
    (tmp_path / "crash-now").touch()
    assert run.wait(TIMEOUT) == 7, run.stdout + run.stderr
    assert "decode exited with status 7; stopping" in run.stderr
    assert run.events("decode")[-1] == {"event": "crash", "code": 7}
    assert run.events("prefill")[-2:] == [{"event": "signal", "signum": signal.SIGTERM}, {"event": "exit", "code": 0}]
    assert run.events("server")[-1]["event"] == "exit"         # the (stand-in) router was stopped too
    assert _all_gone(run)


def test_a_server_that_never_gets_healthy_times_out(launch, ports):
    (port,) = ports(1)
    run = launch([f"serving.port={port}", *STANDIN, "job.health_timeout=2"], modes="server=hang")
    assert run.wait(TIMEOUT) == 1
    assert f"not healthy after 2 s: server (http://127.0.0.1:{port}/health)" in run.stderr
    assert "job.health_timeout" in run.stderr
    assert run.events("server")[-1]["event"] == "exit"
    assert _all_gone(run)


def test_a_child_that_ignores_sigterm_is_killed(launch, ports):
    (port,) = ports(1)
    run = launch([f"serving.port={port}", *STANDIN, "job.stop_timeout=1"], modes="server=stubborn")
    run.wait_for_output("[launch] ready:")
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(TIMEOUT) == 128 + signal.SIGINT
    assert "server did not stop within 1 s; killing it" in run.stderr
    assert _all_gone(run)


@pytest.mark.skipif(not router_installed(), reason="needs sglang-router (pip install 'sglang-hydra[router]')")
def test_pd_behind_the_real_router_serves_a_request(launch, ports):
    p, d, b, r, m = ports(5)
    run = launch(["deploy=pd", f"prefill.serving.port={p}", f"decode.serving.port={d}",
                  f"prefill.disagg.disaggregation_bootstrap_port={b}", f"deploy.router_port={r}",
                  f"deploy.router_prometheus_port={m}", "deploy.router_policy=random", *STANDIN],
                 modes="decode=slow", extra_env={"STANDIN_SLOW_S": "1.0"})
    run.wait_for_output("[launch] ready:", timeout=TIMEOUT)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(f"http://127.0.0.1:{r}/generate", method="POST",
                                 data=json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 1}}).encode(),
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=60) as resp:
        assert json.loads(resp.read())["role"] == "decode"
    (pre,) = [e for e in run.events("prefill") if e["event"] == "request"]
    (dec,) = [e for e in run.events("decode") if e["event"] == "request"]
    assert pre["body"]["text"] == dec["body"]["text"] == "hello"
    assert pre["body"]["bootstrap_port"] == dec["body"]["bootstrap_port"] == b      # the router told both sides
    assert pre["body"]["bootstrap_room"] == dec["body"]["bootstrap_room"]
    assert "[router] " in run.stdout and "[prefill] " in run.stdout and "[decode] " in run.stdout
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(TIMEOUT) == 128 + signal.SIGTERM
    assert _all_gone(run)
    assert port_is_free(r) and port_is_free(m)                 # the router is gone too


def test_missing_sglang_or_router_is_a_config_error(tmp_path):
    if importlib.util.find_spec("sglang") is None:
        r = cli("job=launch", cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert "job.python" in r.stderr and "cannot import 'sglang'" in r.stderr and "pip install sglang" in r.stderr
        assert "Traceback" not in r.stderr
    r = cli("job=launch", "job.python=/no/such/python", cwd=tmp_path)
    assert r.returncode == 2 and "'/no/such/python' is not an executable Python interpreter" in r.stderr
    env = {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    r = cli("deploy=pd", "job=launch", *STANDIN, "job.router_module=no_such_router.launch", cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "cannot import 'no_such_router'" in r.stderr and "sglang-router==0.3.2" in r.stderr
    assert "job.router_python: " in r.stderr and "set job.router_python=" in r.stderr


def test_launching_a_test_geometry_is_refused_before_anything_starts(tmp_path):
    """`tiny` is a geometry for tests, not a checkpoint: a real launch would only fail later."""
    fake = tmp_path / "fake" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text("raise SystemExit('must not start')\n")
    env = {"PYTHONPATH": str(tmp_path / "fake")}
    r = cli("job=launch", "job.dry_run=true", cwd=tmp_path, env=env)     # a dry run prints and notes it
    assert r.returncode == 0 and "note: model.model_path: server: 'tiny' is a built-in test geometry" in r.stderr
    r = cli("job=launch", cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "server: 'tiny' is a built-in test geometry with no checkpoint" in r.stderr
    assert "model=deepseek_v3|llama3_1_70b|llama3_1_8b|llama3_8b|qwen2_7b|qwen3_32b|qwen3_8b" in r.stderr and "must not start" not in r.stderr
    r = cli("deploy=pd", "model=tiny_mla", "job=launch", cwd=tmp_path, env=env)
    assert r.returncode == 2 and "prefill: 'tiny_mla'" in r.stderr and "decode: 'tiny_mla'" in r.stderr


def test_a_busy_port_is_a_config_error_and_nothing_starts(launch, ports):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        run = launch([f"serving.port={busy}", *STANDIN])
        assert run.wait(TIMEOUT) == 2
    assert f"serving.port (--port): 127.0.0.1:{busy} is already in use" in run.stderr
    assert "serving.port=<port>" in run.stderr
    assert run.standin_pids() == []


def test_a_side_on_another_machines_address_is_refused_by_name(tmp_path):
    """job=launch starts everything here: an address this machine does not have is not 'in use'."""
    env = {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}
    foreign = [h for h in ("198.51.100.7", "203.0.113.7", "192.0.2.7", "198.51.100.8", "203.0.113.8")
               if not _bindable(h)][:2]                     # documentation ranges (RFC 5737) this machine lacks
    if len(foreign) < 2:
        pytest.skip("this machine has the documentation addresses")
    r = cli("deploy=pd", f"prefill.serving.host={foreign[0]}", f"decode.serving.host={foreign[1]}", *STANDIN,
            "job=launch", cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"prefill.serving.host (--host): {foreign[0]} is not an address of this machine" in r.stderr
    assert f"decode.serving.host (--host): {foreign[1]} is not an address of this machine" in r.stderr
    assert "already in use" not in r.stderr and "Traceback" not in r.stderr


def test_launch_settings_that_cannot_work_are_config_errors(tmp_path):
    for setting in ("job.health_timeout=-1", "job.stop_timeout=0"):
        r = cli("job=launch", "job.dry_run=true", setting, cwd=tmp_path)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"{setting.split('=')[0]}: " in r.stderr and "not a positive, finite number of seconds" in r.stderr
    r = cli("deploy=pd", "job=launch", "job.dry_run=true", "deploy.router_extra_args=[--port,9999]", cwd=tmp_path)
    assert r.returncode == 2 and "deploy.router_extra_args: --port (set by deploy.router_port)" in r.stderr


def _bindable(host: str) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, 0))
            return True
        except OSError:
            return False


def test_a_foreign_address_is_blamed_on_the_setting_that_names_it():
    from sglang_hydra.jobs.launch import _host_key
    assert _host_key("decode.serving.port") == ("decode.serving.host", "--host")
    assert _host_key("deploy.router_prometheus_port") == ("deploy.router_host", None)
    assert _host_key("prefill.parallel.dist_init_addr") == ("prefill.parallel.dist_init_addr", "--dist-init-addr")
