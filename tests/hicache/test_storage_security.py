"""The careless or malicious caller: storage keys, storage directories, store clearing,
and page keys that must not change between processes."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from sglang_hydra.cache.storage import (FileStorage, StorageConfig, StorageError, check_storage_key,
                                        default_file_storage_dir)


def _fs(path):
    return FileStorage(StorageConfig(model_name="m", extra_config={"file_storage_path": str(path)}))


@pytest.mark.parametrize("key", ["../../etc/passwd", "/etc/passwd", "..", "a/b", "ab\x00cd", "AB" * 4,
                                 "", "g" * 8, "a" * 129, 123, None, "ab cd"])
def test_keys_outside_the_hash_alphabet_are_refused(tmp_path, key):
    fs = _fs(tmp_path / "l3")
    v = torch.zeros(8, dtype=torch.uint8)
    for call in (lambda: fs.set(key, v), lambda: fs.get(key), lambda: fs.exists(key), lambda: fs.path(key)):
        with pytest.raises(ValueError, match="not a page key"):
            call()
    assert sorted(os.listdir(tmp_path)) == ["l3"] and os.listdir(tmp_path / "l3") == []


def test_page_keys_are_accepted():
    assert check_storage_key("0123456789abcdef" * 4) == "0123456789abcdef" * 4


def test_default_directory_is_private_to_the_user(tmp_path, monkeypatch):
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fs = FileStorage(StorageConfig())
    assert fs.dir == default_file_storage_dir() == str(tmp_path / "cache" / "sglang_hydra" / "hicache")
    assert not fs.dir.startswith("/tmp/hicache")
    assert os.stat(fs.dir).st_mode & 0o777 == 0o700


def test_world_writable_directory_is_refused(tmp_path):
    d = tmp_path / "shared"
    d.mkdir()
    os.chmod(d, 0o777)
    with pytest.raises(StorageError, match="writable by every user"):
        _fs(d)


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_directory_of_another_user_is_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 4242, 4242)
    with pytest.raises(StorageError, match="belongs to uid 4242"):
        _fs(d)


def test_mooncake_clear_without_prefix_is_refused():
    from sglang_hydra.cache.storage_mooncake import MooncakeStore

    class Recorder:
        calls = []

        def remove_by_regex(self, pattern, force):
            self.calls.append(pattern)

    store = MooncakeStore.__new__(MooncakeStore)       # no master needed: only clear() is exercised
    store._closed, store.prefix, store.suffix, store._store = False, "", "_0", Recorder()
    with pytest.raises(StorageError, match="without a key prefix"):
        store.clear()
    assert Recorder.calls == []
    store.prefix = "model_"
    store.clear()
    assert Recorder.calls == ["^model_.*_0$"]


_RUN = textwrap.dedent("""
    import json, sys
    from sglang_hydra.cache.bytes_mover import BytesMover
    from sglang_hydra.cache.policies import make_policy
    from sglang_hydra.cache.radix import chained_page_keys
    from sglang_hydra.cache.storage import FileStorage, StorageConfig
    from sglang_hydra.cache.tiered import TieredCache
    from sglang_hydra.config.testing import make_record
    from sglang_hydra.memory import build_memory

    rec = make_record(model_path="tiny", enable_hierarchical_cache=True, hicache_ratio=2.0,
                      max_total_tokens=64 * 16, page_size=16)
    mem = build_memory(rec)
    st = FileStorage(StorageConfig(model_name="tiny", extra_config={"file_storage_path": sys.argv[1]}))
    cache = TieredCache(BytesMover(mem, st), policy=make_policy("lru"), page_size=16, prefetch_threshold=16)
    keys = chained_page_keys(list(range(1000, 1000 + 8 * 16)), 16)
    cache.arrive("r", keys)
    cache.scheduling_pass(["r"])
    adm = cache.admit("r")
    print(json.dumps({"keys": [str(k) for k in keys], "storage": adm.storage_pages,
                      "written": cache.counts["storage_written_pages"],
                      "mismatch": cache.mover.stats["verify_mismatch_pages"]}))
    mem.close()
""")


def test_file_tier_hits_across_processes_with_different_hash_seeds(tmp_path):
    outs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        p = subprocess.run([sys.executable, "-c", _RUN, str(tmp_path / "l3")], env=env, capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        import json
        outs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    first, second = outs
    assert first["keys"] == second["keys"]
    assert first["written"] == 8 and first["storage"] == 0
    assert second["storage"] == 8 and second["written"] == 0 and second["mismatch"] == 0
