"""Where the deployment search's simulations run: this process, a pool of forked processes, or Ray.

The search submits one task at a time (a deployment at a rate, or an answer's profile) and
decides what to submit next from what came back (a stage that has its answer skips the rest),
so a pool here keeps at most ``slots`` tasks in flight.  The trace is loaded once, before the
workers fork, and never sent again; on Ray it is put in the object store once.

Interrupting (Ctrl-C, SIGTERM) must leave the finished rows within two seconds: the forked
workers ignore SIGINT (the search process handles it) and :meth:`SearchPool.close` with
``terminate=True`` kills them at once instead of waiting for their simulations.
"""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from .deploy_eval import Plan, Sla, evaluate, meets, shortfall

EXECUTORS = ("local", "ray_local", "ray")
_POLL_S = 0.05
RATE_STEPS = 14                    # bisection steps of the peers' rate search (2^-14 relative precision at most)
RATE_TOLERANCE = 0.02              # stop once the bracket is this tight (relative)                     # how often the search looks at its tasks (and at Ctrl-C)
_WORK: Dict[str, Any] = {}


# --------------------------------------------------------------------------- tasks
def init_worker(requests: Sequence, sla: Sla, arrival: str, time_scale: float, ignore_sigint: bool = False) -> None:
    """What every task of one search shares (set once per process)."""
    if ignore_sigint:                   # a forked worker: the search process handles Ctrl-C, and
        import signal                   # SIGTERM (how it stops a worker) just ends the worker
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _WORK.update(requests=requests, sla=sla, arrival=arrival, time_scale=time_scale)


def run_task(task: Tuple) -> Dict[str, Any]:
    """One task: ``("eval", plan, rate_factor, outrank_ttft_ms)`` the deployment at that multiple of
    the trace's rate; ``("rate", plan)`` the peers' rate search; ``("profile", plan, held_factor,
    tolerance)`` the deployment at the trace's own rate and the rate at which it breaks the SLA."""
    kind, plan = task[0], task[1]
    requests, sla = _WORK["requests"], _WORK["sla"]
    how = dict(arrival=_WORK["arrival"], time_scale=_WORK["time_scale"])
    if kind == "eval":
        return at_rate(plan, task[2], outrank_ttft_ms=task[3])
    if kind == "rate":
        return rate_search(plan, requests, sla, **how)
    if kind == "profile":
        return profile(plan, held=task[2], tolerance=task[3])
    raise ValueError(f"unknown search task {kind!r}")


def at_rate(plan: Plan, factor: float, outrank_ttft_ms: Optional[float] = None) -> Dict[str, Any]:
    """``plan`` at ``factor`` x the trace's request rate (every arrival time divided by it)."""
    return evaluate(plan, _WORK["requests"], _WORK["sla"], arrival=_WORK["arrival"],
                    time_scale=_WORK["time_scale"] / factor, outrank_ttft_ms=outrank_ttft_ms)


def profile(plan: Plan, *, held: float, tolerance: float) -> Dict[str, Any]:
    """An answer's figures at the trace's own rate, and the multiple of that rate at which it
    breaks the SLA, given that it holds at ``held`` (the search ran it there): the bracket's top
    starts at twice that, doubled until it fails, then bisection to ``tolerance`` (relative).
    Runs above the break stop early, so the steps that fail are cheap."""
    sla = _WORK["sla"]
    base = at_rate(plan, 1.0)
    lo, hi, steps = held, held * 2, 1
    while True:
        steps += 1
        if not meets(at_rate(plan, hi), sla):
            break
        if steps >= 8:
            return {"at_trace_rate": base, "break_factor": None, "held_factor": hi, "steps": steps}
        lo, hi = hi, hi * 2
    while (hi - lo) / hi > tolerance and steps < 20:
        steps += 1
        mid = (lo + hi) / 2
        if meets(at_rate(plan, mid), sla):
            lo = mid
        else:
            hi = mid
    return {"at_trace_rate": base, "break_factor": hi, "held_factor": lo, "steps": steps}


