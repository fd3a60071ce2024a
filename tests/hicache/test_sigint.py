"""Ctrl-C during a replay that writes to the file storage: no temp files, intact pages,
exit code 130 with a one-line message."""
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from sglang_hydra.cache.storage import FileStorage, StorageConfig, check_page_file, page_hashes


def _temps(d):
    return [f for f in os.listdir(d) if f.endswith(".tmp")]


def test_interrupted_write_leaves_no_temp_file(tmp_path, monkeypatch):
    fs = FileStorage(StorageConfig(model_name="m", extra_config={"file_storage_path": str(tmp_path)}))
    k1, k2 = page_hashes([(1,), (2,)])
    assert fs.set(k1, torch.arange(64, dtype=torch.uint8))

    def interrupted_replace(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted_replace)
    with pytest.raises(KeyboardInterrupt):
        fs.set(k2, torch.arange(64, dtype=torch.uint8))
    monkeypatch.undo()
    assert _temps(tmp_path) == [] and not fs.exists(k2)
    assert check_page_file(fs.path(k1)) is None and fs.total == os.path.getsize(fs.path(k1))


def test_close_removes_temp_files_an_interrupt_left(tmp_path, monkeypatch):
    fs = FileStorage(StorageConfig(model_name="m", extra_config={"file_storage_path": str(tmp_path)}))
    real_remove = os.remove

    def remove_interrupted(path):       # the interrupt lands inside the cleanup itself
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(KeyboardInterrupt()))
    monkeypatch.setattr(os, "remove", remove_interrupted)
    with pytest.raises(KeyboardInterrupt):
        fs.set(page_hashes([(3,)])[0], torch.zeros(32, dtype=torch.uint8))
    monkeypatch.setattr(os, "remove", real_remove)
    assert len(_temps(tmp_path)) == 1
    fs.close()
    assert _temps(tmp_path) == []


def test_sigint_during_full_replay(tmp_path):
    store = tmp_path / "store"
    env = dict(os.environ, SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR=str(store))
    cmd = [sys.executable, "-m", "sglang_hydra", "job=replay", "memory=hicache_file", "job.mode=full", "hardware=h100_80gb",
           "job.progress=false", "schedule.page_size=16", "schedule.max_total_tokens=8192"]
    # a child of a non-interactive shell may inherit SIGINT ignored: give it the default back
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        # the start-up probe writes and deletes at most 4 x 32 pages: wait for replay pages
        while time.monotonic() < deadline and proc.poll() is None:
            if store.is_dir() and len(os.listdir(store)) > 250:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the replay ended before it could be interrupted"
        assert len(os.listdir(store)) > 250, "the replay did not start writing pages in time"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    err = err.decode()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    names = os.listdir(store)
    assert _temps(store) == [] and names
    bad = {n: check_page_file(store / n) for n in names}
    assert {n: p for n, p in bad.items() if p} == {}
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("metrics.json"))
