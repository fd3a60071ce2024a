"""hostmem: cgroup v1/v2 discovery on fake files, budget, auto-size and host pool sizing."""
import os
import subprocess
import sys

import pytest

from sglang_hydra.memory import hostmem
from sglang_hydra.memory.errors import MemorySetupError

GiB = 1024 ** 3


def _w(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text)


def fake_proc(tmp_path, cgroup_lines, mount_lines, mem_available_kb=32 * 1024 * 1024):
    proc = tmp_path / "proc"
    _w(str(proc / "self" / "cgroup"), "\n".join(cgroup_lines) + "\n")
    _w(str(proc / "self" / "mountinfo"), "\n".join(mount_lines) + "\n")
    _w(str(proc / "meminfo"), f"MemTotal: 99999999 kB\nMemFree: 1 kB\nMemAvailable: {mem_available_kb} kB\n")
    return str(proc)


V2_MOUNT = "41 31 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 cgroup2 rw"
V1_MOUNT = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"


def test_imports_stay_torch_free():
    code = ("import sys; import sglang_hydra.memory.hostmem, sglang_hydra.memory.geometry, sglang_hydra.memory.errors;"
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_v2_walks_up_and_takes_tightest(tmp_path):
    proc = fake_proc(tmp_path, ["0::/a/b"], [V2_MOUNT])
    root = tmp_path / "sys_root"
    cg = root / "sys/fs/cgroup"
    # leaf: memory.max 'max' skipped, memory.high 8 GiB; usage 3 GiB with 1 GiB page cache
    _w(str(cg / "a/b/memory.max"), "max\n")
    _w(str(cg / "a/b/memory.high"), str(8 * GiB))
    _w(str(cg / "a/b/memory.current"), str(3 * GiB))
    _w(str(cg / "a/b/memory.stat"), f"anon 1\nactive_file {GiB // 2}\ninactive_file {GiB // 2}\n")
    # parent: 6 GiB limit, 5 GiB used, no cache  -> 1 GiB headroom (the tightest)
    _w(str(cg / "a/memory.max"), str(6 * GiB))
    _w(str(cg / "a/memory.current"), str(5 * GiB))
    info = hostmem.probe_host_memory(proc, str(root))
    assert info.meminfo_available == 32 * GiB
    assert info.cgroup_headroom == 1 * GiB
    assert info.available == 1 * GiB
    assert info.cgroup_limit == 6 * GiB
    leaf = [l for l in info.limits if l.path.endswith("a/b/memory.high")][0]
    assert leaf.headroom == 8 * GiB - (3 * GiB - GiB)   # page cache credited
    assert len(info.limits) == 2


def test_v2_memory_min_below_drops_page_cache_credit(tmp_path):
    proc = fake_proc(tmp_path, ["0::/a"], [V2_MOUNT])
    root = tmp_path / "r"
    cg = root / "sys/fs/cgroup"
    _w(str(cg / "a/memory.max"), str(8 * GiB))
    _w(str(cg / "a/memory.current"), str(3 * GiB))
    _w(str(cg / "a/memory.stat"), f"active_file {GiB}\ninactive_file {GiB}\n")
    _w(str(cg / "a/child/memory.min"), str(GiB))
    info = hostmem.probe_host_memory(proc, str(root))
    assert info.cgroup_headroom == 5 * GiB        # 8 - 3, no credit
    _w(str(cg / "a/child/memory.min"), "0")
    assert hostmem.probe_host_memory(proc, str(root)).cgroup_headroom == 7 * GiB


def test_v1_limit_and_cache_and_unlimited(tmp_path):
    proc = fake_proc(tmp_path, ["9:name=systemd:/", "4:memory:/docker/x", "3:cpu:/"], [V1_MOUNT])
    root = tmp_path / "r"
    cg = root / "sys/fs/cgroup/memory"
    _w(str(cg / "docker/x/memory.limit_in_bytes"), str(4 * GiB))
    _w(str(cg / "docker/x/memory.usage_in_bytes"), str(3 * GiB))
    _w(str(cg / "docker/x/memory.stat"), f"cache 5\ntotal_active_file {GiB}\ntotal_inactive_file {GiB}\n")
    _w(str(cg / "docker/memory.limit_in_bytes"), "9223372036854771712")  # v1 'no limit'
    _w(str(cg / "memory.limit_in_bytes"), "9223372036854771712")
    info = hostmem.probe_host_memory(proc, str(root))
    assert info.cgroup_headroom == 4 * GiB - (3 * GiB - 2 * GiB)
    assert info.available == 3 * GiB
    assert len(info.limits) == 1


def test_headroom_clamped_at_zero_and_usage_below_cache(tmp_path):
    proc = fake_proc(tmp_path, ["0::/"], [V2_MOUNT])
    root = tmp_path / "r"
    cg = root / "sys/fs/cgroup"
    _w(str(cg / "memory.max"), str(GiB))
    _w(str(cg / "memory.current"), str(3 * GiB))
    info = hostmem.probe_host_memory(proc, str(root))
    assert info.available == 0


def test_no_procfs_and_no_limits(tmp_path):
    info = hostmem.probe_host_memory(str(tmp_path / "nothing"), "")
    assert info.cgroup_headroom is None and info.note == "no procfs"
    proc = fake_proc(tmp_path, ["0::/"], [V2_MOUNT])
    (tmp_path / "r/sys/fs/cgroup").mkdir(parents=True)
    info = hostmem.probe_host_memory(proc, str(tmp_path / "r"))
    assert info.available == 32 * GiB and info.cgroup_limit is None


def test_unlocatable_cgroup_falls_back_or_errors(tmp_path):
    proc = fake_proc(tmp_path, ["0::/gone"], [V2_MOUNT])
    info = hostmem.probe_host_memory(proc, str(tmp_path / "empty"), allow_cgroup_fallback=True)
    assert info.available == 32 * GiB and "cgroup probe failed" in info.note
    with pytest.raises(MemorySetupError) as ei:
        hostmem.probe_host_memory(proc, str(tmp_path / "empty"), allow_cgroup_fallback=False)
    assert ei.value.key == "memory.hicache_size" and ei.value.flag == "--hicache-size"


def test_budget_reserve_and_ranks():
    info = hostmem.HostMemoryInfo.fixed(30 * GiB)
    assert hostmem.host_memory_budget_bytes(info) == 20 * GiB
    assert hostmem.host_memory_budget_bytes(info, ranks=4) == 5 * GiB
    assert hostmem.host_memory_budget_bytes(hostmem.HostMemoryInfo.fixed(GiB)) < 0
    assert hostmem.ranks_per_host(8, 1, 2) == 4 and hostmem.ranks_per_host(1, 1, 4) == 1


def test_auto_size_ratio():
    assert hostmem.auto_size_ratio(2.0, 100 * GiB, GiB) == 2.0
    assert hostmem.auto_size_ratio(2.0, 10 * GiB, 10 * GiB) == pytest.approx(0.95)
    with pytest.raises(MemorySetupError) as ei:
        hostmem.auto_size_ratio(2.0, -5, GiB)
    assert "10 GiB" in ei.value.message and ei.value.key == "memory.hicache_host_memory_fraction"


def test_host_pool_tokens_rounding():
    assert hostmem.host_pool_tokens(page_size=16, size_per_token=64, device_tokens=1000, ratio=2.0) == (2016, 126)
    # hicache_size wins: 1 GB / 1000 B per token = 1_000_000 tokens -> 62500 pages + 1
    assert hostmem.host_pool_tokens(page_size=16, size_per_token=1000, device_tokens=10, ratio=2.0,
                                    hicache_size_gb=1) == (62501 * 16, 62501)


def test_not_enough_host_memory_message():
    with pytest.raises(MemorySetupError) as ei:
        hostmem.check_host_request(3_456_000_000, 1_230_000_000, "hicache_size")
    assert "3.46 GB" in ei.value.message and "1.23 GB" in ei.value.message
    assert ei.value.flag == "--hicache-size"
    hostmem.check_host_request(5, 5)
