"""deploy=pd composition in-process: sides, precedence, --config sections, ports, cross-side checks."""
import pytest

from sglang_hydra.config.deploy import (Deployment, compose_deployment, deployment_request, listening_ports,
                                        router_argv)
from sglang_hydra.config.errors import ConfigError


def deploy(*argv):
    req = deployment_request(list(argv))
    assert req is not None
    return compose_deployment(req)


def problems(*argv):
    with pytest.raises(ConfigError) as exc:
        deploy(*argv)
    return [str(p) for p in exc.value.problems]


def test_ordinary_commands_are_not_deployments():
    assert deployment_request(["model=llama3_8b", "--page-size", "16", "job=resolve"]) is None
    assert deployment_request(["schedule.page_size=16", "--served-model-name", "x"]) is None


def test_pd_sides_share_top_level_and_override_per_side():
    dep, job_name, _ = deploy("deploy=pd", "model=llama3_8b", "schedule.page_size=16",
                              "prefill.parallel.tp_size=4", "decode.memory.hicache_ratio=3", "job=resolve")
    assert isinstance(dep, Deployment) and job_name == "resolve"
    pre, dec = dep.server("prefill").record, dep.server("decode").record
    assert (pre.disaggregation_mode, dec.disaggregation_mode) == ("prefill", "decode")
    assert pre.model_path == dec.model_path == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert pre.page_size == dec.page_size == 16
    assert (pre.tp_size, dec.tp_size) == (4, 1)
    assert (pre.hicache_ratio, dec.hicache_ratio) == (2.0, 3.0)


def test_side_value_beats_shared_value_whatever_the_order():
    dep, _, _ = deploy("deploy=pd", "decode.schedule.max_running_requests=7", "schedule.max_running_requests=3")
    assert dep.server("decode").record.max_running_requests == 7
    assert dep.server("prefill").record.max_running_requests == 3


def test_side_keys_alone_imply_pd_and_the_default_job_is_resolve():
    dep, job_name, _ = deploy("prefill.parallel.tp_size=2")
    assert dep.name == "pd" and job_name == "resolve"


def test_default_ports_are_laid_out_without_collisions():
    dep, _, _ = deploy("deploy=pd")
    pre, dec = dep.server("prefill").record, dep.server("decode").record
    assert (pre.port, dec.port, pre.disaggregation_bootstrap_port) == (30000, 30001, 8998)
    assert (dep.router.port, dep.router.prometheus_port) == (8000, 29000)
    ports = [p for _, _, p in listening_ports(dep)]
    assert len(ports) == len(set(ports)) == 5
    assert router_argv(dep)[:6] == ["--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "8998",
                                    "--decode", "http://127.0.0.1:30001"]


def test_unset_ports_move_past_explicit_ones():
    dep, _, _ = deploy("deploy=pd", "decode.serving.port=30000", "deploy.router_port=30001")
    pre, dec = dep.server("prefill").record, dep.server("decode").record
    assert dec.port == 30000 and dep.router.port == 30001 and pre.port == 30002
    dep, _, _ = deploy("deploy=pd", "serving.port=31000", "prefill.disagg.disaggregation_bootstrap_port=31001")
    assert dep.server("prefill").record.port == 31000          # a top-level port is prefill's
    assert dep.server("decode").record.port == 31002           # decode takes the next free one


def test_explicit_collision_is_an_error():
    out = problems("deploy=pd", "prefill.serving.port=31000", "decode.serving.port=31000")
    assert len(out) == 1 and "decode.serving.port" in out[0] and "prefill.serving.port" in out[0]
    dep, _, _ = deploy("deploy=pd", "disagg.disaggregation_bootstrap_port=8000")   # the router's default port:
    assert dep.router.port == 8001                                              # it was not written, so it moves
    out = problems("deploy=pd", "deploy.router_port=8998", "disagg.disaggregation_bootstrap_port=8998")
    assert "deploy.router_port" in out[0] and "port 8998" in out[0]


def test_different_hosts_may_share_a_port():
    dep, _, _ = deploy("deploy=pd", "prefill.serving.host=127.0.0.2", "decode.serving.port=30000")
    assert dep.server("prefill").record.port == dep.server("decode").record.port == 30000