def base_rate(requests: Sequence, arrival: str = "spread", time_scale: float = 1.0) -> float:
    """The trace's own request rate as simulated: requests after the first over the time they span."""
    from ..workload.arrivals import arrival_times
    if len(requests) < 2:
        return 0.0
    times = arrival_times([r.timestamp for r in requests], how=arrival, time_scale=time_scale)
    span = max(times) - min(times)
    return (len(requests) - 1) / span if span > 0 else math.inf


def rate_search(plan: Plan, requests: Sequence, sla: Sla, *, arrival: str = "spread",
                time_scale: float = 1.0) -> Dict[str, Any]:
    """The highest multiple of the trace's request rate at which ``plan`` meets the SLA (bisection
    on the factor; the SLA is taken to hold on the whole interval below the highest passing
    rate), with the figures at that rate.  ``rate_rps`` 0 when even the slowest rate tried fails."""
    base = base_rate(requests, arrival, time_scale)
    if not math.isfinite(base) or base <= 0:
        raise ValueError("the rate search needs a trace whose arrivals span some time")
    tried: Dict[float, Dict[str, Any]] = {}

    def at(f: float) -> Dict[str, Any]:
        if f not in tried:
            # f x the rate: every arrival time (spread within its tick as at f = 1) divided by f
            tried[f] = evaluate(plan, requests, sla, arrival=arrival, time_scale=time_scale / f)
        return tried[f]

    lo, hi = 0.0, 1.0
    while meets(at(hi), sla) and hi < 2 ** 12:          # up until it fails
        lo, hi = hi, hi * 2
    if lo == 0.0:                                        # down until it holds
        f = 0.5
        while f > 2 ** -10 and not meets(at(f), sla):
            hi, f = f, f / 2
        if not meets(at(f), sla):
            out = dict(at(f))
            out.update(rate_rps=0.0, rate_factor=0.0, tokens_per_s_per_gpu=0.0, closest=shortfall(at(f), sla))
            return out
        lo = f
    for _ in range(RATE_STEPS):
        if (hi - lo) / hi <= RATE_TOLERANCE:
            break
        mid = (lo + hi) / 2
        if meets(at(mid), sla):
            lo = mid
        else:
            hi = mid
    out = dict(at(lo))
    mean_osl = sum(r.output_length for r in requests) / len(requests)
    out.update(rate_rps=base * lo, rate_factor=lo,
               # at a rate it keeps up with, a deployment serves what arrives
               tokens_per_s_per_gpu=base * lo * mean_osl / plan.gpus, closest=shortfall(at(lo), sla))
    return out



