"""PD with the KV in GPU memory (skipped without CUDA; run on a GPU machine).

NIXL registers the device buffers as VRAM and writes GPU -> GPU; zmq (host memory only) goes
through pinned host staging. Both must deliver byte-identical pages, with checksums on.
"""
import pytest
import torch

from sglang_hydra.jobs.pd_pair_processes import run_pair

from .conftest import make_rec, nixl_importable

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.skipif(not nixl_importable(), reason="NIXL not importable")
def test_pd_pair_nixl_moves_gpu_kv_directly():
    rec = make_rec("nixl", checksum=True, device="cuda")
    r = run_pair(rec, requests=16, pages_per_request=8, timeout=120)
    assert r.errors == [] and r.failed == 0 and r.succeeded == 16, (r.errors, r.failures)
    assert r.decode.registration["memory"] == "device" and r.prefill.registration["memory"] == "device"
    assert not r.decode.registration["staged"]
    assert r.checksum_checked == 16 and r.checksum_mismatches == 0
    assert r.verified_ok == r.verified_checked == 16
    assert r.decode.pages_in_use_after == 0 and r.prefill.pages_in_use_after == 0


@needs_cuda
def test_pd_pair_zmq_stages_gpu_kv_through_pinned_host_memory():
    rec = make_rec("zmq", checksum=True, device="cuda")
    r = run_pair(rec, requests=16, pages_per_request=8, timeout=120)
    assert r.errors == [] and r.failed == 0, (r.errors, r.failures)
    assert r.decode.registration["memory"] == "host" and r.decode.registration["staged"]
    assert r.verified_ok == r.verified_checked == 16 and r.checksum_checked == 16
