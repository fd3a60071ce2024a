"""``job=plan`` through the real command line: target hardware, no allocation, clear errors."""
import csv
import json
import os
import subprocess
import sys

import pytest

GB = 10 ** 9


def run(*args, cwd, timeout=120):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def test_llama3_8b_on_h100(tmp_path):
    r = run("job=plan", "model=llama3_8b", "hardware=h100_80gb", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "target h100_80gb: 80 GB GPU, 2000 GB host RAM, 8 GPU(s)/node" in out
    assert "weights 16.06 GB per GPU" in out and "bytes per token 131,072" in out
    assert "mem_fraction_static 0.866 of 80 GB GPU memory of h100_80gb minus 16.06 GB weights" in out
    assert not list(tmp_path.iterdir())      # nothing written for a single plan


def test_hicache_ratio_on_h100_as_json(tmp_path):
    r = run("job=plan", "model=llama3_8b", "hardware=h100_80gb", "memory=hicache", "memory.hicache_ratio=2",
            "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["target"] == "h100_80gb" and p["hardware"]["gpu_memory_gb"] == 80.0
    assert p["host_tokens"] == 2 * p["device_tokens"] + 1 and p["pin_memory"] is True
    assert p["host_bytes"] == p["host_tokens"] * 131072
    assert p["device_tokens"] * 131072 + p["weights_bytes"] <= 80 * GB * p["mem_fraction_static"]
    assert p["host_budget_reason"].startswith("hicache_ratio 2")
    assert p["host_budget_ranks"] == 8 and p["host_budget_bytes"] == (2000 * GB - 10 * 2 ** 30) // 8


def test_host_budget_per_rank_is_the_nodes_ram_over_the_ranks_sharing_it(tmp_path):
    """8 GPUs share an H100 node's 2,000 GB: 248.7 GB per rank, not 1,989 GB (issue 27); a pool
    over that share is named (it fits only with fewer servers on the node)."""
    r = run("job=plan", "model=llama3_8b", "hardware=h100_80gb", "memory=hicache", "memory.hicache_ratio=2",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "host budget 248.7 GB/rank (2,000 GB less the 10 GiB reserve, over the 8 ranks sharing it)" in r.stdout
    assert "over one rank's share" not in r.stdout
    r = run("job=plan", "model=llama3_8b", "hardware=h100_80gb", "memory=hicache", "memory.hicache_size=400",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "the host pool (400.0 GB) is over one rank's share of the node (248.7 GB when 8 ranks share it)" in r.stdout


def test_decode_server_plan_shows_retraction_backup(tmp_path):
    r = run("job=plan", "model=qwen2_7b", "hardware=h200_141gb", "disagg=decode", "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["retraction_backup"] == "host_pool" and p["hicache"] is False
    assert 0 < p["host_tokens"] < p["device_tokens"]


def test_plan_errors_exit_2_without_traceback(tmp_path):
    r = run("job=plan", "hardware=h100", cwd=tmp_path)
    assert r.returncode == 2 and "available: a100_80gb, h100_80gb, h200_141gb, l40s_48gb, local" in r.stderr
    r = run("job=plan", "model.model_path=org/some-model", "hardware=h100_80gb", cwd=tmp_path)
    assert r.returncode == 2 and "model.model_path (--model-path)" in r.stderr and "config.json" in r.stderr
    r = run("job=plan", "model=llama3_8b", "hardware=h100_80gb", "memory=hicache", "memory.hicache_ratio=0.5",
            cwd=tmp_path)
    assert r.returncode == 2 and "memory.hicache_ratio (--hicache-ratio): 0.5" in r.stderr
    r = run("job=setup", "hardware=a100_80gb", cwd=tmp_path)
    assert r.returncode == 2 and "use job=plan" in r.stderr
    for err in (r.stderr,):
        assert "Traceback" not in err
    # job=resolve keeps accepting any model path
    r = run("job=resolve", "model.model_path=org/some-model", cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("model_path: org/some-model")


def test_sweep_over_machines(tmp_path):
    r = run("-m", "job=plan", "model=llama3_8b", "hardware=h100_80gb,h200_141gb", "memory=hicache",
            "memory.hicache_ratio=2", f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path, timeout=240)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader((tmp_path / "sweep" / "summary.csv").open()))
    assert [row["hardware"] for row in rows] == ["h100_80gb", "h200_141gb"]
    h100, h200 = (int(row["device_tokens"]) for row in rows)
    assert h200 > h100 * 2          # 141 GB vs 80 GB, same 16 GB of weights


def test_local_plan_with_stated_host_memory(tmp_path):
    r = run("job=plan", "memory=hicache", "hardware.host_memory_gb=32", "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["target"] == "local" and p["hardware"]["host_memory_gb"] == 32
    assert "host_memory_gb" not in p["hardware"]["measured"]
    assert p["host_memory"]["note"].startswith("32 GB, hardware.host_memory_gb")
    assert p["device_bytes"] <= (256 << 20) + p["bytes_per_page"]     # a CPU stand-in pool: a few hundred MiB


PD_PLAN = ("job=plan", "deploy=pd", "model=llama3_1_8b", "hardware=h100_80gb")


def test_pd_plans_both_sides(tmp_path):
    # issue 19: job=plan refused deploy=pd; it now plans each side on its own TP
    r = run(*PD_PLAN, "deploy.prefill_workers=2", "prefill.parallel.tp_size=2", "decode.parallel.tp_size=4",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "PD deployment plan on h100_80gb: 2 prefill x TP2 + 1 decode x TP4 = 8 GPUs of 8" in out
    assert "== prefill server (each of 2) ==" in out and "== decode server (each of 1) ==" in out
    # each side's pool is its own: 4 KV heads per rank at TP2, 2 at TP4 (half the bytes per token)
    assert "bytes per token 65,536" in out and "bytes per token 32,768" in out
    assert "decode retraction backup host_pool" in out          # only the decode side has one
    assert not list(tmp_path.iterdir())      # nothing written for a single plan
    r = run(*PD_PLAN, "deploy.prefill_workers=2", "prefill.parallel.tp_size=2", "decode.parallel.tp_size=4",
            "job.format=json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    pre, dec = doc["prefill"], doc["decode"]
    assert (pre["workers"], pre["gpus"], dec["workers"], dec["gpus"]) == (2, 4, 1, 4)
    assert doc["deployment"]["gpus"] == 8 and doc["deployment"]["total_gpus"] == 8
    assert dec["plan"]["bytes_per_token"] * 2 == pre["plan"]["bytes_per_token"]
    assert dec["plan"]["device_tokens"] > pre["plan"]["device_tokens"]      # fewer weights per GPU at TP4
    assert dec["plan"]["retraction_backup"] and not pre["plan"]["retraction_backup"]
    assert doc["deployment"]["decode_requests_held"] == dec["plan"]["device_tokens"] // 131072


def test_pd_plan_sweep_writes_each_sides_figures(tmp_path):
    r = run("-m", *PD_PLAN, "decode.parallel.tp_size=1,2", "hydra.sweep.dir=sw", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    with open(tmp_path / "sw" / "summary.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [t["decode.parallel.tp_size"] for t in table] == ["1", "2"]
    assert int(table[1]["decode_kv_pool_tokens"]) > 2 * int(table[0]["decode_kv_pool_tokens"])
    assert table[0]["prefill_kv_pool_tokens"] == table[1]["prefill_kv_pool_tokens"]
    assert (tmp_path / "sw" / "1" / "plan.json").is_file()


@pytest.mark.parametrize("args, line", [
    (("deploy.total_gpus=4", "prefill.parallel.tp_size=4"),
     "  - deploy: deploy.prefill_workers 1 x prefill.parallel.tp_size 4 x prefill.parallel.pp_size 1 x "
     "prefill.parallel.dp_size 1 + deploy.decode_workers 1 x decode.parallel.tp_size 1 x decode.parallel.pp_size 1 "
     "x decode.parallel.dp_size 1 = 5 GPUs, over deploy.total_gpus 4; raise deploy.total_gpus or use fewer/smaller "
     "servers [deploy]"),
    (("decode.schedule.max_total_tokens=50000",),
     "  - decode.schedule.max_total_tokens: decode.schedule.max_total_tokens 50,000 cannot hold one request: the "
     "prefill side accepts prompts up to 131,071 tokens"),
    (("decode.schedule.mem_fraction_static=0.25",),
     "  - decode.schedule.mem_fraction_static: the decode pool sized on h100_80gb at TP 1: 30,055 tokens cannot hold "
     "one request"),
])
def test_pd_plan_bad_input_is_one_line_naming_the_key(tmp_path, args, line):
    r = run(*PD_PLAN, *args, cwd=tmp_path)
    assert r.returncode == 2
    problems = [ln for ln in r.stderr.splitlines() if ln.startswith("  - ")]
    assert len(problems) == 1 and problems[0].startswith(line), r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.iterdir())