@pytest.mark.parametrize("override,key", [
    ("decode.model.model_path=other", "model.model_path"),
    ("decode.schedule.page_size=64", "schedule.page_size"),
    ("prefill.model.kv_cache_dtype=fp8_e5m2", "model.kv_cache_dtype"),
    ("decode.disagg.disaggregation_transfer_backend=nixl", "disagg.disaggregation_transfer_backend"),
])
def test_sides_that_disagree_are_rejected(override, key):
    out = problems("deploy=pd", "schedule.page_size=16", override)
    assert len(out) == 1 and out[0].startswith(key) and "prefill has" in out[0]


def test_modes_belong_to_the_deployment():
    out = problems("deploy=pd", "disagg.disaggregation_mode=prefill")
    assert len(out) == 1 and "deploy=pd sets each side's mode" in out[0]
    out = problems("deploy=pd", "decode.disagg.disaggregation_mode=prefill")
    assert out[0].startswith("decode.disagg.disaggregation_mode")
    dep, _, _ = deploy("deploy=pd", "prefill.disagg.disaggregation_mode=prefill")   # saying the same is fine
    assert dep.server("prefill").record.disaggregation_mode == "prefill"


def test_problems_of_both_sides_are_reported_together_and_named_by_side():
    out = problems("deploy=pd", "prefill.memory.hicache_ratio=banana", "decode.schedule.nope=1",
                   "schedule.page_size=abc")
    assert any(p.startswith("prefill.memory.hicache_ratio") and "[override prefill.memory.hicache_ratio=banana]" in p
               for p in out)
    assert any(p.startswith("decode.schedule.nope") and "unknown key" in p for p in out)
    assert sum(p.startswith("schedule.page_size") for p in out) == 1   # a shared mistake is said once


def test_bad_deploy_input():
    assert "no preset 'pdd' in group 'deploy'" in problems("deploy=pdd")[0]
    assert "did you mean 'router_port'" in problems("deploy=pd", "deploy.router_prt=1")[0]
    assert "deploy.router_port" in problems("deploy=pd", "deploy.router_port=70000")[0]
    assert "router_policy" in problems("deploy=pd", "deploy.router_policy=fastest")[0]
    assert "only runs with deploy=pd" in problems("deploy=single", "deploy.router_port=9000")[0]
    assert "need deploy=pd" in problems("deploy=single", "prefill.parallel.tp_size=2")[0]
    assert "not a value" in problems("deploy=pd", "prefill=big")[0]
    assert "whole deployment" in problems("deploy=pd", "prefill.job.format=json")[0]
    assert "job=setup works on one record" in problems("deploy=pd", "job=setup")[0]
    assert "Hydra's runtime" in problems("deploy=pd", "-m", "schedule.page_size=16,32")[0]


def test_config_file_with_sections(tmp_path):
    cfg = tmp_path / "pd.yaml"
    cfg.write_text("deploy: {name: pd, router_port: 8100}\n"
                   "model: {model_path: my-model}\n"
                   "page-size: 32\n"
                   "prefill:\n  parallel: {tp_size: 4}\n  disaggregation-bootstrap-port: 9100\n"
                   "decode:\n  memory.hicache_ratio: 3\n")
    dep, _, _ = deploy("--config", str(cfg), "decode.memory.hicache_ratio=4")
    pre, dec = dep.server("prefill").record, dep.server("decode").record
    assert pre.model_path == dec.model_path == "my-model" and pre.page_size == dec.page_size == 32
    assert pre.tp_size == 4 and pre.disaggregation_bootstrap_port == 9100
    assert dec.hicache_ratio == 4.0            # the command line beats the file
    assert dep.router.port == 8100
    dep, _, _ = deploy("--config", str(cfg), "deploy.router_port=8200")
    assert dep.router.port == 8200


def test_config_file_side_problems(tmp_path):
    cfg = tmp_path / "pd.yaml"
    cfg.write_text("prefill: 3\ndecode:\n  memory: {hicache_ration: 2}\n")
    out = problems("--config", str(cfg))
    assert any("section 'prefill' must map" in p for p in out)
    assert any(p.startswith("decode.memory.hicache_ration") for p in out)