# --------------------------------------------------------------------------- pools
class SearchPool:
    """Runs tasks in this process (one slot), forked processes (``local``) or Ray actors' tasks."""

    def __init__(self, requests: Sequence, sla: Sla, *, arrival: str, time_scale: float, processes: int,
                 executor: str = "local", ray_address: Optional[str] = None):
        self.executor = executor
        self.slots = max(1, int(processes))
        self._pool = None
        self._ray = None
        self._next = 0
        self._pending: Dict[int, Any] = {}
        args = (requests, sla, arrival, time_scale)
        if executor in ("ray_local", "ray"):
            import ray
            self._ray = ray
            self._own_ray = not ray.is_initialized()
            if self._own_ray:
                if executor == "ray":
                    ray.init(address=ray_address or "auto", log_to_driver=False)
                else:
                    ray.init(num_cpus=self.slots, include_dashboard=False, log_to_driver=False,
                             runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
            if executor == "ray":
                self.slots = max(self.slots, int(ray.cluster_resources().get("CPU", self.slots)))
            self._args = ray.put(args)
            self._remote = ray.remote(_ray_task)
        elif self.slots > 1:
            import multiprocessing
            ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
            self._pool = (ctx or multiprocessing).Pool(self.slots, initializer=init_worker, initargs=(*args, True))
        else:
            init_worker(*args)

    @property
    def free(self) -> int:
        return self.slots - len(self._pending)

    def submit(self, task: Tuple) -> int:
        handle = self._next
        self._next += 1
        if self._ray is not None:
            self._pending[handle] = self._remote.remote(self._args, task)
        elif self._pool is not None:
            self._pending[handle] = self._pool.apply_async(run_task, (task,))
        else:
            self._pending[handle] = run_task(task)          # inline: done at once
        return handle

    def done(self) -> List[Tuple[int, Dict[str, Any]]]:
        """The tasks that finished (waits until at least one has, if any are running)."""
        while self._pending:
            out = []
            if self._ray is not None:
                refs = {ref: h for h, ref in self._pending.items()}
                ready, _ = self._ray.wait(list(refs), num_returns=1, timeout=_POLL_S)
                for ref in ready:
                    h = refs[ref]
                    del self._pending[h]
                    out.append((h, self._ray.get(ref)))
            elif self._pool is not None:
                for h, res in list(self._pending.items()):
                    if res.ready():
                        del self._pending[h]
                        out.append((h, res.get()))
                if not out:
                    time.sleep(_POLL_S)
            else:
                out = list(self._pending.items())
                self._pending.clear()
            if out:
                return out
        return []

    def running(self) -> List[int]:
        return list(self._pending)

    def close(self, terminate: bool = False) -> None:
        if self._pool is not None:
            if terminate:
                self._pool.terminate()
            else:
                self._pool.close()
            self._pool.join()
            self._pool = None
        if self._ray is not None:
            if terminate:
                for ref in self._pending.values():
                    try:
                        self._ray.cancel(ref, force=True)
                    except Exception:          # already finished or gone: nothing to stop
                        pass
            if self._own_ray:
                self._ray.shutdown()
            self._ray = None
        self._pending.clear()


def _ray_task(args, task):
    if _WORK.get("args_id") != id(args):
        init_worker(*args)
        _WORK["args_id"] = id(args)
    return run_task(task)


# --------------------------------------------------------------------------- progress
class Progress:
    """A bar per stage on a terminal (tqdm), else one line per stage when it ends."""

    def __init__(self, stream=None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._bar = None
        self._name = ""
        self._t0 = 0.0
        self._counts: Dict[str, int] = {}
        self._total = 0

    def start(self, name: str, total: int) -> None:
        self._name, self._t0, self._counts, self._total = name, time.perf_counter(), {}, total
        if self.tty and total:
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=name, file=self.stream, leave=True, unit="run", dynamic_ncols=True)

    def step(self, outcome: str, n: int = 1) -> None:
        self._counts[outcome] = self._counts.get(outcome, 0) + n
        if self._bar is not None:
            self._bar.update(n)
            self._bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in sorted(self._counts.items())), refresh=False)

    def end(self, note: str = "") -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.enabled and not self.tty and self._total:
            counts = ", ".join(f"{v} {k}" for k, v in sorted(self._counts.items())) or "nothing to run"
            print(f"deploy_search: {self._name}: {counts} in {time.perf_counter() - self._t0:.1f} s"
                  + (f"; {note}" if note else ""), file=self.stream, flush=True)
        elif self.enabled and note:
            print(f"  {note}", file=self.stream, flush=True)


def drive(pool: SearchPool, items: Iterable[Any], make_task: Callable[[Any], Optional[Tuple]],
          on_result: Callable[[Any, Dict[str, Any]], str], on_skip: Callable[[Any], None],
          progress: Progress, in_flight: Dict[int, Any], queue: Optional[List[Any]] = None) -> None:
    """Submit ``items`` in order, at most ``pool.slots`` at a time; ``make_task`` is asked at
    submit time (it sees every result so far) and returns None to skip the item.  ``in_flight``
    holds what runs and ``queue`` what has not started (for the failure report of an
    interrupted search)."""
    if queue is None:
        queue = []
    queue[:] = list(items)
    while queue or in_flight:
        while queue and pool.free > 0:
            item = queue.pop(0)
            task = make_task(item)
            if task is None:
                on_skip(item)
                progress.step("skipped")
                continue
            in_flight[pool.submit(task)] = item
        for handle, res in pool.done():
            item = in_flight.pop(handle)
            progress.step(on_result(item, res))
