"""Deploy keys that count servers (deploy.workers, deploy.prefill_workers/decode_workers) and the GPU budget."""
import re
import subprocess
import sys

import pytest

from sglang_hydra.config.deploy import (ROUTER_POLICIES, DeploySettings, compose_deployment, deploy_settings_problems,
                                        deployment_request, listening_ports, router_argv)
from sglang_hydra.config.errors import ConfigError

from .conftest import router_installed


def problems(*argv):
    req = deployment_request(list(argv))
    with pytest.raises(ConfigError) as exc:
        compose_deployment(req)
    return [str(p) for p in exc.value.problems]


def test_worker_counts_must_be_positive_and_belong_to_their_deployment():
    (p,) = problems("deploy.workers=0")
    assert p.startswith("deploy.workers: 0 is not a positive whole number")
    (p,) = problems("deploy.prefill_workers=2")
    assert p.startswith("deploy.prefill_workers: counts the servers of deploy=pd, but this is deploy=single")
    (p,) = problems("deploy=pd", "deploy.workers=3")
    assert "counts the servers of deploy=single" in p and "deploy.prefill_workers and deploy.decode_workers" in p
    (p,) = problems("deploy.total_gpus=-1")
    assert p.startswith("deploy.total_gpus: -1 is not a positive whole number")


def test_router_keys_need_a_router():
    (p,) = problems("deploy.router_port=9000")
    assert "the router only runs with deploy=pd or with deploy.workers above 1" in p
    assert not any("router" in p for p in problems("deploy.workers=2", "deploy.router_port=9000", "deploy.total_gpus=0"))


def test_a_policy_the_router_lacks_is_refused_in_one_line():
    (p,) = problems("deploy=pd", "deploy.router_policy=least_load")
    assert p.startswith("deploy.router_policy: 'least_load' is not a policy sglang-router 0.3.2 offers (one of: random, "
                        "round_robin, cache_aware, power_of_two, manual)")
    assert deploy_settings_problems(DeploySettings(router_policy="nope")) == [
        ("deploy.router_policy", "'nope' is not a policy sglang-router 0.3.2 offers (one of: random, round_robin, "
                                 "cache_aware, power_of_two, manual)")]


@pytest.mark.skipif(not router_installed(), reason="sglang-router not installed (pip install 'sglang-hydra[router]')")
def test_router_policies_are_the_installed_routers_choices():
    help_text = subprocess.run([sys.executable, "-m", "sglang_router.launch_router", "--help"], capture_output=True,
                               text=True, timeout=60).stdout
    choices = re.search(r"--policy \{([^}]*)\}", help_text).group(1).split(",")
    assert tuple(choices) == ROUTER_POLICIES


@pytest.mark.parametrize("argv, key, text", [
    (("deploy.workers=4", "parallel.tp_size=4", "deploy.total_gpus=8"), "deploy.workers",
     "deploy.workers 4 x parallel.tp_size 4 x parallel.pp_size 1 x parallel.dp_size 1 = 16 GPUs, over deploy.total_gpus 8"),
    (("deploy.workers=3", "parallel.tp_size=2", "parallel.dp_size=2", "hardware=h100_80gb"), "deploy.workers",
     "= 12 GPUs, over one node's hardware.gpus_per_node 8 (hardware=h100_80gb)"),
    (("deploy=pd", "deploy.prefill_workers=3", "deploy.decode_workers=2", "prefill.parallel.tp_size=2",
      "decode.parallel.tp_size=2", "deploy.total_gpus=8"), "deploy",
     "deploy.prefill_workers 3 x prefill.parallel.tp_size 2 x prefill.parallel.pp_size 1 x prefill.parallel.dp_size 1"
     " + deploy.decode_workers 2 x decode.parallel.tp_size 2"),
    (("deploy=single", "deploy.total_gpus=16", "parallel.tp_size=16", "parallel.pp_size=2", "hardware=h100_80gb"),
     "deploy.workers", "parallel.pp_size 2 x parallel.dp_size 1 = 32 GPUs, over deploy.total_gpus 16"),
])
def test_gpus_over_the_budget_are_one_line_naming_the_keys(argv, key, text):
    (p,) = problems(*argv)
    assert p.startswith(f"{key}: ") and text in p, p


def test_within_the_budget_composes():
    """Exactly 8 GPUs' worth composes (no error) into the servers asked for, each with its TP."""
    agg = compose_deployment(deployment_request(["deploy.workers=4", "parallel.tp_size=2", "hardware=h100_80gb"]))[0]
    assert [(s.role, s.record.tp_size) for s in agg.servers] == [("server", 2)] * 4
    pd = compose_deployment(deployment_request(["deploy=pd", "deploy.prefill_workers=3", "deploy.decode_workers=1",
                                                "decode.parallel.tp_size=4", "deploy.total_gpus=8"]))[0]
    assert [(s.role, s.record.tp_size) for s in pd.servers] == [("prefill", 1)] * 3 + [("decode", 4)]
    assert sum(s.record.tp_size for s in pd.servers) == 7          # within deploy.total_gpus 8


