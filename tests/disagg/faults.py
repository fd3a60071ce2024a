"""Fault injection for the PD tests, kept out of the production code.

:func:`with_faults` returns a backend's classes with test subclasses swapped in:

* ``delay`` - prefill posts nothing of a room before ``delay`` s have passed (an abort
  meanwhile concludes the room with nothing written), as a slow engine would;
* ``slow_rooms={room: s}`` - prefill posts that room's writes at once (past its abort check,
  as if already handed to the NIC) but they land only ``s`` later and cannot be recalled;
* ``bad_page_rooms`` - decode sends destination pages far outside its registered buffers for
  those rooms, so the engine must refuse the write.

:class:`SlowBootstrap` is a bootstrap server whose every answer takes ``delay_s`` (settable
while it runs).

Workers take the result as ``classes=`` (``PrefillWorker`` / ``DecodeWorker``); the peer
processes of ``peer.py`` build theirs from command-line flags.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, Iterable, Optional

from sglang_hydra.disagg import bootstrap
from sglang_hydra.disagg.registry import backend_classes

OUTSIDE = 10_000_000     # page offset that puts a destination far outside any registered buffer


class _Delayed:
    """A room whose writes are due at ``due``; ``forced``: posted already, an abort cannot stop it."""

    def __init__(self, due: float, forced: bool, peer, room: int, entries):
        self.due, self.forced, self.peer, self.room, self.entries = due, forced, peer, room, entries
        self.inner = None


class DelayedWrites:
    """Mixin for a prefill manager: delays the start of chosen rooms' writes (module docstring)."""

    transfer_delay: float = 0.0
    slow_rooms: Dict[int, float] = {}

    def start_transfer(self, peer, room, entries):
        slow = self.slow_rooms.get(room)
        if slow is not None:
            return _Delayed(time.monotonic() + slow, True, peer, room, entries)
        if self.transfer_delay > 0:
            return _Delayed(time.monotonic() + self.transfer_delay, False, peer, room, entries)
        return super().start_transfer(peer, room, entries)

    def progress_transfer(self, h, stop_submitting):
        if not isinstance(h, _Delayed):
            return super().progress_transfer(h, stop_submitting)
        if h.inner is None:
            if stop_submitting and not h.forced:
                return (-1, "aborted before any write was posted", True)
            if time.monotonic() < h.due:
                return None
            h.inner = super().start_transfer(h.peer, h.room, h.entries)
        return super().progress_transfer(h.inner, stop_submitting and not h.forced)

    def abandon_transfer(self, h):
        if isinstance(h, _Delayed):
            if h.inner is not None:
                super().abandon_transfer(h.inner)
            return
        super().abandon_transfer(h)


class _SlowHandler(bootstrap._Handler):
    def handle_one_request(self):
        delay = getattr(self.server.owner, "delay_s", 0.0)
        if delay > 0:
            time.sleep(delay)
        super().handle_one_request()


class SlowBootstrap(bootstrap.BootstrapServer):
    handler_class = _SlowHandler

    def __init__(self, host: str, port: int, *, delay_s: float = 0.0, **kw):
        self.delay_s = delay_s
        super().__init__(host, port, **kw)


def _bad_pages_receiver(base: type, rooms: Iterable[int]) -> type:
    bad = frozenset(int(r) for r in rooms)

    def send_metadata(self, kv_indices, *a, **kw):
        if self.room in bad:
            kv_indices = [int(p) + OUTSIDE for p in kv_indices]
        return base.send_metadata(self, kv_indices, *a, **kw)

    return type(f"BadPages{base.__name__}", (base,), {"send_metadata": send_metadata})


def with_faults(backend: str, *, delay: float = 0.0, slow_rooms: Optional[Dict[int, float]] = None,
                bad_page_rooms: Iterable[int] = (), slow_bootstrap: bool = False):
    """The classes of ``backend`` with the requested faults (a plain copy when none)."""
    classes = backend_classes(backend)
    if slow_bootstrap:
        classes = dataclasses.replace(classes, bootstrap_server=SlowBootstrap)
    manager = classes.manager
    prefill = type(f"Faulty{manager.prefill_cls.__name__}", (DelayedWrites, manager.prefill_cls),
                   {"transfer_delay": float(delay), "slow_rooms": dict(slow_rooms or {})})
    dispatch = type(manager.__name__, (manager,), {"prefill_cls": prefill})
    receiver = _bad_pages_receiver(classes.receiver, bad_page_rooms) if bad_page_rooms else classes.receiver
    return dataclasses.replace(classes, manager=dispatch, receiver=receiver)
