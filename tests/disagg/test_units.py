"""State machine, address arithmetic, run merging, checksum, control messages, registry."""
import os
import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_hydra.disagg import control
from sglang_hydra.disagg.addressing import (build_entries, group_contiguous_runs, page_ranges, split_batches,
                                            within_regions)
from sglang_hydra.disagg.buffers import PageAllocator, TensorKVBuffers, kv_args_from_source
from sglang_hydra.disagg.checksum import adler32_pages, layout_signature
from sglang_hydra.disagg.states import KVPoll, KVTransferError, StatusTable, merge_polls


# ---------------------------------------------------------------- states
def test_kvpoll_order_matches_reference():
    assert [int(p) for p in (KVPoll.Failed, KVPoll.Bootstrapping, KVPoll.WaitingForInput,
                             KVPoll.Transferring, KVPoll.Success)] == [0, 1, 2, 3, 4]
    assert merge_polls([KVPoll.Success, KVPoll.Transferring]) == KVPoll.Transferring
    assert merge_polls([KVPoll.Success, KVPoll.Failed]) == KVPoll.Failed


def test_status_table_rules():
    t = StatusTable()
    assert t.update(1, KVPoll.Transferring) is None          # unknown room: only early states create
    assert t.get(1) is None
    assert t.update(1, KVPoll.Bootstrapping) == KVPoll.Bootstrapping
    assert t.update(1, KVPoll.Transferring) == KVPoll.Transferring
    assert t.update(1, KVPoll.WaitingForInput) == KVPoll.Transferring   # never regresses
    t.fail(1, "first")
    t.fail(1, "second")
    assert t.get(1) == KVPoll.Failed and t.reason(1) == "first"
    assert t.update(1, KVPoll.Success) == KVPoll.Failed      # Failed is terminal
    t.pop(1)
    assert t.update(1, KVPoll.Success) is None               # a cleared room is not resurrected
    assert t.update(2, KVPoll.WaitingForInput) == KVPoll.WaitingForInput


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=30))
def test_status_table_monotone_property(seq):
    t = StatusTable()
    t.update(7, KVPoll.Bootstrapping)
    prev = KVPoll.Bootstrapping
    failed = False
    for s in seq:
        cur = t.update(7, s)
        if failed:
            assert cur == KVPoll.Failed
        elif s == 0:
            assert cur == KVPoll.Failed
            failed = True
        else:
            assert cur == max(prev, KVPoll(s))
        prev = cur


def test_transfer_error_str():
    assert str(KVTransferError(5, "boom")) == "KVTransferError(bootstrap_room=5): boom"


# ---------------------------------------------------------------- addressing
def test_group_runs_split_where_either_side_breaks():
    assert group_contiguous_runs([1, 2, 3, 7, 8], [10, 11, 12, 13, 14]) == [(1, 10, 3), (7, 13, 2)]
    assert group_contiguous_runs([1, 2, 3], [5, 9, 10]) == [(1, 5, 1), (2, 9, 2)]
    assert group_contiguous_runs([], []) == []
    assert group_contiguous_runs([4, 3], [1, 2]) == [(4, 1, 1), (3, 2, 1)]
    with pytest.raises(ValueError):
        group_contiguous_runs([1], [1, 2])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=40))
def test_runs_expand_back_to_the_pairs(pairs):
    src = [a for a, _ in pairs]
    dst = [b for _, b in pairs]
    runs = group_contiguous_runs(src, dst)
    back = [(s + i, d + i) for s, d, n in runs for i in range(n)]
    assert back == list(zip(src, dst))
    # maximal: two neighbouring runs could not have been merged
    for (s0, d0, n0), (s1, d1, _) in zip(runs, runs[1:]):
        assert not (s1 == s0 + n0 and d1 == d0 + n0)


def test_build_entries_addresses():
    runs = group_contiguous_runs([1, 2, 5], [3, 4, 9])
    e = build_entries([1000, 5000], [20000, 90000], [16, 32], runs)
    assert e == [(1000 + 16, 20000 + 48, 32), (1000 + 80, 20000 + 144, 16),
                 (5000 + 32, 90000 + 96, 64), (5000 + 160, 90000 + 288, 32)]
    with pytest.raises(ValueError):
        build_entries([1], [1, 2], [1], runs)


