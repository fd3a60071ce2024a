"""``job=replay job.mode=full`` in process, on requests a test builds.

:func:`run_full_mode` runs what :func:`sglang_hydra.jobs.replay.evaluate` runs for
``job.mode=full`` (``build_deployment`` with real pools, the deployment loop, the job's
``summarize_simulation`` groups and its ``full_mode`` group), minus reading a trace file, so a
test can hand it synthetic requests, a storage backend or a policy override.  The result is the
job's own document groups, plus the storage backend's counters over the run.
"""
import pytest


def run_full_mode(record, requests, *, max_requests=None, policy=None, policy_config=None, storage=None,
                  arrival="as_is"):
    from sglang_hydra.config.hardware import compose_hardware
    from sglang_hydra.jobs.replay import _full_mode_group
    from sglang_hydra.workload.assemble import DeploymentInputs, build_deployment
    from sglang_hydra.workload.deployment import simulate
    from sglang_hydra.workload.metrics import summarize_simulation

    hw, problems = compose_hardware("h100_80gb", [("gpus_per_node", 1, "test")])
    assert not problems
    reqs = list(getattr(requests, "requests", requests))
    if max_requests is not None:
        reqs = reqs[:max_requests]
    built = build_deployment(DeploymentInputs(hardware=hw, record=record, cache_mode="full", policy=policy,
                                              policy_config=policy_config, storage=storage))
    try:
        group = built.model.groups["agg"]
        served = [r for r in reqs if r.input_length + 1 <= group.spec.pool_tokens]
        base = {}
        movers = built.byte_movers

        make = group.make_cache

        def counted():
            cache = make()
            st = getattr(cache.mover, "storage", None)
            if st is not None:
                base.update(st.get_stats())
            return cache
        if make is not None:
            group.make_cache = counted
        sim = simulate(built.model, served, arrival=arrival)
        doc = summarize_simulation(sim, sla_ttft_ms=2000.0, sla_tpot_ms=50.0)
        doc["full_mode"] = _full_mode_group(built)
        st = getattr(movers[0], "storage", None) if movers else None
        doc["storage_stats"] = {k: v - base.get(k, 0) for k, v in st.get_stats().items()
                                if isinstance(v, (int, float))} if st is not None else {}
        doc["engine_cache"] = sim.engines["agg"][0].cache
        doc["policy"] = built.sides["agg"]["cache"].get("eviction_policy")
    finally:
        built.close()
    return doc


@pytest.fixture
def full_mode():
    return run_full_mode
