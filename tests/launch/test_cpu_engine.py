"""job=launch on a machine without a GPU: the real SGLang 0.5.23 on the CPU, model=tiny_llama.

The first tests check what the launch would start (flags, environment, the shipped model, the
plugin overlay, the router's counters) and run everywhere.  The ``reference`` tests start real
servers from the interpreter named by SGLANG_HYDRA_REFERENCE_PYTHON (built by
scripts/install_engine_env.sh; .ci/run sets it): one deployment through the Python API
(two servers behind sglang-router, round robin) and one server through the CLI (with one of our
eviction policies through the engine plugin), each sent real ``/generate`` requests and stopped,
leaving no process behind.
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sglang_hydra.config.compose import compose
from sglang_hydra.jobs.engine_process import (KERNEL_SHIM_DIR, SHIPPED_MODELS, cpu_threads_bind, server_env,
                                              server_flags, shipped_model_dir, write_plugin_overlay)
from sglang_hydra.jobs.router_metrics import parse_worker_counts

from .conftest import pid_alive

REFERENCE_PYTHON = os.environ.get("SGLANG_HYDRA_REFERENCE_PYTHON")
TIMEOUT = 120


def cli(*args, cwd, env=None, timeout=TIMEOUT):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, **(env or {})))


def _record(*overrides):
    return compose(["model=tiny_llama", "device.device=cpu", *overrides])[0]


# --------------------------------------------------------------------------- what would start
def test_tiny_llama_preset_matches_its_shipped_checkpoint():
    """The preset's geometry (what the what-if sizes) is the config.json the server loads."""
    rec = _record()
    cfg = json.loads((SHIPPED_MODELS / "tiny_llama" / "config.json").read_text())
    assert cfg["architectures"] == [rec.architecture]
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings"):
        assert cfg[field] == getattr(rec, field), field
    per_layer = (cfg["hidden_size"] * cfg["head_dim"] * (cfg["num_attention_heads"] * 2 + cfg["num_key_value_heads"] * 2)
                 + 3 * cfg["hidden_size"] * cfg["intermediate_size"] + 2 * cfg["hidden_size"])
    assert rec.num_parameters == (2 * cfg["vocab_size"] * cfg["hidden_size"] + cfg["num_hidden_layers"] * per_layer
                                  + cfg["hidden_size"])
    assert (rec.load_format, rec.dtype, rec.skip_tokenizer_init, rec.model_path) == ("dummy", "bfloat16", True,
                                                                                      "tiny_llama")
    assert shipped_model_dir("tiny_llama") == SHIPPED_MODELS / "tiny_llama"
    assert shipped_model_dir("tiny") is None and shipped_model_dir("/abs/tiny_llama") is None


def test_cpu_flags_come_from_the_record():
    rec = _record("schedule.page_size=16", "schedule.max_total_tokens=20000", "schedule.mem_fraction_static=0.05")
    flags = server_flags(rec)
    joined = " ".join(flags)
    assert f"--model-path {SHIPPED_MODELS / 'tiny_llama'}" in joined
    for part in ("--page-size 16", "--max-total-tokens 20000", "--mem-fraction-static 0.05", "--device cpu",
                 "--attention-backend torch_native", "--disable-cuda-graph", "--sleep-on-idle",
                 "--skip-tokenizer-init", "--load-format dummy", "--dtype bfloat16", "--context-length 131072"):
        assert part in joined, part
    # a setting the user wrote wins over the CPU default; a label names the server
    flags = server_flags(_record("exec.attention_backend=triton"), label="server1")
    assert flags[flags.index("--attention-backend") + 1] == "triton"
    assert flags[flags.index("--weight-version") + 1] == "server1"
    flags = server_flags(_record("serving.weight_version=v7"), label="server1")     # a written version is kept
    assert flags[flags.index("--weight-version") + 1] == "v7" and "server1" not in flags
    # a GPU record is left as written
    gpu = compose(["model=tiny_llama", "device.device=cuda"])[0]
    assert "--sleep-on-idle" not in server_flags(gpu) and "--attention-backend" not in server_flags(gpu)
    assert server_env(gpu) == {}


def test_cpu_environment_puts_the_kernels_on_the_server_path_only():
    env = server_env(_record(), pythonpath="/somewhere")
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(KERNEL_SHIM_DIR), "/somewhere"]
    assert (KERNEL_SHIM_DIR / "sgl_kernel" / "__init__.py").is_file()
    assert "sgl_kernel" not in sys.modules
    with pytest.raises(ImportError):
        __import__("sgl_kernel")       # this interpreter never has it