def test_split_batches_and_regions():
    entries = [(i, i, 1) for i in range(10)]
    assert [len(b) for b in split_batches(entries, 4)] == [4, 4, 2]
    assert split_batches(entries, 0) == [entries]
    assert split_batches([], 3) == []
    regions = [(100, 50), (200, 10)]
    assert within_regions(100, 50, regions) and within_regions(205, 5, regions)
    assert not within_regions(140, 20, regions)        # runs past the end
    assert not within_regions(145, 60, regions)        # spans two regions
    assert page_ranges([8, 4], [1, 2, 4]) == [(0, 8, 16), (0, 32, 8), (1, 4, 8), (1, 16, 4)]


# ---------------------------------------------------------------- buffers / checksum
def _buffers():
    b = TensorKVBuffers(num_layers=2, num_pages=8, page_size=4, head_num=2, head_dim=4, dtype=torch.float16)
    for _, t in b.contiguous_buffers():
        t.copy_(torch.randn(t.shape).to(t.dtype))
    return b


def test_kv_args_layout():
    b = _buffers()
    a = kv_args_from_source(b)
    assert len(a.kv_data_ptrs) == 4 and a.buffer_names[0].startswith("k") and a.buffer_names[-1].startswith("v")
    assert a.kv_item_lens == [4 * 2 * 4 * 2] * 4
    assert a.kv_data_lens == [9 * 64] * 4              # 8 pages + the padding page


def test_adler32_equals_zlib_of_concatenation():
    b = _buffers()
    a = kv_args_from_source(b)
    pages = [3, 1, 2, 7]
    blob = b"".join(bytes(t.reshape(-1).view(torch.uint8)[p * il:(p + 1) * il].tolist())
                    for t, il in zip(a.tensors, a.kv_item_lens) for p in pages)
    assert adler32_pages(a.tensors, a.kv_item_lens, pages) == zlib.adler32(blob)
    assert adler32_pages(a.tensors, a.kv_item_lens, []) == 1
    before = adler32_pages(a.tensors, a.kv_item_lens, pages)
    a.tensors[3].reshape(-1).view(torch.uint8)[7 * 64] ^= 1
    assert adler32_pages(a.tensors, a.kv_item_lens, pages) != before
    with pytest.raises(IndexError):
        adler32_pages(a.tensors, a.kv_item_lens, [9])


def test_layout_signature_nonzero_and_sensitive():
    s = layout_signature(16, "auto", [1024] * 4)
    assert s != 0 and s & 1
    assert s != layout_signature(8, "auto", [1024] * 4)


def test_page_allocator_invariants():
    a = PageAllocator(4)
    p = a.alloc(3)
    assert p == [1, 2, 3] and a.alloc(2) is None
    a.check_invariants()
    a.free(p)
    a.check_invariants()
    with pytest.raises(RuntimeError):
        a.free([1])


def test_memory_pool_adapter_invariants():
    from sglang_hydra.disagg.buffers import allocator_for
    from sglang_hydra.memory import PageAllocator as PoolAlloc
    a = allocator_for(PoolAlloc(64, page_size=16))
    pages = a.alloc(3)
    assert len(pages) == 3 and a.used == 3
    a.check_invariants()
    a.free(pages)
    a.check_invariants()
    assert a.used == 0


# ---------------------------------------------------------------- control messages
def test_control_roundtrip():
    reg = control.Registration("s1", "127.0.0.1", 5, [1, 2], [10, 20], [4, 4], 16, "auto", 0, {"x": "y"})
    assert control.Registration.decode(reg.encode()) == reg
    ti = control.TransferInfo(9, "s1", [3, 4, 1 << 20])
    assert control.TransferInfo.decode(ti.encode()) == ti
    sm = control.StatusMessage(9, KVPoll.Failed, "why", 123, 456)
    assert control.StatusMessage.decode(sm.encode()) == sm
    assert control.decode_abort(control.encode_abort(9, "s1")) == (9, "s1")
    assert control.decode_ack(control.encode_ack(9, False, "no")) == (9, False, "no")
    assert control.decode_data_header(control.encode_data_header(1 << 40, 99, 1)) == (1 << 40, 99, 1)
    with pytest.raises(control.ProtocolError):
        control.TransferInfo.decode([control.META, b"1", b"s", b"abc", b"{}"])


