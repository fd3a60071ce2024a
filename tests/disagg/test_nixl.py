"""The optional ``nixl`` transfer backend (NIXL agents, UCX over loopback).

NIXL-specific behaviour only: the shared transfer and fault suites (test_transfer.py,
test_faults.py) already run with ``nixl`` whenever it imports (``pip install -e .[nixl]``, which
takes ``nixl-cu12`` after a CPU torch).  The transfer tests here skip when NIXL is missing; the
clear-error and configuration tests always run.
"""
import sys

import pytest

from .conftest import make_rec
from .helpers import assert_clean, decode_worker, serving_prefill


def _nixl_importable() -> bool:
    from sglang_hydra.disagg.backends.nixl import nixl_available
    return nixl_available()


needs_nixl = pytest.mark.skipif(not _nixl_importable(),
                                reason="NIXL not importable (pip install --no-deps nixl-cu12==1.5.1 nixl==1.5.1)")
INSTALL = "pip install --no-deps nixl-cu12==1.5.1 nixl==1.5.1"


def _statuses(res):
    return {r.room: r.status for r in res.requests}


# ----------------------------------------------------------------------------- always run
def test_missing_nixl_gives_clear_error(monkeypatch):
    from sglang_hydra.disagg import registry
    from sglang_hydra.disagg.workers import PrefillWorker
    for mod in ("nixl", "nixl._api", "nixl_cu12", "nixl_cu12._api"):
        monkeypatch.setitem(sys.modules, mod, None)   # `import` of these now raises ImportError
    monkeypatch.setattr(registry, "_CACHE", {})
    with pytest.raises(registry.BackendUnavailableError) as ei:
        registry.backend_classes("nixl")
    msg = str(ei.value)
    assert INSTALL in msg and "nixl-cu12" in msg and "import failed" in msg
    assert registry.backend_available("nixl") is False
    with pytest.raises(registry.BackendUnavailableError, match="nixl-cu12==1.5.1"):
        PrefillWorker(make_rec("nixl"), bootstrap_port=0)


def test_ucx_env_defaults(monkeypatch):
    from sglang_hydra.disagg.backends import nixl as nb
    for k in ("UCX_NET_DEVICES", "UCX_MODULES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(nb, "has_rdma_devices", lambda: False)
    assert nb.apply_ucx_env_defaults("127.0.0.1", None) == {"UCX_NET_DEVICES": "lo", "UCX_MODULES": "cma"}
    # user settings win; a non-loopback host or an IB device keeps UCX's device choice
    monkeypatch.setenv("UCX_MODULES", "all")
    monkeypatch.delenv("UCX_NET_DEVICES")
    assert nb.apply_ucx_env_defaults("10.1.2.3", None) == {}
    assert nb.apply_ucx_env_defaults("127.0.0.1", "mlx5_0") == {}
    assert nb.apply_ucx_env_defaults("127.0.0.1", None, backend="LIBFABRIC") == {}
    monkeypatch.delenv("UCX_MODULES")
    monkeypatch.setattr(nb, "has_rdma_devices", lambda: True)
    assert nb.apply_ucx_env_defaults("::1", None) == {"UCX_NET_DEVICES": "lo"}


def test_backend_params_env(monkeypatch):
    from sglang_hydra.disagg.backends.nixl import backend_params_from_env
    monkeypatch.delenv("SGLANG_DISAGGREGATION_NIXL_BACKEND", raising=False)
    monkeypatch.delenv("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", raising=False)
    assert backend_params_from_env() == ("UCX", {})
    monkeypatch.setenv("SGLANG_DISAGGREGATION_NIXL_BACKEND", "LIBFABRIC")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", '{"num_threads": "2"}')
    assert backend_params_from_env() == ("LIBFABRIC", {"num_threads": "2"})
    for bad in ('{"num_threads": 2}', "[1]", "{nope"):
        monkeypatch.setenv("SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS", bad)
        with pytest.raises(ValueError, match="SGLANG_DISAGGREGATION_NIXL_BACKEND_PARAMS"):
            backend_params_from_env()


# ----------------------------------------------------------------------------- real NIXL
@needs_nixl
def test_unknown_nixl_plugin_is_refused(fast_env):
    fast_env.setenv("SGLANG_DISAGGREGATION_NIXL_BACKEND", "NO_SUCH_PLUGIN")
    with pytest.raises(ValueError, match="NO_SUCH_PLUGIN.*Available"):
        with decode_worker(make_rec("nixl")):
            pass


@needs_nixl
def test_write_outside_registered_memory_fails_then_recovers(fast_env):
    """NIXL refuses descriptors outside decode's registered buffers: that room fails, the rest go on."""
    rec = make_rec("nixl")
    with serving_prefill(rec) as (p, out), decode_worker(rec, bad_page_rooms=[2]) as d:
        res = d.fetch(p.bootstrap_addr, [1, 2, 3], 4, timeout=30, max_inflight=1)
        later = d.fetch(p.bootstrap_addr, [4], 4, timeout=30)
    assert _statuses(res) == {1: "Success", 2: "Failed", 3: "Success"}
    bad = [r for r in res.requests if r.room == 2][0]
    assert "Failed to send kv chunk" in bad.reason and "NIXL" in bad.reason
    assert later.requests[0].status == "Success" and later.requests[0].verified
    assert_clean(res)
    assert _statuses(out["res"]) == {1: "Success", 2: "Failed", 3: "Success", 4: "Success"}
    assert_clean(out["res"])