def test_every_device_id_of_a_cpu_server_has_a_core_group():
    """SGLang takes a CPU rank's device id as a NUMA index: a second server (base_gpu_id 1) or
    dp_size=2 needs a bind entry per id."""
    assert cpu_threads_bind(_record(), cores=[0, 1]) == "0-1"
    assert cpu_threads_bind(_record("device.base_gpu_id=1"), cores=[0, 1]) == "0|1"
    assert cpu_threads_bind(_record("parallel.dp_size=2", "device.base_gpu_id=1"), cores=[0, 1]).count("|") == 2
    assert cpu_threads_bind(_record("parallel.dp_size=2"), cores=list(range(8))) == "0-3|4-7"


def test_plugin_overlay_gives_the_entry_point_and_the_modules(tmp_path):
    overlay = write_plugin_overlay(tmp_path / "overlay")
    (dist,) = list(importlib.metadata.distributions(path=[str(overlay)]))
    (ep,) = [e for e in dist.entry_points if e.group == "sglang.srt.plugins"]
    assert (ep.name, ep.value) == ("hydra_eviction_policies", "sglang_hydra.cache.sglang_plugin:register")
    import sglang_hydra.cache.sglang_plugin as plugin
    src = Path(plugin.__file__).parent
    for name in ("sglang_plugin.py", "hit_density_core.py"):
        assert (overlay / "sglang_hydra" / "cache" / name).read_bytes() == (src / name).read_bytes()
    # the overlay's modules import with the standard library alone (what a server's venv has)
    r = subprocess.run([sys.executable, "-I", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "import sglang_hydra.cache.sglang_plugin as p; print(sorted(p.PLUGIN_POLICIES))", str(overlay)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "ghost_lru" in r.stdout, r.stderr


def test_router_counts_parse_every_outcome_per_worker():
    text = """# HELP smg_worker_cb_outcomes_total circuit breaker outcomes
# TYPE smg_worker_cb_outcomes_total counter
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:31000",outcome="failure"} 4
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:31000",outcome="success"} 22
smg_worker_cb_outcomes_total{worker="http://127.0.0.1:31001",outcome="success"} 3
smg_worker_health{worker="http://127.0.0.1:31001"} 1
smg_worker_requests_active{worker="http://127.0.0.1:31000"} 0
"""
    assert parse_worker_counts(text) == {"http://127.0.0.1:31000": 26, "http://127.0.0.1:31001": 3}
    assert parse_worker_counts("") == {}


def test_a_router_is_ready_when_it_lists_every_server_healthy():
    """sglang-router 0.3.2 answers /health before it has registered its workers; the launch waits
    until /workers lists each one (healthy), whatever field holds its URL."""
    import http.server
    import threading
    from sglang_hydra.jobs.launch import ChildPlan, _lists_workers
    listing = {"workers": []}

    class Workers(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(json.dumps(listing).encode())

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Workers)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        plan = ChildPlan("router", (), f"http://127.0.0.1:{srv.server_port}/health",
                         workers=("http://127.0.0.1:1", "http://127.0.0.1:2"))
        assert not _lists_workers(plan)                                       # none registered yet
        listing["workers"] = [{"id": "a", "url": "http://127.0.0.1:1", "is_healthy": True},
                              {"id": "b", "url": "http://127.0.0.1:2/", "is_healthy": False}]
        assert not _lists_workers(plan)                                       # one not healthy
        listing["workers"][1]["is_healthy"] = True
        assert _lists_workers(plan)
        assert _lists_workers(ChildPlan("router", (), plan.health_url))       # a stand-in router: no list
    finally:
        srv.shutdown()


def test_dry_run_on_a_cpu_prints_the_environment_and_checks_each_interpreter(tmp_path):
    r = cli("model=tiny_llama", "device.device=cpu", "schedule.page_size=16", "job=launch", "job.dry_run=true",
            "job.python=/nonexistent/python", "deploy.workers=2", "deploy.router_policy=round_robin", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "# server0 (health: http://127.0.0.1:30000/health)"
    assert "SGLANG_USE_CPU_ENGINE=1 " in lines[1] and f"PYTHONPATH={KERNEL_SHIM_DIR}" in lines[1]
    assert "/nonexistent/python -m sglang.launch_server" in lines[1] and "--device cpu" in lines[1]
    assert "sglang_router.launch_router --worker-urls http://127.0.0.1:30000 http://127.0.0.1:30001" in lines[5]
    assert "/nonexistent/python imports sglang (server0): NOT OK: '/nonexistent/python' is not an executable" in r.stderr
    assert "imports sglang_router (router): NOT OK" in r.stderr
    # this interpreter has the router but not SGLang: each verdict is its own
    r = cli("model=tiny_llama", "device.device=cpu", "job=launch", "job.dry_run=true", f"job.python={sys.executable}",
            "deploy.workers=2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"{sys.executable} imports sglang (server0): NOT OK: ModuleNotFoundError: No module named 'sglang'" in r.stderr
    router_ok = importlib.util.find_spec("sglang_router") is not None
    assert (f"{sys.executable} imports sglang_router (router): ok" in r.stderr) == router_ok


# --------------------------------------------------------------------------- real servers
@pytest.fixture(scope="module")
def engine_python():
    if not REFERENCE_PYTHON:
        pytest.skip("SGLANG_HYDRA_REFERENCE_PYTHON is not set (scripts/install_engine_env.sh builds the engine venv)")
    assert os.access(REFERENCE_PYTHON, os.X_OK), f"SGLANG_HYDRA_REFERENCE_PYTHON={REFERENCE_PYTHON} is not executable"
    probe = "import importlib.util as u, sys; sys.exit(0 if u.find_spec('sglang') and u.find_spec('sglang_router') else 3)"
    r = subprocess.run([REFERENCE_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, (f"{REFERENCE_PYTHON} lacks sglang or sglang_router (scripts/install_engine_env.sh "
                               f"installs both): {r.stderr[-2000:]}")
    return REFERENCE_PYTHON


def _generate(url, ids, max_new_tokens=2):
    body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0,
                                                             "ignore_eos": True}}).encode()
    req = urllib.request.Request(f"{url}/generate", data=body, headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=120) as resp:
        return json.loads(resp.read())


def _prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 32000) for _ in range(n)]


def _free_ports(n):
    from sglang_hydra.utils.ports import free_port
    out = set()
    while len(out) < n:
        out.add(free_port())
    return sorted(out)


def _descendants(pid):
    from sglang_hydra.jobs.launch import _descendants as descendants
    return sorted(descendants(pid))


@pytest.mark.reference
def test_api_two_workers_behind_the_router(engine_python, tmp_path):
    """running_deployment: two real servers behind sglang-router (round robin); each request is
    answered by the server its weight_version names, the router's counts agree, a repeated prompt
    is cached up to its last token rounded down to the page, and nothing is left running."""
    from sglang_hydra.config.deploy import compose_deployment
    from sglang_hydra.config.deploy.request import deployment_request
    from sglang_hydra.jobs.launch import running_deployment
    port, router_port, metrics_port = _free_ports(3)
    argv = ["model=tiny_llama", "device.device=cpu", "schedule.page_size=16", "schedule.max_total_tokens=20000",
            f"serving.port={port}", "deploy.workers=2", "deploy.router_policy=round_robin",
            f"deploy.router_port={router_port}", f"deploy.router_prometheus_port={metrics_port}", "job=launch"]
    target, _job_name, _job = compose_deployment(deployment_request(argv))
    said = []
    with running_deployment(target, {"python": engine_python, "stop_timeout": 20, "health_timeout": 300},
                            label_servers=True, say=said.append, log_path=tmp_path / "launch.log") as dep:
        assert dep.url == f"http://127.0.0.1:{router_port}" and len(dep.worker_urls) == 2
        assert dep.worker_names == ["server0", "server1"]
        pids = sorted(p for pid in dep.pids.values() for p in [pid, *_descendants(pid)])
        assert len(pids) >= 7        # 2 x (launcher, scheduler, detokenizer) + the router
        before = dep.worker_counts()
        served = [_generate(dep.url, _prompt(i, 100))["meta_info"]["weight_version"] for i in range(6)]
        assert sorted(served) == ["server0"] * 3 + ["server1"] * 3          # round robin
        after = dep.worker_counts()
        assert {k: after[k] - before.get(k, 0) for k in after} == {"server0": 3, "server1": 3}
        # a repeated 300-token prompt on one server: 299 tokens match at most, rounded down to 16
        prompt = _prompt(99, 300)
        first = _generate(dep.worker_urls[1], prompt)["meta_info"]
        again = _generate(dep.worker_urls[1], prompt)["meta_info"]
        assert (first["prompt_tokens"], first["cached_tokens"]) == (300, 0)
        assert (again["prompt_tokens"], again["cached_tokens"]) == (300, 288)
        assert again["weight_version"] == "server1"
    assert not [p for p in pids if pid_alive(p)]
    assert any("ready:" in s for s in said)
    log = (tmp_path / "launch.log").read_text()
    assert "[server0] " in log and "[router] " in log


@pytest.mark.reference
def test_cli_server_with_two_dp_ranks_and_our_policy_through_the_plugin(engine_python, tmp_path):
    """`sglang-hydra job=launch model=tiny_llama parallel.dp_size=2 memory.radix_eviction_policy=ghost_lru`:
    the engine venv has no sglang-hydra, so the launch puts the plugin on the server's path; SGLang
    accepts the policy, both data-parallel schedulers serve, and SIGTERM stops everything."""
    (port,) = _free_ports(1)
    out = (tmp_path / "stdout.txt").open("wb")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "sglang_hydra", "model=tiny_llama", "device.device=cpu",
                             "schedule.page_size=16", "schedule.max_total_tokens=20000", f"serving.port={port}",
                             "memory.radix_eviction_policy=ghost_lru", "parallel.dp_size=2", "job=launch",
                             f"job.python={engine_python}",
                             "job.stop_timeout=20", "job.health_timeout=300"],
                            cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, env=env)
    pids = []
    try:
        deadline = time.monotonic() + 300
        while "[launch] ready:" not in (tmp_path / "stdout.txt").read_text(errors="replace"):
            assert proc.poll() is None, (tmp_path / "stdout.txt").read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, "not ready in 300 s"
            time.sleep(0.5)
        pids = [proc.pid, *_descendants(proc.pid)]
        url = f"http://127.0.0.1:{port}"
        prompt = _prompt(7, 200)
        metas = [_generate(url, prompt + _prompt(8 + i, 40))["meta_info"] for i in range(4)]
        assert {m["dp_rank"] for m in metas} == {0, 1}          # both schedulers served
        for rank in (0, 1):     # on each rank the first request misses, later ones hit the shared 200, whole pages
            cached = [m["cached_tokens"] for m in metas if m["dp_rank"] == rank]
            assert cached[0] == 0 and all(c == 192 for c in cached[1:]), metas
        assert all(m["prompt_tokens"] == 240 for m in metas)
        text = (tmp_path / "stdout.txt").read_text(errors="replace")
        # SGLang's own argument parser accepted the policy: only the plugin adds it to the choices
        assert "--radix-eviction-policy ghost_lru" in text and "'radix_eviction_policy': 'ghost_lru'" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        out.close()
    assert len(pids) >= 5         # the launch, SGLang's launcher, DP controller, 2 schedulers, detokenizer
    leftover = [p for p in pids[1:] if pid_alive(p)]
    for p in leftover:
        os.kill(p, signal.SIGKILL)
    assert not leftover


