import contextlib
import threading

from sglang_hydra.disagg.workers import DecodeWorker, PrefillWorker

from .faults import with_faults


@contextlib.contextmanager
def serving_prefill(rec, *, delay: float = 0.0, slow_rooms=None, slow_bootstrap=False, **kw):
    """A PrefillWorker serving whatever decode asks for on a thread; yields (worker, results).

    ``delay`` / ``slow_rooms`` / ``slow_bootstrap``: the test-only faults of ``faults.with_faults``.
    """
    if delay or slow_rooms or slow_bootstrap:
        kw["classes"] = with_faults(rec.disaggregation_transfer_backend, delay=delay, slow_rooms=slow_rooms,
                                    slow_bootstrap=slow_bootstrap)
    w = PrefillWorker(rec, bootstrap_port=0, **kw)
    stop = threading.Event()
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("res", w.serve(None, stop=stop)), daemon=True)
    th.start()
    try:
        yield w, out
    finally:
        stop.set()
        th.join(15)
        w.close()
        assert not th.is_alive(), "prefill serve loop did not stop"


@contextlib.contextmanager
def decode_worker(rec, *, bad_page_rooms=(), **kw):
    """A DecodeWorker; ``bad_page_rooms`` send destination pages outside its buffers (faults.py)."""
    if bad_page_rooms:
        kw["classes"] = with_faults(rec.disaggregation_transfer_backend, bad_page_rooms=bad_page_rooms)
    d = DecodeWorker(rec, **kw)
    try:
        yield d
    finally:
        d.close()


def assert_clean(side):
    assert side.allocator_error is None, side.allocator_error
    assert side.pages_in_use_after == 0


class _WrappedAllocator:
    """Delegates to ``inner``; subclasses change what ``alloc`` hands out or remember it."""

    def __init__(self, inner):
        self.inner = inner

    def alloc(self, n):
        return self.inner.alloc(n)

    def free(self, pages):
        self.inner.free(pages)

    def check_invariants(self):
        self.inner.check_invariants()

    @property
    def used(self):
        return self.inner.used


class ReversingAllocator(_WrappedAllocator):
    """Hands out pages in descending order so no two destination pages form a run."""

    def alloc(self, n):
        p = self.inner.alloc(n)
        return None if p is None else list(reversed(p))


class RecordingAllocator(_WrappedAllocator):
    """Passes through to ``inner`` and remembers every allocation, in order."""

    def __init__(self, inner):
        super().__init__(inner)
        self.allocs = []

    def alloc(self, n):
        p = self.inner.alloc(n)
        if p is not None:
            self.allocs.append(list(p))
        return p


class FifoAllocator:
    """An allocator wrapper that hands freed pages out again only when nothing else is left.

    Used on prefill in the late-write tests: the source pages of an aborted request then still
    hold its data when its slow write finally reads them (with LIFO reuse they would already
    carry the next request's data, and the late write would be indistinguishable from it).
    """

    def __init__(self, inner):
        self.inner = inner
        self.cooling = []   # freed by the caller, not yet given back to ``inner``

    def alloc(self, n):
        p = self.inner.alloc(n)
        if p is None and self.cooling:
            self.inner.free(self.cooling)
            self.cooling = []
            p = self.inner.alloc(n)
        return p

    def free(self, pages):
        self.cooling.extend(int(p) for p in pages)

    def check_invariants(self):
        self.inner.check_invariants()
        assert len(set(self.cooling)) == len(self.cooling), "a page was freed twice"

    @property
    def used(self):
        return self.inner.used - len(self.cooling)
