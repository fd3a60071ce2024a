"""job=pd / job=pd_pair through the real command line: failures are failures.

* a run whose requests fail exits 1 and says how many and why;
* the per-request results go to a JSON file in the output directory, the terminal gets a summary;
* a decode job whose prefill is killed mid-run ends quickly with exit 1 and no pages left in use;
* checksums on one side only is a configuration error (exit 2).
"""
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER = ROOT / "tests" / "disagg" / "peer.py"
# no decode retraction backup: its host pool would be sized from the machine's live free memory
NO_BACKUP = "disagg.disaggregation_decode_retraction_backup=none"
PAIR = ("model=tiny", "disagg.disaggregation_transfer_backend=zmq", "schedule.max_total_tokens=8192",
        "schedule.page_size=16", NO_BACKUP)


def cli(*args, cwd, env=None, timeout=240):
    e = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=e)


def _mooncake():
    from sglang_hydra.disagg.backends.mooncake import mooncake_available
    return mooncake_available()


def test_pd_pair_with_failed_requests_exits_1(tmp_path):
    r = cli("job=pd_pair", *PAIR, "job.requests=6", "job.timeout=90", f"hydra.run.dir={tmp_path}/run",
            cwd=tmp_path, env={"SGLANG_TEST_DISAGG_FAILURE_PROB": "1.0"}, timeout=150)
    assert r.returncode == 1, r.stdout + r.stderr
    # prefill fails its side of every request (injected) and ends; decode then finds it gone
    assert "6 request(s) failed" in r.stderr and "room 1: " in r.stderr
    assert "Traceback" not in r.stderr


def test_pd_pair_writes_requests_to_a_file_and_a_summary_to_the_terminal(tmp_path):
    r = cli("job=pd_pair", *PAIR, "job.requests=30", "disagg.disaggregation_enable_kv_checksum=true",
            "job.timeout=90", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path, timeout=150)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "run" / "pd_pair.json").read_text())
    assert len(data["decode"]["requests"]) == 30 and len(data["prefill"]["requests"]) == 30
    assert "checksum ok=30/30" in r.stdout and "verified ok=30/30" in r.stdout
    assert len(r.stdout.splitlines()) < 10 and '"room"' not in r.stdout


class _Peer:
    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, str(PEER), *args], cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x.rstrip("\n")) for x in self.proc.stdout],
                         daemon=True).start()

    def expect(self, tag, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.proc.poll() is None, f"peer exited ({self.proc.returncode}) before {tag}"
                continue
            if line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1:])
        raise TimeoutError(f"peer did not print {tag} within {timeout}s")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


def _decode_job(tmp_path, backend, prefill, *extra, env=None):
    e = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "sglang_hydra", "job=pd", "disagg=decode", "model=tiny",
                             f"disagg.disaggregation_transfer_backend={backend}", "schedule.page_size=16",
                             "schedule.max_total_tokens=4096", f"job.prefill={prefill}", "job.requests=200",
                             "job.pages_per_request=4", "job.timeout=120", f"hydra.run.dir={tmp_path}/run", NO_BACKUP,
                             *extra],
                            cwd=tmp_path, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("backend", ["zmq"] + (["mooncake"] if _mooncake() else []))
def test_decode_job_ends_soon_after_its_prefill_is_killed(tmp_path, backend):
    from sglang_hydra.utils.ports import free_port
    prefill = _Peer("prefill", "--backend", backend, "--bootstrap-port", str(free_port()), "--transfer-delay", "0.5")
    job = None
    try:
        addr = prefill.expect("READY", 60)["bootstrap"]
        job = _decode_job(tmp_path, backend, addr, env={"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "1"})
        prefill.expect("META", 90)            # the decode job is running: it sent its first request
        killed = time.monotonic()
        prefill.kill()
        out, err = job.communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        prefill.kill()
        if job is not None and job.poll() is None:
            job.kill()
            job.wait(10)
    assert job.returncode == 1, out + err
    assert took < 30, f"the decode job ran {took:.1f}s after its prefill died"
    assert "request(s) failed" in err and "Lost connection with prefill" in err
    side = json.loads((tmp_path / "run" / "decode.json").read_text())
    assert len(side["requests"]) == 200
    assert side["pages_in_use_after"] == 0 and side["quarantined_pages"] == 0 and side["allocator_error"] is None
    assert any(r["reason"] and r["reason"].startswith("not issued") for r in side["requests"])
    assert len(out) < 4000            # a summary, not 200 request entries


def test_checksum_on_one_side_only_is_a_config_error(tmp_path):
    from sglang_hydra.utils.ports import free_port
    prefill = _Peer("prefill", "--backend", "zmq", "--bootstrap-port", str(free_port()))
    try:
        addr = prefill.expect("READY", 60)["bootstrap"]
        job = _decode_job(tmp_path, "zmq", addr, "disagg.disaggregation_enable_kv_checksum=true")
        out, err = job.communicate(timeout=120)
    finally:
        prefill.kill()
    assert job.returncode == 2, out + err
    assert "disaggregation_enable_kv_checksum" in err and "Traceback" not in err


def test_pd_pair_that_cannot_fit_stops_at_once_instead_of_waiting_out_its_timeout(tmp_path):
    """8192 pages per request fit neither pool: both sides know at once, so the job ends long
    before job.timeout (it used to wait the whole timeout on the prefill side)."""
    t0 = time.monotonic()
    r = cli("job=pd_pair", *PAIR, "job.requests=2", "job.pages_per_request=8192", "job.timeout=120",
            f"hydra.run.dir={tmp_path}/run", cwd=tmp_path, timeout=150)
    took = time.monotonic() - t0
    assert r.returncode == 1, r.stderr[-2000:]
    assert "8192 KV pages do not fit" in r.stderr
    data = json.loads((tmp_path / "run" / "pd_pair.json").read_text())
    assert data["errors"] == [] and data["failed"] == 2
    # every prefill room ended with a reason (none left to the pair's timeout)
    reasons = [q["reason"] for q in data["prefill"]["requests"]]
    assert len(reasons) == 2 and all("do not fit" in x or "without asking" in x for x in reasons), reasons
    assert took < 60, f"took {took:.0f}s: the pair waited for its timeout"
