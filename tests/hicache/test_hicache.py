"""HiCache tiers, write policies, storage integrity, prefetch policies, full replay."""
import json
import os
import warnings

import pytest
import torch

from sglang_hydra.cache.hicache import HiCache
from sglang_hydra.cache.storage import (FileStorage, SimStorage, StorageConfig, StorageError,
                                        create_storage_backend, page_hashes, register_storage_backend)
from sglang_hydra.config.testing import make_record
from sglang_hydra.memory import build_memory

PS = 16


def _mem(tmp_path, wp="write_through", dev_pages=8, ratio=2.0, layout=None, io="direct"):
    kw = dict(enable_hierarchical_cache=True, hicache_ratio=ratio, max_total_tokens=dev_pages * PS,
              page_size=PS, hicache_write_policy=wp, hicache_io_backend=io)
    if layout:
        kw["hicache_mem_layout"] = layout
    return build_memory(make_record(**kw))


def _keys(ids, prior=None):
    return page_hashes([(i,) for i in ids], prior)


def _cache(tmp_path, wp="write_through", storage=None, **kw):
    mem = _mem(tmp_path, wp, dev_pages=kw.pop("dev_pages", 8))
    return HiCache(mem, write_policy=wp, storage=storage, prefetch_threshold=kw.pop("prefetch_threshold", PS), **kw)


# ----------------------------------------------------------------- keys
def test_page_hashes_chain():
    a = _keys([1, 2, 3])
    b = _keys([9, 2, 3])
    assert len(a[0]) == 64 and a[0] != b[0] and a[1] != b[1]   # every key commits to its prefix
    assert _keys([2, 3], a[0]) == a[1:]


# ----------------------------------------------------------------- write policies
def test_write_through_backs_up_at_insert(tmp_path):
    c = _cache(tmp_path, "write_through")
    ks = _keys([1, 2, 3])
    c.serve(ks)
    assert all(c.tier_of(k) == "device+host" for k in ks)
    assert c.stats["backup_pages"] == 3


def test_selective_needs_second_use(tmp_path):
    c = _cache(tmp_path, "write_through_selective")
    ks = _keys([1, 2, 3])
    c.serve(ks)
    assert all(c.tier_of(k) == "device" for k in ks)
    c.serve(ks[:2])                     # second insert walking past pages 1, 2
    assert [c.tier_of(k) for k in ks] == ["device+host", "device+host", "device"]


def test_write_back_copies_only_on_eviction(tmp_path):
    c = _cache(tmp_path, "write_back", dev_pages=4)
    a = _keys([1, 2, 3])
    c.serve(a)
    assert c.stats["backup_pages"] == 0
    c.serve(_keys([7, 8, 9]))          # needs 3 pages, only 1 free -> evict 2 leaves of a
    assert c.stats["backup_pages"] == 2 and c.stats["device_demoted_pages"] == 2
    assert c.tier_of(a[0]) == "device" and c.tier_of(a[2]) == "host"
    c.check_invariants()


def test_write_through_eviction_keeps_host_copy_and_loads_back(tmp_path):
    c = _cache(tmp_path, "write_through", dev_pages=4)
    a = _keys([1, 2, 3])
    c.serve(a)
    c.serve(_keys([7, 8, 9]))
    assert c.tier_of(a[2]) == "host"
    out = c.serve(a)                   # host hit -> load back through memory.transfer
    assert out["device"] + out["host"] == 3 and out["host"] >= 1
    assert c.stats["verified_pages"] >= out["host"] and c.stats["verify_mismatch_pages"] == 0
    for k in a:
        n = c.nodes[k]
        assert torch.equal(c.read_device_page(n.device[0]), c.expected_page(k))
    c.check_invariants()


def test_host_eviction(tmp_path):
    c = _cache(tmp_path, "write_through", dev_pages=2)   # host = 4 pages
    for base in range(0, 40, 2):
        c.serve(_keys([base, base + 1]))
    assert c.stats["host_evicted_pages"] > 0
    # what the host pool says is in use is exactly what the tree keeps there, and that is what
    # was written minus what was evicted: an eviction that forgot to free (or freed twice) shows
    host_pages = c.hpool.size // PS
    on_host = sum(1 for n in c.nodes.values() if getattr(n, "host", None) is not None)
    assert host_pages - c.hpool.available_size() // PS == on_host
    assert on_host == c.stats["host_written_pages"] - c.stats["host_evicted_pages"]
    assert 0 < on_host <= host_pages
    assert {c.tier_of(k) for k in _keys([0, 1])} == {"none"}          # the oldest prefix left every tier
    assert all("host" in c.tier_of(k) for k in _keys([38, 39]))      # the newest is still on host
    c.check_invariants()


def test_invalid_write_policy(tmp_path):
    with pytest.raises(ValueError, match="Invalid write policy"):
        HiCache(_mem(tmp_path), write_policy="write_sometimes")


