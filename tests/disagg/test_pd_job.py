"""job=pd's verdict, with the transfer replaced by canned results (the real runs are in tests/e2e)."""
import json

import pytest

from sglang_hydra.config.errors import ConfigError
from sglang_hydra.disagg import workers
from sglang_hydra.disagg.decode_side import PeerConfigError
from sglang_hydra.jobs import pd_transfer as job_pd
from sglang_hydra.jobs.context import JobContext

from .conftest import make_rec


def _side(n=3, checksum=True, verified=True, status="Success"):
    reqs = [workers.RequestResult(room=i, status=status, pages=4, bytes=4096, latency_s=0.01,
                             checksum=checksum, verified=verified,
                             reason=None if status == "Success" else "boom") for i in range(1, n + 1)]
    return workers.SideResult("decode", "zmq", {}, {}, requests=reqs, wall_s=1.0, transfer_s=0.5)


def _run(monkeypatch, tmp_path, side=None, exc=None, checksum=True):
    def fake_run_decode(*a, **k):
        if exc is not None:
            raise exc
        return side
    monkeypatch.setattr(workers, "run_decode", fake_run_decode)
    rec = make_rec("zmq", mode="decode", checksum=checksum)
    return job_pd.run_side(rec, {"prefill": "127.0.0.1:1", "requests": 3, "verify": True}, JobContext(tmp_path))


def test_all_checked_and_ok_passes_and_writes_the_requests_to_a_file(monkeypatch, tmp_path, capsys):
    metrics = _run(monkeypatch, tmp_path, _side())
    assert metrics["succeeded"] == 3 and metrics["failed"] == 0
    data = json.loads((tmp_path / "decode.json").read_text())
    assert [r["room"] for r in data["requests"]] == [1, 2, 3]
    out = capsys.readouterr().out
    assert "checksum ok / checked" in out and "3/3" in out and '"room"' not in out


def test_failed_requests_exit_1_with_the_reasons(monkeypatch, tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        _run(monkeypatch, tmp_path, _side(status="Failed", checksum=None, verified=None))
    assert ei.value.code == 1
    err = capsys.readouterr().err
    assert "3 request(s) failed" in err and "room 1: boom" in err


def test_unchecked_transfers_with_checksums_on_are_a_failure(monkeypatch, tmp_path, capsys):
    with pytest.raises(SystemExit) as ei:
        _run(monkeypatch, tmp_path, _side(checksum=None))
    assert ei.value.code == 1
    assert "3 transferred request(s) were not checked (checksum)" in capsys.readouterr().err
    assert _run(monkeypatch, tmp_path, _side(checksum=None), checksum=False)["failed"] == 0   # checksums off
    out = capsys.readouterr().out
    assert "checksum ok / checked           off" in out and "0/0" not in out


def test_an_inconsistent_peer_is_a_config_error(monkeypatch, tmp_path):
    with pytest.raises(ConfigError) as ei:
        _run(monkeypatch, tmp_path, exc=PeerConfigError("disaggregation_enable_kv_checksum", "on here, off there"))
    assert ei.value.key == "disagg.disaggregation_enable_kv_checksum"
    assert ei.value.flag == "--disaggregation-enable-kv-checksum"


def test_a_bad_environment_value_is_a_config_error(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE", "maybe")
    from sglang_hydra.disagg.envs import DisaggEnv
    with pytest.raises(ConfigError, match="SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"):
        _run_env(monkeypatch, tmp_path, DisaggEnv)


def _run_env(monkeypatch, tmp_path, env_cls):
    monkeypatch.setattr(workers, "run_decode", lambda *a, **k: env_cls.from_env())
    return job_pd.run_side(make_rec("zmq", mode="decode"), {"prefill": "127.0.0.1:1"}, JobContext(tmp_path))