def test_single_deployment_from_a_config_file(tmp_path):
    cfg = tmp_path / "one.yaml"
    cfg.write_text("deploy: single\nschedule: {page_size: 16}\n")
    record, job_name, _ = deploy("--config", str(cfg), "job=resolve")
    assert record.page_size == 16 and job_name == "resolve"
    req = deployment_request(["deploy=single", "job=resolve"])
    assert req.is_plain_single() and req.shared_argv == ["job=resolve"]


# ---------------------------------------------------------------- GPUs of two sides on one node
ON_GPUS = "device.device=cuda"        # the device is otherwise detected, and CI has no GPU


def gpu_bases(dep):
    return dep.server("prefill").record.base_gpu_id, dep.server("decode").record.base_gpu_id


@pytest.mark.parametrize("overrides,bases", [
    ((), (0, 1)),
    (("prefill.parallel.tp_size=2",), (0, 2)),
    (("prefill.parallel.tp_size=4",), (0, 4)),
    (("prefill.parallel.tp_size=2", "prefill.parallel.pp_size=2"), (0, 4)),
    (("prefill.parallel.tp_size=2", "prefill.parallel.dp_size=2"), (0, 4)),     # each DP replica has its own GPUs
    (("parallel.tp_size=2", "device.gpu_id_step=2"), (0, 4)),                   # prefill on 0 and 2
    (("device.base_gpu_id=2", "prefill.parallel.tp_size=4"), (2, 6)),           # a top-level value is prefill's
    (("decode.device.base_gpu_id=4", "prefill.parallel.tp_size=4"), (0, 4)),    # written and clear of prefill: kept
    (("prefill.device.base_gpu_id=4", "decode.device.base_gpu_id=0", "decode.parallel.tp_size=4"), (4, 0)),
])
def test_decode_gets_the_gpus_after_prefills(overrides, bases):
    dep, _, _ = deploy("deploy=pd", ON_GPUS, *overrides)
    assert gpu_bases(dep) == bases


def test_decode_base_gpu_id_is_on_the_decode_command_line():
    from sglang_hydra.jobs.resolve import render

    dep, _, _ = deploy("deploy=pd", ON_GPUS, "prefill.parallel.tp_size=4")
    assert "--base-gpu-id" not in render(dep.server("prefill").record, "argv").split()
    argv = render(dep.server("decode").record, "argv").split()
    assert argv[argv.index("--base-gpu-id") + 1] == "4"


@pytest.mark.parametrize("overrides,shared", [
    (("prefill.device.base_gpu_id=0", "decode.device.base_gpu_id=0"), "GPU 0"),
    (("prefill.parallel.tp_size=4", "prefill.device.base_gpu_id=0", "decode.device.base_gpu_id=3"), "GPU 3"),
    (("decode.device.base_gpu_id=1", "decode.parallel.tp_size=2", "prefill.parallel.tp_size=2"), "GPU 1"),
])
def test_overlapping_gpus_on_one_node_are_an_error(overrides, shared):
    out = problems("deploy=pd", ON_GPUS, *overrides)
    assert len(out) == 1
    assert out[0].startswith("decode.device.base_gpu_id (--base-gpu-id)")
    assert "prefill.device.base_gpu_id" in out[0] and shared in out[0]


def test_sides_on_different_hosts_keep_their_gpus():
    dep, _, _ = deploy("deploy=pd", ON_GPUS, "prefill.serving.host=10.0.0.1", "decode.serving.host=10.0.0.2",
                       "parallel.tp_size=4")
    assert gpu_bases(dep) == (0, 0)
    dep, _, _ = deploy("deploy=pd", ON_GPUS, "prefill.serving.host=10.0.0.1", "decode.serving.host=10.0.0.2",
                       "decode.device.base_gpu_id=0")
    assert gpu_bases(dep) == (0, 0)


def test_cpu_servers_get_no_gpu_ids():
    dep, _, _ = deploy("deploy=pd", "device.device=cpu", "prefill.parallel.tp_size=2")
    assert gpu_bases(dep) == (0, 0)


