"""Plans for a target machine: hardware presets, live local readings, weights, pinning."""
import json
import subprocess
import sys

import pytest
import yaml

from sglang_hydra.config.compose import compose, conf_dir
from sglang_hydra.config.errors import ConfigError
from sglang_hydra.config.hardware import HARDWARE_FIELDS, Hardware, compose_hardware
from sglang_hydra.config.testing import make_record
from sglang_hydra.memory.errors import MemorySetupError
from sglang_hydra.memory.hostmem import HostMemoryInfo, host_capacity_bytes
from sglang_hydra.memory.plan import default_mem_fraction, make_plan, pool_pages
from sglang_hydra.memory.target import local_hardware, preset_hardware, resolve_target
from sglang_hydra.memory.weights import weight_bytes, weights_per_rank

from .conftest import GiB, small_record

GB = 10 ** 9
PRESETS = ("h100_80gb", "h200_141gb", "a100_80gb", "l40s_48gb")


def plan_for(overrides, **kw):
    rec, composed = compose(overrides)
    return make_plan(rec, hardware=composed.hardware, check_io=False, **kw)


# ---- the hardware group ------------------------------------------------------------------

@pytest.mark.parametrize("name", PRESETS)
def test_presets_state_every_field_and_cite_a_source(name):
    raw = yaml.safe_load((conf_dir() / "hardware" / f"{name}.yaml").read_text())
    assert set(raw) == set(HARDWARE_FIELDS)
    hw, problems = compose_hardware(name)
    assert not problems and hw.name == name and not hw.is_local
    for f in HARDWARE_FIELDS:
        # a card without NVLink says so with null, and its all-reduces cross PCIe
        if f == "nvlink_gbps" and hw.tp_link == "pcie":
            continue
        # only PCIe cards share a host bridge between the GPUs of a larger group
        if f == "allreduce_bridge_gbps" and hw.tp_link == "nvlink":
            continue
        assert getattr(hw, f) is not None, f
    assert "nvidia.com" in hw.source and 0 < hw.gemm_efficiency <= 1


def test_known_spec_figures():
    h100, h200 = preset_hardware("h100_80gb"), preset_hardware("h200_141gb")
    assert (h100.gpu_memory_gb, h100.hbm_bandwidth_gbps) == (80.0, 3350.0)
    assert (h200.gpu_memory_gb, h200.hbm_bandwidth_gbps) == (141.0, 4800.0)
    assert h100.bf16_tflops == h200.bf16_tflops < 1000     # dense, not the sparsity figure
    assert preset_hardware("a100_80gb").bf16_tflops == 312.0


def test_default_is_local_and_overrides_are_typed():
    _, c = compose([])
    assert c.hardware.name == "local" and c.hardware.host_memory_gb is None
    _, c = compose(["hardware=h100_80gb", "hardware.host_memory_gb=16"])
    assert c.hardware.host_memory_gb == 16.0 and c.hardware.gpu_memory_gb == 80.0
    with pytest.raises(ConfigError) as ei:
        compose(["hardware=h100", "hardware.gpu_memory_gb=-1", "hardware.gpus_per_node=x", "hardware.ram=1"])
    text = str(ei.value)
    assert "available: a100_80gb, h100_80gb, h200_141gb, l40s_48gb, local" in text
    assert "hardware.gpu_memory_gb" in text and "greater than 0" in text
    assert "hardware.gpus_per_node" in text and "not an integer" in text
    assert "hardware.ram" in text and "unknown hardware field" in text


def test_hydra_composer_carries_hardware_too():
    # an interpolation forces the Hydra composer; the hardware must come through it unchanged
    rec, c = compose(["hardware=l40s_48gb", "hardware.host_memory_gb=128", "schedule.max_running_requests=${schedule.max_prefill_tokens}"])
    assert rec.max_running_requests == 16384 and c.hardware == preset_hardware("l40s_48gb", host_memory_gb=128)


