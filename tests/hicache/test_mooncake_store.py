"""``mooncake`` L3 storage against a real Mooncake master on a free 127.0.0.1 port.

The fixture starts ``mooncake_master`` (from the mooncake-transfer-engine-non-cuda wheel) and a
small process that holds the pool memory, so the clients here (``global_segment_size=0``) move
every page over the TCP transfer engine to another process. Everything is stopped at the end of
the module. Skipped when ``mooncake.store`` cannot be imported (the tests of the error messages
run anyway).
"""
import socket
import sys
import time
import warnings

import pytest
import torch

from sglang_hydra.cache.storage import StorageConfig, StorageError, create_storage_backend, page_hashes
from sglang_hydra.cache.mooncake_master import MooncakeMaster
from sglang_hydra.cache.storage_mooncake import (HEADER_BYTES, MooncakeStore, MooncakeStoreSettings,
                                                 mooncake_store_available, parse_segment_size)

needs_mooncake = pytest.mark.skipif(not mooncake_store_available(),
                                    reason="mooncake.store not importable (pip install "
                                           "mooncake-transfer-engine-non-cuda; apt-get install libibverbs1)")
PB = 16 << 10          # page bytes for the direct tests


@pytest.fixture(scope="module")
def master():
    if not mooncake_store_available():
        pytest.skip("mooncake.store not importable")
    m = MooncakeMaster(segment_size=64 << 20, startup_timeout=10.0)
    m.start()
    try:
        yield m
    finally:
        m.stop()
    assert m.proc is None and m.holder is None


@pytest.fixture(scope="module")
def store(master):
    st = create_storage_backend("mooncake", StorageConfig(
        model_name="org/model", page_bytes=PB, extra_config=master.extra_config(global_segment_size=0)))
    try:
        yield st
    finally:
        st.close()


def _pages(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (PB,), dtype=torch.uint8, generator=g) for _ in range(n)]


# ----------------------------------------------------------------- data path
@needs_mooncake
def test_batch_set_get_exists_byte_identity(store):
    keys = page_hashes([(i,) for i in range(12)], "ab" * 32)
    vals = _pages(12, 0)
    vals[3] = vals[3].view(torch.float16).clone()          # any dtype: stored as its bytes
    vals[4] = vals[4].view(torch.bfloat16).reshape(8, -1).clone()
    assert store.batch_set(keys, vals)
    assert store.batch_exists(keys) == 12
    got = store.batch_get(keys)
    for v, g in zip(vals, got):
        assert g is not None and g.dtype == torch.uint8
        assert torch.equal(g, v.contiguous().view(torch.uint8).reshape(-1))
    # the reference's key scheme: {model}_{hash}_{tp_rank} (one object per page here)
    assert store.key(keys[0]) == f"org-model_{keys[0]}_0"
    assert store._store.is_exist(store.key(keys[0])) == 1
    st = store.get_stats()
    assert st["get_hit"] >= 12 and st["bytes_written"] >= 12 * PB and st["corrupt"] == 0


@needs_mooncake
def test_miss_for_unknown_keys(store):
    k = page_hashes([(i,) for i in range(3)], "cd" * 32)
    assert store.batch_set([k[0], k[2]], _pages(2, 1))
    assert store.get("f" * 64) is None
    assert store.batch_get(["e" * 64, k[0]])[0] is None
    assert not store.exists("e" * 64)
    assert store.batch_exists(k) == 1               # leading run stops at the missing page
    assert store.batch_exists([]) == 0


@needs_mooncake
def test_present_key_is_not_rewritten(store):
    a, b = _pages(2, 2)
    assert store.set("77" * 32, a)
    assert store.set("77" * 32, b)                  # like the file backend: True, no rewrite
    assert torch.equal(store.get("77" * 32), a)


@needs_mooncake
@pytest.mark.parametrize("damage,reason", [
    ("flip", "checksum mismatch"), ("truncate", "truncated"), ("grow", "larger than a page"),
    ("garbage", "bad magic")])