def test_dry_run_starts_decode_on_its_own_gpus(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "deploy=pd", ON_GPUS, "prefill.parallel.tp_size=2",
                        "job=launch", "job.dry_run=true"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    prefill_line, decode_line = r.stdout.splitlines()[1], r.stdout.splitlines()[3]
    assert "--base-gpu-id" not in prefill_line and " --tp-size 2 " in prefill_line
    assert " --base-gpu-id 2 " in decode_line
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "deploy=pd", ON_GPUS, "decode.device.base_gpu_id=0",
                        "job=launch", "job.dry_run=true"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "decode.device.base_gpu_id" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- every port SGLang binds
ATTN_DP = ("parallel.tp_size=2", "parallel.attn_dp_size=2")     # what --tp 2 --dp 2 --enable-dp-attention gives


def bound(dep, role):
    """(host, port) of everything ``role`` binds, as the launch's port check sees it."""
    return {(h, p) for label, h, p in listening_ports(dep) if label.startswith(f"{role}.")}


def test_attention_dp_blocks_of_the_two_sides_do_not_overlap():
    dep, _, _ = deploy("deploy=pd", *ATTN_DP)
    pre, dec = bound(dep, "prefill"), bound(dep, "decode")
    assert not pre & dec
    # SGLang 0.5.23 PortArgs.init_new: dist-init at --port + 233, its six ZMQ ports right after
    assert {p for _, p in pre} >= set(range(30233, 30240))
    dec_port = dep.server("decode").record.port
    assert {p for _, p in dec} >= {dec_port, *range(dec_port + 233, dec_port + 240)}
    assert dec_port + 233 > 30239                 # decode's block starts past prefill's


def test_attention_dp_on_one_side_moves_decode_only_as_far_as_needed():
    dep, _, _ = deploy("deploy=pd", "decode.parallel.tp_size=2", "decode.parallel.attn_dp_size=2")
    assert dep.server("decode").record.port == 30001            # prefill binds no block: nothing to avoid
    assert not bound(dep, "prefill") & bound(dep, "decode")


def test_a_written_port_inside_the_other_sides_block_is_an_error():
    out = problems("deploy=pd", *ATTN_DP, "prefill.serving.port=30000", "decode.serving.port=30234")
    assert len(out) == 1
    assert out[0].startswith("decode.serving.port (--port): port 30234 is also prefill.serving.port (--port)")
    assert "ZMQ" in out[0]


@pytest.mark.parametrize("argv,key", [
    (("--nccl-port", "5000"), "parallel.nccl_port (--nccl-port)"),
    (("--grpc-mode", "--grpc-port", "7000"), "serving.grpc_port (--grpc-port)"),
    (("--grpc-mode", "--smg-http-sidecar-port", "9000"), "observability.smg_http_sidecar_port"),
    (("--engine-info-bootstrap-port", "6000", "model.remote_instance_weight_loader_start_seed_via_transfer_engine=true"),
     "model.engine_info_bootstrap_port (--engine-info-bootstrap-port)"),
    ((*ATTN_DP, "--dist-init-addr", "127.0.0.1:5000"), "parallel.dist_init_addr (--dist-init-addr)"),
])
def test_a_shared_written_port_is_a_collision(argv, key):
    out = problems("deploy=pd", *argv)
    assert len(out) == 1 and out[0].startswith(f"decode.{key}") and f"prefill.{key.split(' ')[0]}" in out[0]
    assert "copied to both sides" in out[0]


def test_ports_that_are_not_written_are_laid_out_apart():
    dep, _, _ = deploy("deploy=pd", "model.remote_instance_weight_loader_start_seed_via_transfer_engine=true")
    assert (dep.server("prefill").record.engine_info_bootstrap_port,
            dep.server("decode").record.engine_info_bootstrap_port) == (6789, 6790)
    dep, _, _ = deploy("deploy=pd", "--grpc-mode")       # the sidecar takes --port + 1, so decode moves past it
    assert dep.server("decode").record.port == 30002
    assert not bound(dep, "prefill") & bound(dep, "decode")


def test_an_assigned_port_moves_past_a_written_one_and_two_written_ones_clash():
    dep, _, _ = deploy("deploy=pd", "prefill.parallel.nccl_port=30001")
    assert dep.server("decode").record.port == 30002
    out = problems("deploy=pd", "prefill.parallel.nccl_port=30001", "decode.serving.port=30001")
    assert len(out) == 1 and out[0].startswith("decode.serving.port (--port): port 30001 is also "
                                               "prefill.parallel.nccl_port (--nccl-port)")


# ---------------------------------------------------------------- flag values are not deployment keys
def test_legacy_flag_values_are_not_deployment_tokens():
    assert deployment_request(["--chat-template", "decode.jinja", "job=resolve"]) is None
    # `deploy=x` after a valued flag is an override, as the flag parser reads it (its value is missing)
    req = deployment_request(["--served-model-name", "deploy=x"])
    assert req is not None and req.option == "x"
    assert deployment_request(["--chat-template=prefill.jinja"]) is None
    dep, _, _ = deploy("deploy=pd", "--served-model-name", "decode.x", "--chat-template", "prefill.jinja")
    for role in ("prefill", "decode"):
        rec = dep.server(role).record
        assert (rec.served_model_name, rec.chat_template) == ("decode.x", "prefill.jinja")
    req = deployment_request(["-m", "deploy=pd"])            # a Hydra flag without a value leaves it alone
    assert req is not None and req.option == "pd"


def test_a_disagg_preset_cannot_choose_a_sides_mode(tmp_path):
    out = problems("deploy=pd", "decode.disagg=prefill")
    assert len(out) == 1 and out[0].startswith("decode.disagg: disagg=prefill sets disaggregation_mode=prefill")
    out = problems("deploy=pd", "disagg=decode")
    assert len(out) == 1 and out[0].startswith("disagg: disagg=decode") and "deploy=pd sets each side's mode" in out[0]
    cfg = tmp_path / "pd.yaml"
    cfg.write_text("decode: {disagg: prefill}\n")
    out = problems("--config", str(cfg))
    assert len(out) == 1 and out[0].startswith("decode.disagg:")
    dep, _, _ = deploy("deploy=pd", "prefill.disagg=prefill", "disagg=none")     # the same mode, or none: fine
    assert dep.server("prefill").record.disaggregation_mode == "prefill"


def test_every_problem_of_a_deployment_is_reported_in_one_run():
    out = problems("deploy=pd", "decode.schedule.page_size=16", "prefill.serving.port=31000",
                   "decode.serving.port=31000")
    assert len(out) == 2
    assert out[0].startswith("decode.serving.port (--port): port 31000") and out[1].startswith("schedule.page_size")
    out = problems("deploy=pd", "decode.schedule.page_size=16", "prefill.serving.port=31000",
                   "decode.serving.port=31000", "decode.parallel.tp_size=x", "deploy.router_policy=bad", "job=estimate")
    keys = [p.split(" ")[0].rstrip(":") for p in out]
    assert keys == ["deploy.router_policy", "decode.parallel.tp_size", "job", "decode.serving.port",
                    "schedule.page_size"], out


def test_a_setting_that_failed_raises_no_follow_up_problems():
    out = problems("deploy=pd", "prefill.serving.port=30000", "decode.serving.port=abc", "decode.schedule.page_size=x")
    assert sorted(p.split(" ")[0] for p in out) == ["decode.schedule.page_size", "decode.serving.port"], out


def test_gpus_are_laid_out_when_the_device_was_detected_not_written(caplog):
    """A dry run on a machine without a GPU (the device detects as cpu) still gives decode its
    own GPUs, and says why; a written device.device=cpu places nothing."""
    import logging
    with caplog.at_level(logging.WARNING, logger="sglang_hydra.config"):
        dep, _, _ = deploy("deploy=pd", "prefill.parallel.tp_size=4")
    assert gpu_bases(dep) == (0, 4)
    if str(dep.server("decode").record.device) == "cpu":        # this machine has no GPU driver
        assert any("no GPU was found here" in r.getMessage() for r in caplog.records)
    dep, _, _ = deploy("deploy=pd", "device.device=cpu", "prefill.parallel.tp_size=4")
    assert gpu_bases(dep) == (0, 0)
