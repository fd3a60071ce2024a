"""Shared helpers for the memory tests."""
import pytest

from sglang_hydra.memory.hostmem import HostMemoryInfo

GiB = 1024 ** 3


@pytest.fixture
def big_host():
    """A fixed, roomy host snapshot so sizing does not depend on this machine."""
    return HostMemoryInfo.fixed(64 * GiB)


def small_record(**kw):
    from sglang_hydra.config.testing import make_record

    base = dict(max_total_tokens=32, page_size=4, num_hidden_layers=2, num_key_value_heads=2, head_dim=8)
    base.update(kw)
    return make_record(**base)