def test_corrupted_object_is_a_miss_with_warning(store, damage, reason):
    key = f"{damage:0<64}"[:64]
    (v,) = _pages(1, 3)
    assert store.set(key, v)
    raw = bytearray(store._store.get(store.key(key)))
    assert len(raw) == HEADER_BYTES + PB
    if damage == "flip":
        raw[HEADER_BYTES + 100] ^= 0xFF
    elif damage == "truncate":
        raw = raw[:-10]
    elif damage == "grow":
        raw += b"\0" * 64
    else:
        raw[:8] = b"\xff" * 8
    assert store._store.upsert(store.key(key), bytes(raw)) == 0
    n = store.stats["corrupt"]
    with pytest.warns(RuntimeWarning, match=reason):
        assert store.get(key) is None
    assert store.stats["corrupt"] == n + 1
    assert not store.exists(key)                    # removed, so a later write can replace it
    assert store.set(key, v) and torch.equal(store.get(key), v)


# ----------------------------------------------------------------- HiCache on top
@needs_mooncake
def test_hicache_pages_come_back_from_l3_byte_identical(master):
    from sglang_hydra.cache.hicache import HiCache
    from sglang_hydra.config.testing import make_record
    from sglang_hydra.memory import build_memory

    ps = 16
    rec = make_record(enable_hierarchical_cache=True, hicache_ratio=2.0, max_total_tokens=2 * ps,
                      page_size=ps, hicache_write_policy="write_through", hicache_io_backend="direct")
    mem = build_memory(rec)
    # page_bytes left unknown (0): the backend asks the master for each object's size
    st = MooncakeStore(StorageConfig(model_name="hicache-test", extra_config=master.extra_config(
        global_segment_size=0, extra_backend_tag="t1")))
    try:
        c = HiCache(mem, write_policy="write_through", storage=st, prefetch_threshold=ps)
        a = page_hashes([(1,), (2,)])
        c.serve(a)
        assert c.stats["storage_write_pages"] == 2 and st.batch_exists(a) == 2
        for base in range(10, 40, 2):               # push a out of device and host
            c.serve(page_hashes([(base,), (base + 1,)]))
        assert a[0] not in c.nodes
        out = c.serve(a)                            # prefetched from L3, compared with the expected bytes
        assert out["storage"] == 2
        assert c.stats["verify_mismatch_pages"] == 0 and c.stats["verified_pages"] > 0
        assert st.key(a[0]).startswith("t1_hicache-test_")
        c.check_invariants()
    finally:
        st.close()


# ----------------------------------------------------------------- errors
def _dead_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_mooncake
def test_unreachable_master_is_a_clear_error():
    port = _dead_port()
    t0 = time.perf_counter()
    with pytest.raises(StorageError, match=r"MOONCAKE_MASTER.*--serve"):
        create_storage_backend("mooncake", StorageConfig(extra_config={
            "master_server_address": f"127.0.0.1:{port}", "global_segment_size": 0}))
    assert time.perf_counter() - t0 < 5         # setup() alone would retry for ~90 s


@needs_mooncake
def test_http_port_is_not_taken_for_the_master():
    import http.server
    import threading
    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        with pytest.raises(StorageError, match="answers HTTP"):
            MooncakeStore(StorageConfig(extra_config={
                "master_server_address": f"127.0.0.1:{srv.server_address[1]}"}))
    finally:
        srv.shutdown()
        srv.server_close()


def test_missing_master_address(monkeypatch):
    monkeypatch.delenv("MOONCAKE_MASTER", raising=False)
    monkeypatch.delenv("SGLANG_HICACHE_MOONCAKE_CONFIG_PATH", raising=False)
    with pytest.raises(StorageError, match=r"(MOONCAKE_MASTER|mooncake-transfer-engine)"):
        create_storage_backend("mooncake")


