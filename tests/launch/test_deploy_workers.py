"""Deploy keys that count servers (deploy.workers, deploy.prefill_workers/decode_workers) and the GPU budget."""
import re
import subprocess
import sys

import pytest

from sglang_hydra.config.deploy import (ROUTER_POLICIES, DeploySettings, compose_deployment, deploy_settings_problems,
                                        deployment_request)
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
    for argv in (("deploy.workers=4", "parallel.tp_size=2", "hardware=h100_80gb"),
                 ("deploy=pd", "deploy.prefill_workers=3", "deploy.decode_workers=1", "decode.parallel.tp_size=4",
                  "deploy.total_gpus=8")):
        compose_deployment(deployment_request(list(argv)))