# ---------------------------------------------------------------- registry
def test_registry_builtin_and_choices():
    from sglang_hydra.config.choices import choices
    from sglang_hydra.disagg import KVClassType, get_kv_class
    from sglang_hydra.disagg.buffers import KVArgs
    assert "zmq" in choices("DISAGG_TRANSFER_BACKEND")
    assert get_kv_class("zmq", KVClassType.MANAGER).__name__ == "ZmqKVManager"
    assert get_kv_class("mooncake", "sender").__name__ == "MooncakeKVSender"
    assert get_kv_class("fake", KVClassType.BOOTSTRAP_SERVER) is None
    assert get_kv_class("fake", KVClassType.KVARGS) is KVArgs
    with pytest.raises(ValueError, match="Unsupported transfer backend"):
        get_kv_class("nope", "manager")


def test_mooncake_tcp_resolution(monkeypatch):
    from sglang_hydra.disagg import resolve_backend_name
    monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    assert resolve_backend_name("mooncake_tcp") == "mooncake"
    assert os.environ["MC_FORCE_TCP"] == "1"


@pytest.mark.parametrize("name,words", [("ascend", ["Ascend", "NPU"]), ("mori", ["AMD", "mori"]),
                                        ("nixl", ["nixl-cu12"])])
def test_unavailable_backends_say_what_they_need(name, words):
    from sglang_hydra.disagg import BackendUnavailableError, backend_classes
    if name == "nixl":   # nixl may be installed as `nixl` or as `nixl_cu12`: ask the registry
        from sglang_hydra.disagg import backend_available
        if backend_available("nixl"):
            pytest.skip("nixl is installed here")
    with pytest.raises(BackendUnavailableError) as ei:
        backend_classes(name)
    for w in words:
        assert w in str(ei.value)


def test_plugin_registration_extends_choices():
    from sglang_hydra.config.choices import choices
    from sglang_hydra.disagg import BackendClasses, get_kv_class, register_backend
    from sglang_hydra.disagg.backends.fake import FakeKVManager, FakeKVReceiver, FakeKVSender
    register_backend("my_plugin_backend", BackendClasses(FakeKVManager, FakeKVSender, FakeKVReceiver), replace=True)
    assert "my_plugin_backend" in choices("DISAGG_TRANSFER_BACKEND")
    assert get_kv_class("my_plugin_backend", "receiver") is FakeKVReceiver
    with pytest.raises(ValueError):
        register_backend("my_plugin_backend", BackendClasses(FakeKVManager, FakeKVSender, FakeKVReceiver))


def test_fake_is_decode_only_and_moves_nothing():
    from sglang_hydra.disagg.backends.fake import FakeKVManager, FakeKVReceiver, FakeKVSender
    with pytest.raises(AssertionError, match="does not support 'fake'"):
        FakeKVManager(None, "prefill")
    mgr = FakeKVManager(None, "decode")
    r = FakeKVReceiver(mgr, "2.2.2.2:0", 1)
    assert r.poll() == KVPoll.Bootstrapping
    r.init()
    assert r.poll() == KVPoll.WaitingForInput
    r.send_metadata([1, 2])
    assert r.poll() == KVPoll.Success
    s = FakeKVSender(mgr, "2.2.2.2:0", 1)
    s.init(2)
    assert s.poll() == KVPoll.WaitingForInput
    s.send([1, 2])
    assert s.poll() == KVPoll.Success
    s2 = FakeKVSender(mgr, "x", 2)
    s2.abort()
    assert s2.poll() == KVPoll.Failed
