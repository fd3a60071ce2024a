"""job=launch of several servers: N aggregated servers behind the real sglang-router's regular mode, and
an xPyD deployment behind its PD mode (stand-in servers, real router)."""
import json
import signal
import urllib.request

import pytest

from sglang_hydra.utils.ports import port_is_free

from .conftest import STANDIN, pid_alive, router_installed

TIMEOUT = 120
needs_router = pytest.mark.skipif(not router_installed(), reason="needs sglang-router (pip install 'sglang-hydra[router]')")


def _generate(router_port: int, text: str) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(f"http://127.0.0.1:{router_port}/generate", method="POST",
                                 data=json.dumps({"text": text, "sampling_params": {"max_new_tokens": 1}}).encode(),
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=60) as resp:
        return json.loads(resp.read())


def _stop(run):
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait(TIMEOUT) == 128 + signal.SIGTERM
    assert not any(pid_alive(p) for p in run.standin_pids())


@needs_router
def test_aggregated_workers_behind_the_routers_regular_mode(launch, ports):
    p, r, m = ports(3)
    run = launch(["deploy.workers=3", f"serving.port={p}", f"deploy.router_port={r}", f"deploy.router_prometheus_port={m}",
                  "deploy.router_policy=round_robin", *STANDIN])
    run.wait_for_output("[launch] ready:", timeout=TIMEOUT)
    starts = [e for e in run.events("server") if e["event"] == "start"]
    assert len(starts) == 3 and len({e["port"] for e in starts}) == 3
    assert "[server0] " in run.stdout and "[server2] " in run.stdout and "[router] " in run.stdout
    for i in range(6):
        assert _generate(r, f"hello {i}")["role"] == "server"
    served = {e["port"] for e in run.events("server") if e["event"] == "request"}
    assert served == {e["port"] for e in starts}                  # round_robin reached every worker
    _stop(run)
    assert port_is_free(r) and all(port_is_free(e["port"]) for e in starts)


@needs_router
def test_xpyd_behind_the_routers_pd_mode(launch, ports):
    p, b, r, m = ports(4)
    run = launch(["deploy=pd", "deploy.prefill_workers=2", "deploy.decode_workers=2", f"prefill.serving.port={p}",
                  f"prefill.disagg.disaggregation_bootstrap_port={b}", f"deploy.router_port={r}",
                  f"deploy.router_prometheus_port={m}", "deploy.router_policy=round_robin", *STANDIN])
    run.wait_for_output("[launch] ready:", timeout=TIMEOUT)
    pre_starts = [e for e in run.events("prefill") if e["event"] == "start"]
    dec_starts = [e for e in run.events("decode") if e["event"] == "start"]
    assert len(pre_starts) == 2 and len(dec_starts) == 2
    for i in range(4):
        assert _generate(r, f"hi {i}")["role"] == "decode"
    pre = [e for e in run.events("prefill") if e["event"] == "request"]
    dec = [e for e in run.events("decode") if e["event"] == "request"]
    assert {e["port"] for e in pre} == {e["port"] for e in pre_starts}     # both prefill servers were used
    assert {e["port"] for e in dec} == {e["port"] for e in dec_starts}
    boot_of = {e["port"]: e["argv"] for e in pre_starts}
    for e in pre:               # the router sends each prefill's own bootstrap port
        argv = boot_of[e["port"]]
        own = int(argv[argv.index("--disaggregation-bootstrap-port") + 1]) if "--disaggregation-bootstrap-port" in argv else b
        assert e["body"]["bootstrap_port"] == own
    assert len({e["body"]["bootstrap_port"] for e in pre}) == 2
    _stop(run)