_AMX_PROBE = """
import json, torch
from sglang.srt.utils.common import cpu_has_amx_support, is_cpu
from sglang.srt.layers import activation, layernorm
from sglang.srt.layers.rotary_embedding import base as rope_base
import sgl_kernel
norm = layernorm.RMSNorm(64, eps=1e-6)
x = torch.randn(5, 64)
print(json.dumps({"is_cpu": is_cpu(), "amx": cpu_has_amx_support(), "kernel_file": sgl_kernel.__file__,
                  "flags": [layernorm._is_cpu_amx_available, activation._is_cpu_amx_available,
                            rope_base._is_cpu_amx_available],
                  "norm_is_native": bool(torch.equal(norm(x.clone()), norm.forward_native(x.clone())))}))
"""


@pytest.mark.reference
def test_without_the_amx_op_sglang_layers_run_plain_torch(engine_python):
    """In a CPU server's environment SGLang imports our sgl_kernel, finds no
    ``convert_weight_packed`` op, and its layers (norm, activation, rotary) take their plain-torch
    code: an RMSNorm through its own dispatch equals its ``forward_native``."""
    env = dict(os.environ, **server_env(_record()))
    r = subprocess.run([engine_python, "-c", _AMX_PROBE], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["is_cpu"] is True and got["amx"] is False and got["flags"] == [False, False, False]
    assert got["kernel_file"] == str(KERNEL_SHIM_DIR / "sgl_kernel" / "__init__.py")
    assert got["norm_is_native"] is True
