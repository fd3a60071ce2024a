"""The careless or malicious peer: what the bootstrap server and the control plane refuse."""
import json
import socket
import time

import pytest

from sglang_hydra.disagg import control
from sglang_hydra.disagg.bootstrap import (MAX_BODY_BYTES, SECRET_HEADER, BootstrapError, BootstrapServer,
                                          check_health, fetch_rank, fetch_server_info, register_rank)
from sglang_hydra.disagg.buffers import TensorKVBuffers, kv_args_from_source
from sglang_hydra.disagg.states import KVPoll

from .conftest import http_call, make_rec
from .helpers import assert_clean, decode_worker, serving_prefill

RANKS = "prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"


def _payload(port=5555, ip="127.0.0.1"):
    return {"rank_ip": ip, "rank_port": port, "page_size": 16, "kv_item_lens": [1024], "transfer_backend": "zmq"}


def _raw(port, request: bytes) -> str:
    """Send raw bytes, return the status line (the server answers without reading a huge body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        return s.recv(4096).decode(errors="replace").split("\r\n", 1)[0]


# ----------------------------------------------------------------------------- bootstrap server
def test_oversized_body_is_refused_without_reading_it(server):
    head = (f"PUT /route HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n").encode()
    assert " 413 " in _raw(server.port, head + b"{")
    assert " 411 " in _raw(server.port, b"PUT /route HTTP/1.1\r\nHost: x\r\n\r\n")
    assert " 400 " in _raw(server.port, b"PUT /route HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
    assert check_health(f"127.0.0.1:{server.port}")          # still serving


def test_malformed_routes_are_rejected(server):
    base = server.url
    register_rank(f"127.0.0.1:{server.port}", _payload(), retries=1)
    assert http_call("GET", f"{base}/route?{RANKS}")[0] == 200
    assert http_call("GET", f"{base}/route?{RANKS}&prefill_dp_rank=1")[0] == 400      # repeated argument
    assert http_call("GET", f"{base}/route?{RANKS}&evil=1")[0] == 400                  # unknown argument
    assert http_call("GET", f"{base}/route?{RANKS.replace('=0&prefill_cp', '=x&prefill_cp')}")[0] == 400
    assert http_call("GET", f"{base}/route/../health")[0] == 404
    assert http_call("GET", f"{base}/health?x=1")[0] == 404
    assert http_call("PUT", f"{base}/route?x=1", b"{}", {"Content-Type": "application/json"})[0] == 404
    assert http_call("PUT", f"{base}/route", b"[1, 2]", {"Content-Type": "application/json"})[0] == 400
    assert http_call("PUT", f"{base}/route", b"\xff\xfe", {"Content-Type": "application/json"})[0] == 400
    bad_port = dict(_payload(), rank_port=70000)
    assert http_call("PUT", f"{base}/route", json.dumps(bad_port).encode())[0] == 400


def test_a_registered_rank_cannot_be_moved_by_another_peer(server):
    addr = f"127.0.0.1:{server.port}"
    register_rank(addr, _payload(5555), retries=1)
    register_rank(addr, _payload(5555), retries=1)                # the same registration again: fine
    with pytest.raises(BootstrapError, match="HTTP 409"):
        register_rank(addr, _payload(6666, "10.9.9.9"), retries=3, backoff=0.01)
    assert fetch_rank(addr, retries=1) == {"rank_ip": "127.0.0.1", "rank_port": 5555}


def test_secret_is_required_on_every_call():
    s = BootstrapServer("127.0.0.1", 0, secret="s3cret")
    try:
        addr, base = f"127.0.0.1:{s.port}", s.url
        for method, path, body in (("GET", "/health", None), ("GET", f"/route?{RANKS}", None),
                                   ("PUT", "/route", json.dumps(_payload()).encode())):
            assert http_call(method, base + path, body)[0] == 401
            assert http_call(method, base + path, body, {SECRET_HEADER: "wrong"})[0] == 401
        assert not check_health(addr) and check_health(addr, secret="s3cret")
        t0 = time.monotonic()
        with pytest.raises(BootstrapError, match="HTTP 401"):     # not retried: a wrong secret stays wrong
            register_rank(addr, _payload(), retries=5, backoff=1.0)
        assert time.monotonic() - t0 < 5.0                         # retrying would take >= 1+2+2+2 s
        register_rank(addr, _payload(), retries=1, secret="s3cret")
        assert fetch_server_info(addr, retries=1, secret="s3cret")["page_size"] == 16
    finally:
        s.close()


def test_pair_with_a_secret_transfers_and_a_decode_without_it_is_refused(fast_env):
    rec = make_rec("zmq", disaggregation_bootstrap_secret="pd-secret")
    with serving_prefill(rec) as (p, _):
        with decode_worker(rec) as d:
            ok = d.fetch(p.bootstrap_addr, [1, 2], 4, timeout=20)
        assert [r.status for r in ok.requests] == ["Success"] * 2 and all(r.verified for r in ok.requests)
        fast_env.setenv("SGLANG_HYDRA_DISAGG_BOOTSTRAP_SECRET", "guess")   # the record's field wins over it
        with decode_worker(make_rec("zmq")) as d:
            bad = d.fetch(p.bootstrap_addr, [3, 4, 5], 4, timeout=20)
    assert all(r.status == "Failed" for r in bad.requests) and "HTTP 401" in bad.requests[0].reason
    assert_clean(bad)


# ----------------------------------------------------------------------------- control plane
@pytest.fixture
def prefill_mgr(fast_env):
    from sglang_hydra.disagg.backends.zmq_backend import ZmqPrefillManager
    args = kv_args_from_source(TensorKVBuffers(num_layers=1, num_pages=16, page_size=4, head_num=1, head_dim=4))
    mgr = ZmqPrefillManager(args, "prefill", make_rec("zmq"), bootstrap_port=1)
    for session in ("owner", "intruder"):
        mgr._handle(control.Registration(session, "127.0.0.1", 1, args.kv_data_ptrs, args.kv_data_lens,
                                         args.kv_item_lens, args.page_size).encode())
    yield mgr
    mgr.close()


def test_room_metadata_is_accepted_only_from_the_peer_that_opened_it(prefill_mgr):
    mgr = prefill_mgr
    mgr._handle(control.TransferInfo(7, "owner", [1, 2]).encode())
    mgr._handle(control.TransferInfo(7, "intruder", [9, 10]).encode())       # tries to redirect the writes
    assert mgr.transfer_infos[7].session == "owner" and mgr.transfer_infos[7].dst_pages == [1, 2]
    mgr._handle(control.TransferInfo(8, "stranger", [3]).encode())            # never registered
    assert 8 not in mgr.transfer_infos


def test_abort_is_accepted_only_from_the_rooms_owner(prefill_mgr):
    mgr = prefill_mgr
    mgr._handle(control.TransferInfo(7, "owner", [1, 2]).encode())
    mgr._handle(control.encode_abort(7, "intruder"))
    assert mgr.status.get(7) == KVPoll.WaitingForInput
    mgr._handle(control.encode_abort(7, "owner"))
    assert mgr.status.get(7) == KVPoll.Failed and "aborted by decode owner" in mgr.failure_reasons[7]


def test_decode_with_checksums_the_prefill_lacks_is_refused(fast_env):
    from sglang_hydra.disagg.decode_side import PeerConfigError
    with serving_prefill(make_rec("zmq")) as (p, _), decode_worker(make_rec("zmq", checksum=True)) as d:
        t0 = time.monotonic()
        with pytest.raises(PeerConfigError, match="checksums are off on prefill .* but on on this decode") as ei:
            d.fetch(p.bootstrap_addr, list(range(1, 50)), 4, timeout=20)
        assert time.monotonic() - t0 < 10 and ei.value.key == "disaggregation_enable_kv_checksum"
        assert d.allocator.used == 0
