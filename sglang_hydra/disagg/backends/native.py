"""What the native transfer engines (Mooncake, NIXL) share: RDMA discovery and the init deadline.

Both libraries can block inside their C++ setup (a handshake, a plugin load) with the GIL
released, so their initialisation runs on a helper thread bounded by the reference's
``SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT``.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, List

IB_SYSFS = "/sys/class/infiniband"


def has_rdma_devices() -> bool:
    """True when the kernel lists at least one RDMA (InfiniBand/RoCE) device."""
    try:
        return bool(os.listdir(IB_SYSFS))
    except OSError:
        return False


def with_deadline(fn: Callable[[], Any], timeout: float, what: str, *, thread_name: str = "engine-init") -> Any:
    """``fn()``, or TimeoutError naming ``what`` if it has not returned within ``timeout`` s."""
    box: List[Any] = []

    def run():
        try:
            box.append(("ok", fn()))
        except BaseException as e:  # re-raised in the caller's thread
            box.append(("err", e))

    t = threading.Thread(target=run, daemon=True, name=thread_name)
    t.start()
    t.join(timeout)
    if not box:
        raise TimeoutError(f"{what} did not finish within {timeout}s (SGLANG_DISAGGREGATION_ENGINE_INIT_TIMEOUT)")
    kind, val = box[0]
    if kind == "err":
        raise val
    return val
