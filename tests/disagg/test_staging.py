"""KV in device memory on a CPU machine: the device predicate is injected, so the staging path
(pinned host mirrors, copies before and after the transfer) and the refusals run here too."""
import pytest
import torch

from sglang_hydra.disagg.buffers import TensorKVBuffers, kv_args_from_source
from sglang_hydra.disagg.checksum import adler32_pages

from .conftest import make_rec
from .helpers import assert_clean, decode_worker, serving_prefill


def everything_is_device(t):
    return True


def _source():
    return TensorKVBuffers(num_layers=2, num_pages=8, page_size=4, head_num=1, head_dim=8, dtype=torch.float16)


def test_device_buffers_are_staged_for_a_host_only_backend():
    src = _source()
    args = kv_args_from_source(src, device_memory=False, is_device=everything_is_device)
    assert args.staging is not None and args.memory_kind == "host"
    real = [t for _, t in src.contiguous_buffers()]
    assert all(a is b for a, b in zip(args.source_tensors, real))
    assert all(t.data_ptr() != r.data_ptr() for t, r in zip(args.tensors, real))   # mirrors are registered
    assert args.kv_data_ptrs == [t.data_ptr() for t in args.tensors]
    for r in real:
        r.copy_(torch.randn(r.shape).to(r.dtype))
    before = adler32_pages(real, args.kv_item_lens, [2, 5])
    args.staging.to_host([2, 5])
    assert adler32_pages(args.tensors, args.kv_item_lens, [2, 5]) == before       # the pages were staged
    assert adler32_pages(args.tensors, args.kv_item_lens, [3]) != adler32_pages(real, args.kv_item_lens, [3])
    for r in real:
        r.zero_()
    args.staging.to_device([2, 5])
    assert adler32_pages(real, args.kv_item_lens, [2, 5]) == before


def test_device_buffers_go_straight_to_a_backend_that_registers_device_memory():
    src = _source()
    args = kv_args_from_source(src, device_memory=True, is_device=everything_is_device)
    assert args.staging is None and args.memory_kind == "device"
    assert args.tensors == [t for _, t in src.contiguous_buffers()]


def test_without_staging_device_buffers_are_refused_naming_nixl():
    with pytest.raises(ValueError, match="'zmq' transfer backend cannot register.*nixl"):
        kv_args_from_source(_source(), backend="zmq", staging=False, is_device=everything_is_device)
    with pytest.raises(ValueError, match="split between host and device"):
        kv_args_from_source(_source(), is_device=_alternate())


def _alternate():
    state = {"n": 0}

    def pred(t):
        state["n"] += 1
        return state["n"] % 2 == 0
    return pred


def test_staged_transfer_end_to_end(fast_env):
    """Both sides "on device": prefill fills device pages, stages them, decode un-stages and verifies."""
    rec = make_rec("zmq", checksum=True)
    with serving_prefill(rec, is_device=everything_is_device) as (p, out), \
            decode_worker(rec, is_device=everything_is_device) as d:
        assert p.args.staging is not None and d.args.staging is not None
        res = d.fetch(p.bootstrap_addr, list(range(1, 7)), 4, timeout=20)
    assert [r.status for r in res.requests] == ["Success"] * 6
    assert all(r.verified and r.checksum for r in res.requests)   # bytes checked on the "device" buffers
    assert res.registration["staged"] is True
    assert_clean(res)
    assert_clean(out["res"])


def test_staging_can_be_turned_off_by_environment(fast_env):
    fast_env.setenv("SGLANG_HYDRA_DISAGG_HOST_STAGING", "0")
    with pytest.raises(ValueError, match="nixl"):
        with decode_worker(make_rec("zmq"), is_device=everything_is_device):
            pass