def test_local_reads_live_fields_and_stated_ones_win(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal:  33554432 kB\nMemAvailable: 1024 kB\n")
    t = resolve_target(local_hardware(), device="cpu", proc_root=str(proc))
    assert t.hardware.host_memory_gb == pytest.approx(32 * GiB / GB) and t.measured == ("host_memory_gb",)
    t = resolve_target(local_hardware(host_memory_gb=16), device="cpu", proc_root=str(proc))
    assert t.hardware.host_memory_gb == 16 and t.measured == () and t.stated == ("host_memory_gb",)
    # a preset is never measured
    t = resolve_target(preset_hardware("h100_80gb"), device="cpu", proc_root=str(proc))
    assert t.measured == () and t.hardware == preset_hardware("h100_80gb")


def test_host_capacity_is_the_tighter_of_ram_and_cgroup_limit(tmp_path):
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal: 33554432 kB\nMemAvailable: 1048576 kB\n")
    (proc / "self" / "cgroup").write_text("0::/job\n")
    (proc / "self" / "mountinfo").write_text("41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw\n")
    cg = tmp_path / "root" / "sys" / "fs" / "cgroup" / "job"
    cg.mkdir(parents=True)
    (cg / "memory.max").write_text(str(8 * GiB))
    (cg / "memory.current").write_text(str(7 * GiB))   # busy now: capacity must not care
    cap, why = host_capacity_bytes(str(proc), str(tmp_path / "root"))
    assert cap == 8 * GiB and "cgroup limit" in why


# ---- plans for targets -----------------------------------------------------------------------

def test_llama3_8b_on_h100_subtracts_weights_and_uses_the_reference_fraction():
    p = plan_for(["model=llama3_8b", "hardware=h100_80gb"])
    assert p.target == "h100_80gb" and p.device == "cuda"
    assert p.weights_bytes == 8030261248 * 2
    frac, _ = default_mem_fraction(make_record(model_path="llama3_8b"), 80 * GB)
    assert p.mem_fraction_static == frac == 0.866
    budget = int(80 * GB * frac) - p.weights_bytes
    assert p.device_tokens == budget // (32 * 8 * 128 * 2 * 2)
    assert p.host_tokens == 0 and p.retraction_backup is None


def test_hicache_on_target_sizes_host_from_its_ram():
    p = plan_for(["model=llama3_8b", "hardware=h100_80gb", "memory=hicache", "memory.hicache_ratio=2"])
    assert p.host_tokens == (p.device_tokens * 2 // 1 + 1) and p.pin_memory
    assert p.host_bytes == p.host_tokens * p.bytes_per_token
    # one rank per GPU on the node: its 8 GPUs' ranks share the 2,000 GB (issue 27: not 1,989 GB per rank)
    assert p.host_budget_ranks == 8 and p.host_budget_bytes == (2000 * GB - 10 * GiB) // 8
    # 8 ranks on the node share its RAM: 100 GB per rank is too much for a 512 GB L40S node
    with pytest.raises(MemorySetupError) as ei:
        plan_for(["model=llama3_8b", "hardware=l40s_48gb", "parallel.tp_size=8", "memory=hicache",
                  "memory.hicache_size=100"])
    assert ei.value.key == "memory.hicache_size"


def test_same_plan_on_every_machine():
    """A preset plan reads nothing from this machine: injecting a tiny host changes nothing."""
    a = plan_for(["model=qwen2_7b", "hardware=a100_80gb", "memory=hicache"])
    b = plan_for(["model=qwen2_7b", "hardware=a100_80gb", "memory=hicache"])
    assert a.to_dict() == b.to_dict()
    assert a.host_ratio == 2.0 and "auto-size" in a.host_budget_reason


def test_deepseek_v3_weights_are_fp8_and_split_over_tp():
    w = weights_per_rank(compose(["model=deepseek_v3", "parallel.tp_size=8"])[0])
    assert w.dtype == "fp8" and w.bytes == -(-671 * GB // 8)
    p = plan_for(["model=deepseek_v3", "hardware=h200_141gb", "parallel.tp_size=8"])
    assert p.device_tokens > 0
    with pytest.raises(MemorySetupError) as ei:   # 84 GB of weights per H100 leave nothing
        plan_for(["model=deepseek_v3", "hardware=h100_80gb", "parallel.tp_size=8"])
    assert ei.value.key == "schedule.mem_fraction_static" and "tp-size" in ei.value.message


def test_weight_bytes_by_dtype():
    assert weight_bytes(10, "bf16") == 20 and weight_bytes(10, "fp8") == 10 and weight_bytes(10, "fp4") == 5
    assert weight_bytes(10, "float32") == 40
    with pytest.raises(ValueError):
        weight_bytes(10, "fp7")


def test_target_without_weights_info_says_what_is_missing(tmp_path):
    ckpt = tmp_path / "moe"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(dict(
        num_hidden_layers=4, num_key_value_heads=2, head_dim=64, hidden_size=256, num_attention_heads=4,
        intermediate_size=512, vocab_size=1000, num_local_experts=8)))
    rec, c = compose([f"model.model_path={ckpt}", "hardware=h100_80gb"])
    assert rec.num_parameters is None and rec.hidden_size == 256
    with pytest.raises(MemorySetupError) as ei:
        make_plan(rec, hardware=c.hardware)
    assert ei.value.key == "model.num_parameters" and "num_parameters=<count>" in ei.value.message
    rec, c = compose([f"model.model_path={ckpt}", "hardware=h100_80gb", "model.num_parameters=1000000"])
    assert make_plan(rec, hardware=c.hardware).weights_bytes == 2_000_000


def test_dense_checkpoint_counts_its_parameters(tmp_path):
    ckpt = tmp_path / "llama"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(dict(
        architectures=["LlamaForCausalLM"], num_hidden_layers=32, num_key_value_heads=8, hidden_size=4096,
        num_attention_heads=32, intermediate_size=14336, vocab_size=128256, max_position_embeddings=8192)))
    rec = compose([f"model.model_path={ckpt}"])[0]
    assert rec.num_parameters == 8030261248 and rec.num_attention_heads == 32 and rec.head_dim == 128


def test_stated_gpu_memory_on_local_sizes_like_a_target():
    rec = small_record(max_total_tokens=None)
    p = make_plan(rec, hardware=local_hardware(gpu_memory_gb=16.0, host_memory_gb=8), check_io=False)
    assert p.mem_fraction_static == default_mem_fraction(rec, 16 * GB)[0]
    budget = int(16 * GB * p.mem_fraction_static) - rec.num_parameters * 2
    assert p.device_tokens == budget // p.bytes_per_token // 4 * 4


def test_max_total_tokens_is_clamped_on_a_target_like_the_reference():
    p = plan_for(["model=llama3_8b", "hardware=l40s_48gb", "schedule.max_total_tokens=100000000"])
    assert p.device_tokens < 100000000 and any("clamped" in n for n in p.notes)
    p = plan_for(["model=llama3_8b", "hardware=l40s_48gb", "schedule.max_total_tokens=4096"])
    assert p.device_tokens == 4096


def test_pool_pages_for_the_replay():
    pp = pool_pages(compose(["model=llama3_8b", "memory=hicache", "memory.hicache_ratio=2",
                             "schedule.page_size=16"])[0], preset_hardware("h200_141gb"))
    assert pp.page_size == 16 and pp.host_pages == pp.device_pages * 2 + 1
    assert pp.bytes_per_page == 16 * 131072


def test_target_plans_never_import_torch():
    code = ("import sys; from sglang_hydra.config.compose import compose; from sglang_hydra.memory.plan import pool_pages;"
            "r, c = compose(['model=llama3_8b', 'hardware=h100_80gb', 'memory=hicache']);"
            "print(pool_pages(r, c.hardware)); assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_setup_refuses_a_remote_target():
    from sglang_hydra.memory import build_memory
    with pytest.raises(ConfigError, match="job=plan"):
        build_memory(small_record(), hardware=preset_hardware("h100_80gb"))


# ---- model paths -----------------------------------------------------------------------------

def test_unknown_model_path_is_an_error_naming_both_fixes():
    rec = make_record(model_path="meta-llama/Meta-Llama-3-8B")      # resolves fine
    with pytest.raises(MemorySetupError) as ei:
        make_plan(rec, host_memory=HostMemoryInfo.fixed(64 * GiB))
    msg = ei.value.message
    assert ei.value.key == "model.model_path" and "model=<name>" in msg and "config.json" in msg
    # a chosen preset states the geometry, whatever the path is called
    rec = compose(["model=llama3_8b", "model.model_path=meta-llama/Meta-Llama-3-8B"])[0]
    assert make_plan(rec, hardware=preset_hardware("h100_80gb")).device_tokens > 0


@pytest.mark.parametrize("path", ["llama3_8b", "meta-llama/Meta-Llama-3-8B-Instruct"])
def test_a_model_path_that_spells_a_preset_without_selecting_it_is_refused(path):
    """Before: --model-path llama3_8b passed the check and was sized with the tiny geometry."""
    rec = compose([f"model.model_path={path}"])[0]
    assert rec.num_hidden_layers == 2                # the default (tiny) geometry
    with pytest.raises(MemorySetupError) as ei:
        make_plan(rec, hardware=preset_hardware("h100_80gb"))
    assert ei.value.key == "model.model_path" and "add model=llama3_8b" in ei.value.message
    # the default model spells its own preset and has its geometry: fine
    assert make_plan(compose([])[0], host_memory=HostMemoryInfo.fixed(64 * GiB)).device_tokens > 0
    # the preset's model_path is the checkpoint job=launch hands the server
    assert compose(["model=llama3_8b"])[0].model_path == "meta-llama/Meta-Llama-3-8B-Instruct"


# ---- local sizing that does not depend on momentary free memory --------------------------------

def test_cpu_plan_uses_ram_size_not_free_memory(tmp_path):
    def fake(avail_kb):
        proc = tmp_path / f"p{avail_kb}"
        proc.mkdir()
        (proc / "meminfo").write_text(f"MemTotal: 25165824 kB\nMemAvailable: {avail_kb} kB\n")
        return str(proc)
    rec = small_record(max_total_tokens=None, enable_hierarchical_cache=True)
    idle = make_plan(rec, proc_root=fake(23000000))
    busy = make_plan(rec, proc_root=fake(2000000))     # 2 GB free: below the 10 GiB reserve
    assert idle.to_dict() == busy.to_dict()
    assert idle.device_bytes <= (256 << 20) + idle.bytes_per_page
    assert idle.host_tokens == idle.device_tokens * 2 + 4 and idle.host_ratio == 2.0


def test_stated_host_memory_sizes_the_host_tier():
    rec = small_record(max_total_tokens=None, enable_hierarchical_cache=True)
    p = make_plan(rec, hardware=local_hardware(host_memory_gb=11.5))
    assert p.host_memory["note"].startswith("11.5 GB, hardware.host_memory_gb")
    assert 1 < p.host_ratio < 2.0    # 11.5 GB - 10 GiB reserve - the CPU pool leaves less than 2x
    with pytest.raises(MemorySetupError):
        make_plan(small_record(enable_hierarchical_cache=True, hicache_size=5), hardware=local_hardware(host_memory_gb=11.5))
    with pytest.raises(MemorySetupError, match="mem-fraction-static"):   # the default reserve exceeds a 2 GB GPU
        make_plan(rec, hardware=local_hardware(gpu_memory_gb=2, host_memory_gb=64))


def test_decode_backup_pool_ignores_live_free_memory(monkeypatch):
    """On a GPU server the backup-only host pool of a decode server is never checked against
    live free memory (it is a fraction of the device pool)."""
    import sglang_hydra.memory.plan as plan_mod
    monkeypatch.setattr(plan_mod, "resolve_device", lambda record, device=None: "cuda")
    monkeypatch.setattr(plan_mod, "_cuda_memory", lambda dev: (2 * GiB, 80 * GB))
    monkeypatch.setattr(plan_mod, "effective_io", lambda io, dev: (io, ""))
    monkeypatch.setattr(plan_mod.hostmem, "probe_host_memory", lambda *a, **k: HostMemoryInfo.fixed(GiB))
    import sglang_hydra.memory.target as target_mod
    monkeypatch.setattr(target_mod, "_live_gpu", lambda dev: (80.0, "FAKE GPU"))
    rec = small_record(disaggregation_mode="decode", max_total_tokens=64)
    p = make_plan(rec, hardware=local_hardware())
    assert p.retraction_backup == "host_pool" and p.host_tokens > 0 and p.host_budget_bytes is None
    assert any("not sized against this machine's host memory" in n for n in p.notes)
    # with HiCache the live reference rule still applies (and 1 GiB is below the reserve)
    with pytest.raises(MemorySetupError):
        make_plan(small_record(enable_hierarchical_cache=True, max_total_tokens=64), hardware=local_hardware())


# ---- exact-size pinning -----------------------------------------------------------------------

class FakeCudart:
    def __init__(self):
        self.registered, self.unregistered = [], []

    def cudaHostRegister(self, ptr, nbytes, flags):
        self.registered.append((ptr, nbytes, flags))
        return 0

    def cudaHostUnregister(self, ptr):
        self.unregistered.append(ptr)
        return 0


def test_pinned_host_pool_registers_exactly_the_planned_bytes(monkeypatch):
    import sglang_hydra.memory.host_pool as hp
    from sglang_hydra.memory.geometry import kv_geometry
    fake = FakeCudart()
    monkeypatch.setattr(hp, "_cudart", lambda: fake)
    rec = small_record(enable_hierarchical_cache=True, hicache_ratio=3.0, hicache_host_memory_fraction=None)
    plan = make_plan(rec, host_memory=HostMemoryInfo.fixed(64 * GiB))
    pool = hp.HostKVPool(kv_geometry(rec), plan.host_layout, plan.host_tokens, pin_memory=True)
    # 33 x 4 KiB is not a power of two: torch's caching host allocator would have rounded it up
    assert [n for _, n, _ in fake.registered] == [plan.host_bytes] == [pool.nbytes]
    assert pool.pinned_bytes == plan.host_bytes
    assert fake.registered[0][0] == pool.kv_buffer.data_ptr()
    pool.k_buffer.fill_(7)
    assert int(pool.v_buffer.sum()) == 0 and int(pool.k_buffer[0, 0, 0, 0].view(-1)[0]) != 0
    pool.close()
    assert fake.unregistered == [fake.registered[0][0]] and pool.pinned_bytes == 0
    pool.close()
    assert len(fake.unregistered) == 1


def test_failed_registration_is_an_error(monkeypatch):
    import sglang_hydra.memory.host_pool as hp
    from sglang_hydra.memory.geometry import kv_geometry
    fake = FakeCudart()
    fake.cudaHostRegister = lambda ptr, n, f: 2
    monkeypatch.setattr(hp, "_cudart", lambda: fake)
    rec = small_record(enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_host_memory_fraction=None)
    with pytest.raises(RuntimeError, match="cudaHostRegister"):
        hp.HostKVPool(kv_geometry(rec), "page_first", 64, pin_memory=True)


def test_hardware_scope_reaches_spawned_children():
    """Jobs that allocate in code they do not own (full replay, both PD processes) still see
    the job's hardware: the scope rides in the environment and is restored afterwards."""
    import os
    from sglang_hydra.memory.target import HARDWARE_ENV, hardware_scope
    code = ("from sglang_hydra.config.testing import make_record; from sglang_hydra.memory.plan import make_plan;"
            "p = make_plan(make_record(enable_hierarchical_cache=True, max_total_tokens=64, page_size=4));"
            "print(p.host_memory['note'])")
    before = os.environ.get(HARDWARE_ENV)
    with hardware_scope(local_hardware(host_memory_gb=12.5)):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("12.5 GB, hardware.host_memory_gb")
    assert os.environ.get(HARDWARE_ENV) == before
    with hardware_scope(preset_hardware("h100_80gb")):
        from sglang_hydra.memory import build_memory
        with pytest.raises(ConfigError, match="job=plan"):
            build_memory(small_record())


def test_decode_backup_pool_on_a_small_cpu_host_never_fails(tmp_path):
    """8 GiB of RAM is below the 10 GiB reserve: HiCache cannot size a host tier there, but
    a decode server's backup-only pool must still come up."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "meminfo").write_text("MemTotal: 8388608 kB\nMemAvailable: 4194304 kB\n")
    p = make_plan(small_record(disaggregation_mode="decode", max_total_tokens=64), proc_root=str(proc))
    assert p.retraction_backup == "host_pool" and p.host_tokens > 0 and p.host_budget_bytes is None
    with pytest.raises(MemorySetupError):
        make_plan(small_record(enable_hierarchical_cache=True, max_total_tokens=64), proc_root=str(proc))
    # stated host RAM is a what-if statement: the rule applies to it
    with pytest.raises(MemorySetupError):
        make_plan(small_record(disaggregation_mode="decode", max_total_tokens=64),
                  hardware=local_hardware(host_memory_gb=8))