@pytest.mark.parametrize("layout,io", [("layer_first", "direct"), ("page_first_direct", "direct"),
                                       ("page_head", "kernel"), ("page_first", "kernel")])
def test_device_host_device_identity_layouts(tmp_path, layout, io):
    # every combination here is a supported one: a setup error is a failure, not a skip
    mem = _mem(tmp_path, "write_through", dev_pages=4, layout=layout, io=io)
    c = HiCache(mem, write_policy="write_through")
    a = _keys([1, 2, 3])
    c.serve(a)
    c.serve(_keys([5, 6, 7]))
    c.serve(a)
    assert c.stats["verify_mismatch_pages"] == 0 and c.stats["verified_pages"] > 0


def test_unsupported_layout_io_pair_is_a_clear_error(tmp_path):
    with pytest.raises(Exception, match="page_head.*direct"):
        _mem(tmp_path, "write_through", dev_pages=4, layout="page_head", io="direct")


# ----------------------------------------------------------------- storage
def _fs(tmp_path, **extra):
    return FileStorage(StorageConfig(model_name="m/x", extra_config={"file_storage_path": str(tmp_path), **extra}))


def test_file_dir_precedence(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", str(tmp_path / "env"))
    assert _fs(tmp_path / "cfg").dir == str(tmp_path / "env")
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR")
    assert _fs(tmp_path / "cfg").dir == str(tmp_path / "cfg")
    assert os.path.basename(FileStorage(StorageConfig()).dir) == "hicache"


def test_file_roundtrip_names_and_no_tmp(tmp_path):
    fs = _fs(tmp_path)
    v = torch.arange(256, dtype=torch.uint8)
    k = _keys([1])[0]
    assert fs.set(k, v) and fs.exists(k)
    assert os.path.basename(fs.path(k)) == f"{k}_m-x_0_1.bin"
    assert torch.equal(fs.get(k), v)
    assert fs.batch_exists([k, _keys([2])[0], k]) == 1
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupted_file_is_a_miss(tmp_path, damage):
    fs = _fs(tmp_path)
    k = _keys([1])[0]
    fs.set(k, torch.arange(200, dtype=torch.uint8))
    p = fs.path(k)
    data = bytearray(open(p, "rb").read())
    if damage == "truncate":
        data = data[:-10]
    elif damage == "flip":
        data[-1] ^= 0xFF
    else:
        data = b""
    open(p, "wb").write(bytes(data))
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert fs.get(k) is None
    assert fs.stats["corrupt"] == 1


def test_size_cap_lru(tmp_path):
    fs = _fs(tmp_path, max_size=3 * 300)
    ks = _keys(range(5))
    for k in ks:
        fs.set(k, torch.zeros(256, dtype=torch.uint8))
    assert fs.total <= 900 and fs.stats["evicted"] > 0 and fs.exists(ks[-1]) and not fs.exists(ks[0])
    with pytest.warns(RuntimeWarning):
        assert not fs.set(_keys([99])[0], torch.zeros(2000, dtype=torch.uint8))


def test_unwritable_dir(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    with pytest.warns(RuntimeWarning):
        fs = FileStorage(StorageConfig(extra_config={"file_storage_path": str(blocker / "sub")}))
    assert not fs.set("ab" * 32, torch.zeros(4, dtype=torch.uint8))


def test_registry_errors():
    with pytest.raises(StorageError, match="mooncake-transfer-engine"):
        create_storage_backend("mooncake")
    with pytest.raises(StorageError, match="Unknown storage backend"):
        create_storage_backend("nope")
    b = create_storage_backend("dynamic", StorageConfig(extra_config={
        "module_path": "sglang_hydra.cache.storage", "class_name": "SimStorage"}))
    assert isinstance(b, SimStorage)


def test_host_storage_host_identity_and_corruption(tmp_path):
    fs = _fs(tmp_path / "s")
    c = _cache(tmp_path, "write_through", storage=fs, dev_pages=2)   # host 4 pages
    a = _keys([1, 2])
    c.serve(a)
    assert c.stats["storage_write_pages"] == 2
    for base in range(10, 40, 2):                  # push a out of device and host
        c.serve(_keys([base, base + 1]))
    assert a[0] not in c.nodes
    out = c.serve(a)
    assert out["storage"] == 2 and c.stats["verify_mismatch_pages"] == 0
    # corrupt everything on disk for a fresh prefix: the replay continues with misses
    b = _keys([100, 101])
    c.serve(b)
    for base in range(200, 240, 2):
        c.serve(_keys([base, base + 1]))
    for k in b:
        with open(fs.path(k), "r+b") as fh:
            fh.seek(40)
            fh.write(b"\x00\xff" * 8)
    with pytest.warns(RuntimeWarning, match="corrupt"):
        out = c.serve(b)
    assert out["storage"] == 0 and c.stats["verify_mismatch_pages"] == 0
    c.check_invariants()


# ----------------------------------------------------------------- prefetch policies
# Prefetch progress is modelled from the storage read bandwidth, never from the wall clock
# (the old tests slept in the backend and measured elapsed time): 20 pages/s here, so the
# 8 stored pages need 0.4 s.
def _prefetch_case(tmp_path, policy, admit_at=0.0, **kw):
    st = SimStorage()
    probe = _cache(tmp_path, "write_through", dev_pages=16)
    c = _cache(tmp_path, "write_through", storage=st, dev_pages=16, prefetch_policy=policy,
               storage_read_bytes_per_s=20 * probe.page_bytes, **kw)
    ks = _keys(range(8))
    for k in ks:
        st.set(k, c.expected_page(k))
    c.arrive("r", ks, now_s=0.0)
    c.scheduling_pass(["r"], now_s=admit_at)
    return c.admit("r", now_s=admit_at), c


def test_prefetch_wait_complete(tmp_path):
    out, c = _prefetch_case(tmp_path, "wait_complete")
    assert out["storage"] == 8 and out["storage_wait_s"] == pytest.approx(0.4)
    assert c.stats["prefetch_completed"] == 1 and c.stats["verify_mismatch_pages"] == 0


def test_prefetch_best_effort(tmp_path):
    out, c = _prefetch_case(tmp_path, "best_effort")
    assert out["storage"] == 0 and out["storage_wait_s"] == 0 and c.stats["prefetch_terminated"] == 1
    out, c = _prefetch_case(tmp_path, "best_effort", admit_at=0.25)    # 5 pages landed by then
    assert out["storage"] == 5 and out["storage_wait_s"] == 0


def test_prefetch_timeout_formula(tmp_path):
    # base 0.12 s + (128 tokens // 16) pages * (16/1024 * 0.64) s/page = 0.2 s -> 4 of 8 pages
    out, c = _prefetch_case(tmp_path, "timeout", prefetch_timeout_base=0.12,
                            prefetch_timeout_per_ki_token=0.64)
    assert c.prefetch_timeout(128) == pytest.approx(0.2)
    assert out["storage"] == 4 and out["storage_wait_s"] == pytest.approx(0.2)
    assert c.stats["prefetch_terminated"] == 1
    c.check_invariants()


# ----------------------------------------------------------------- buffer_only
def test_buffer_only(tmp_path):
    st = SimStorage()
    mem = _mem(tmp_path, "write_back", dev_pages=2)
    c = HiCache(mem, write_policy="write_back", host_mode="buffer_only", storage=st, prefetch_threshold=PS)
    assert c.write_policy == "write_through"
    a = _keys([1, 2])
    c.serve(a)
    assert all(n.host is None for n in c.nodes.values())
    assert st.exists(a[0]) and st.exists(a[1])
    assert c.hpool.available_size() == c.hpool.size    # staging freed
    c.serve(_keys([5, 6]))                              # a evicted from device (deleted)
    assert c.evict_host(64) == 0
    out = c.serve(a)
    assert out["storage"] == 2 and c.stats["verify_mismatch_pages"] == 0
    assert c.hpool.available_size() == c.hpool.size
    with pytest.raises(ValueError):
        HiCache(_mem(tmp_path), host_mode="buffer_only")


# ----------------------------------------------------------------- full replay
def test_full_replay_small(tmp_path):
    from sglang_hydra.workload.full_replay import full_replay
    from sglang_hydra.workload.trace import load_trace
    tr = load_trace()
    rec = make_record(enable_hierarchical_cache=True, hicache_ratio=2.0, max_total_tokens=4096 * PS, page_size=PS,
                      hicache_write_policy="write_through", hicache_storage_backend="file", hicache_io_backend="direct",
                      hicache_storage_backend_extra_config=json.dumps({"file_storage_path": str(tmp_path),
                                                                       "prefetch_threshold": 32}))
    r1 = full_replay(rec, tr, max_requests=15)
    r2 = full_replay(rec, tr, max_requests=15)    # second pass: storage is warm
    d = r2.to_dict()
    json.dumps(d)
    assert r2.verify_mismatch_pages == 0 and r2.verified_pages > 0
    assert r2.hit_tokens["storage"] > 0 and r2.token_hit_rate >= r1.token_hit_rate
    assert "h2d" in r2.bandwidth_gbps and "storage_read" in r2.bandwidth_gbps
    assert r2.ttft_ms_p50 <= r2.ttft_ms_p90 <= r2.ttft_ms_p99
    assert all(isinstance(a, str) and isinstance(b, str) for a, b in r2.summary_rows())
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_full_replay_without_hicache():
    from sglang_hydra.workload.full_replay import full_replay
    from sglang_hydra.workload.trace import load_trace
    rec = make_record(max_total_tokens=4096 * PS, page_size=PS)
    r = full_replay(rec, load_trace(), max_requests=10)
    assert r.requests == 10 and r.hit_rate["host"] == 0.0