def test_missing_package_names_the_wheel_and_libibverbs(monkeypatch):
    monkeypatch.setitem(sys.modules, "mooncake.store", None)     # import fails as if absent
    with pytest.raises(StorageError, match=r"pip install mooncake-transfer-engine-non-cuda.*libibverbs1"):
        create_storage_backend("mooncake", StorageConfig(extra_config={"master_server_address": "127.0.0.1:1"}))


def test_settings_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("SGLANG_HICACHE_MOONCAKE_CONFIG_PATH", raising=False)
    monkeypatch.setenv("MOONCAKE_MASTER", "10.0.0.1:50051")
    monkeypatch.setenv("MOONCAKE_GLOBAL_SEGMENT_SIZE", "2gb")
    monkeypatch.setenv("MOONCAKE_PROTOCOL", "rdma")
    s = MooncakeStoreSettings.resolve({"protocol": "tcp"})
    assert (s.master_server_address, s.global_segment_size, s.protocol) == ("10.0.0.1:50051", 2 << 30, "tcp")
    cfg = tmp_path / "mc.json"
    cfg.write_text('{"master_server_address": "10.0.0.2:1", "device_name": "mlx5_0"}')
    monkeypatch.setenv("SGLANG_HICACHE_MOONCAKE_CONFIG_PATH", str(cfg))
    s = MooncakeStoreSettings.resolve({})
    assert s.master_server_address == "10.0.0.2:1" and s.device_name == "mlx5_0"
    assert parse_segment_size("4gb") == 4 << 30 and parse_segment_size("64Mi") == 64 << 20
    assert parse_segment_size(0) == 0 and parse_segment_size(123) == 123
    with pytest.raises(StorageError, match="checksum"):
        MooncakeStoreSettings.resolve({"checksum": "md5"})


@needs_mooncake
def test_master_helper_stops_everything():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with MooncakeMaster() as m:
            pid, port = m.proc.pid, m.port
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                pass
        assert m.proc is None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    with pytest.raises(ProcessLookupError):
        import os
        os.kill(pid, 0)


@needs_mooncake
def test_master_loss_turns_l3_into_fast_misses():
    """A dead master: RPC_FAIL -> warning, then misses / failed writes without the ~4 s
    reconnect per call; a master restarted on the same port is used again (with no data)."""
    m = MooncakeMaster().start()
    m2 = None
    st = MooncakeStore(StorageConfig(page_bytes=PB, extra_config=m.extra_config(
        global_segment_size="16Mi", retry_interval=0.3)))
    try:
        (v,) = _pages(1, 4)
        assert st.set("aa" * 32, v)
        m.proc.kill()
        m.proc.wait()
        with pytest.warns(RuntimeWarning, match="RPC_FAIL"):
            assert st.batch_exists(["aa" * 32]) == 0
        # once the loss is known, the next calls are fast misses: four calls that each paid the
        # ~4 s reconnect would take 16 s; the bound leaves room for a loaded 2-core machine
        t0 = time.perf_counter()
        assert not st.set("bb" * 32, v) and st.get("aa" * 32) is None
        time.sleep(0.35)                         # past retry_interval: a TCP probe, not a 4 s RPC
        assert st.get("aa" * 32) is None and st.batch_exists(["aa" * 32]) == 0
        assert time.perf_counter() - t0 < 3.0
        assert st.stats["rpc_fail"] >= 1
        m2 = MooncakeMaster(port=m.port).start()
        time.sleep(0.35)
        deadline = time.monotonic() + 8
        while True:     # the first call may still fail on the old connection (then retry_interval)
            n = st.stats["rpc_fail"]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                hit = st.batch_exists(["aa" * 32])
            if st.stats["rpc_fail"] == n and st._available():
                break
            assert time.monotonic() < deadline, "the restarted master was never used"
            time.sleep(0.35)
        assert hit == 0                                    # answered by the new master (data is gone)
        # writes succeed again once the client's heartbeat re-mounts its segment (0.6-4 s here)
    finally:
        st.close()
        m.stop()
        if m2 is not None:
            m2.stop()