# ---------------------------------------------------------------- several servers: layout
ON_GPUS = "device.device=cuda"


def compose(*argv):
    return compose_deployment(deployment_request(list(argv)))[0]


def test_aggregated_workers_get_their_own_ports_and_gpus_and_a_regular_mode_router():
    dep = compose("deploy.workers=4", "parallel.tp_size=2", ON_GPUS, "hardware=h100_80gb", "deploy.router_policy=cache_aware")
    assert [s.name for s in dep.servers] == ["server0", "server1", "server2", "server3"]
    assert [s.record.port for s in dep.servers] == [30000, 30001, 30002, 30003]
    assert [s.record.base_gpu_id for s in dep.servers] == [0, 2, 4, 6]
    assert router_argv(dep) == ["--worker-urls", *(f"http://127.0.0.1:{p}" for p in range(30000, 30004)),
                                "--host", "127.0.0.1", "--port", "8000", "--prometheus-host", "127.0.0.1",
                                "--prometheus-port", "29000", "--policy", "cache_aware"]
    assert dep.settings.workers == 4


def test_xpyd_lays_out_every_server_bootstrap_port_and_gpu():
    dep = compose("deploy=pd", "deploy.prefill_workers=3", "deploy.decode_workers=2", "decode.parallel.tp_size=2",
                  ON_GPUS, "hardware=h100_80gb", "prefill.serving.port=31000")
    assert [s.name for s in dep.servers] == ["prefill0", "prefill1", "prefill2", "decode0", "decode1"]
    assert [s.record.port for s in dep.servers] == [31000, 31001, 31002, 31003, 31004]
    assert [s.record.base_gpu_id for s in dep.servers] == [0, 1, 2, 3, 5]
    boots = [s.record.disaggregation_bootstrap_port for s in dep.of_role("prefill")]
    assert boots == [8998, 8999, 9000]
    argv = router_argv(dep)
    assert argv[:10] == ["--pd-disaggregation", "--prefill", "http://127.0.0.1:31000", "8998",
                         "--prefill", "http://127.0.0.1:31001", "8999", "--prefill", "http://127.0.0.1:31002", "9000"]
    assert argv[10:14] == ["--decode", "http://127.0.0.1:31003", "--decode", "http://127.0.0.1:31004"]
    bound = [(h, p) for _label, h, p in listening_ports(dep)]
    assert len(bound) == len(set(bound))                      # nothing bound twice
    assert any("prefill2's port" in label for label, _h, _p in listening_ports(dep))


def test_a_written_gpu_of_a_later_server_may_not_overlap_and_the_layout_stays_on_one_node():
    (p,) = problems("deploy=pd", "deploy.prefill_workers=2", ON_GPUS, "decode.device.base_gpu_id=1")
    assert p.startswith("decode.device.base_gpu_id (--base-gpu-id): decode GPUs [1] overlap") and "prefill1" in p
    (p,) = problems("deploy.workers=3", "parallel.tp_size=4", ON_GPUS, "hardware=h100_80gb", "deploy.total_gpus=12")
    assert p.startswith("hardware.gpus_per_node: server2 would use GPU 11") and "covers one node" in p


def test_dry_run_prints_every_server_and_the_router(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "deploy=pd", "deploy.prefill_workers=2", ON_GPUS,
                        "model=llama3_8b", "job=launch", "job.dry_run=true", "job.python=/opt/py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line for line in lines if line.startswith("#")] == [
        "# prefill0 (health: http://127.0.0.1:30000/health)", "# prefill1 (health: http://127.0.0.1:30001/health)",
        "# decode (health: http://127.0.0.1:30002/health)", "# router (health: http://127.0.0.1:8000/health)"]
    assert lines[3].endswith("--base-gpu-id 1 --port 30001 --disaggregation-mode prefill "
                             "--disaggregation-bootstrap-port 8999")
    assert "--prefill http://127.0.0.1:30001 8999 --decode http://127.0.0.1:30002" in lines[7]


def test_an_xpyd_deployment_runs_under_job_replay(tmp_path):
    """The issue's first command: job=replay on deploy=pd with several prefill servers (the simulation
    takes both records; the counts come with the job's context)."""
    import json
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=replay", "deploy=pd", "deploy.prefill_workers=2",
                        "decode.parallel.tp_size=2", "model=llama3_1_8b", "hardware=h100_80gb", "job.max_requests=50",
                        "job.format=json", "job.progress=false"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    dep = json.loads(r.stdout)["deployment"]
    assert (dep["deploy_mode"], dep["prefill_servers"], dep["decode_tp_size"], dep["gpus"]) == ("disagg", 2, 2, 4)
