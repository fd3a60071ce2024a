"""HTTP bootstrap protocol and the bounded-retry client."""
import json
import urllib.request

import pytest

from sglang_hydra.disagg.bootstrap import (BootstrapError, check_health, fetch_rank, fetch_server_info,
                                          register_rank, request_with_retries)
from sglang_hydra.utils.ports import free_port

from .conftest import http_call
from .faults import SlowBootstrap

Q = "prefill_dp_rank={}&prefill_cp_rank={}&target_tp_rank={}&target_pp_rank={}"


def _get(url):
    return http_call("GET", url)


def _payload(port=5555):
    return {"rank_ip": "127.0.0.1", "rank_port": port, "page_size": 16, "kv_cache_dtype": "auto",
            "kv_item_lens": [1024, 1024], "transfer_backend": "zmq", "attn_tp_size": 1, "attn_tp_rank": 0}


def test_route_protocol(server):
    base = server.url
    code, body = _get(base + "/route?" + Q.format(-1, -1, -1, -1))
    assert code == 503 and "not fully registered" in body
    register_rank(f"127.0.0.1:{server.port}", _payload(), retries=1)
    code, body = _get(base + "/route?" + Q.format(-1, -1, -1, -1))
    info = json.loads(body)
    assert code == 200 and info["page_size"] == 16 and info["kv_item_lens"] == [1024, 1024]
    code, body = _get(base + "/route?" + Q.format(0, 0, 0, 0))
    assert code == 200 and json.loads(body) == {"rank_ip": "127.0.0.1", "rank_port": 5555}
    assert _get(base + "/route?" + Q.format(0, 0, 3, 0))[0] == 404
    assert _get(base + "/route?prefill_dp_rank=0")[0] == 400
    assert _get(base + "/health") == (200, "OK")
    req = urllib.request.Request(base + "/route", data=b"{}", method="POST")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(req, timeout=2)
    assert ei.value.code == 405
    assert check_health(f"127.0.0.1:{server.port}")
    assert fetch_rank(f"127.0.0.1:{server.port}", retries=1)["rank_port"] == 5555
    assert fetch_server_info(f"127.0.0.1:{server.port}", retries=1)["transfer_backend"] == "zmq"


def test_bad_registration_rejected(server):
    with pytest.raises(BootstrapError, match="HTTP 400"):
        register_rank(f"127.0.0.1:{server.port}", {"rank_ip": "x"}, retries=3, backoff=0.01)


def test_unreachable_fails_after_bounded_retries():
    port = free_port()
    with pytest.raises(BootstrapError) as ei:
        fetch_server_info(f"127.0.0.1:{port}", retries=3, timeout=0.5, backoff=0.05)
    # bounded by count: exactly the three attempts asked for, then the error
    assert "after 3 attempt(s)" in str(ei.value) and str(port) in str(ei.value)
    assert not check_health(f"127.0.0.1:{port}", timeout=0.5)


def test_slow_server_times_out_then_fails():
    s = SlowBootstrap("127.0.0.1", 0, delay_s=1.5)
    try:
        with pytest.raises(BootstrapError, match="after 2 attempt") as ei:
            request_with_retries("GET", s.url + "/health", retries=2, timeout=0.3, backoff=0.05)
        # each attempt ended on its own 0.3 s timeout, not on the server's 1.5 s answer
        assert "timed out" in str(ei.value)
    finally:
        s.close()


def test_503_is_retried_until_registration(server):
    import threading
    threading.Timer(0.3, lambda: register_rank(f"127.0.0.1:{server.port}", _payload(), retries=1)).start()
    info = fetch_server_info(f"127.0.0.1:{server.port}", retries=10, backoff=0.1)
    assert info["page_size"] == 16
