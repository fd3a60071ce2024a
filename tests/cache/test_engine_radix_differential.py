"""Engine differentials: the replay's ``cache_semantics=sglang`` against SGLang's own radix caches.

Two loops, each against SGLang 0.5.23 driven by ``scripts/engine_radix_oracle.py`` in the
reference venv (the engine's clock replaced by a counter):

* **job=replay's loop** (``test_replay_job_*``, at the end): the deployment loop the command line
  runs (``build_deployment`` + ``simulate(arrival="sequential")``, as ``jobs.replay.evaluate``),
  against SGLang's ``RadixCache`` called as SGLang's scheduler calls it (oracle ``loop=scheduler``).
  Cached tokens identical on every request.
* **the tree's one-call loop** (``test_sglang_semantics_hit_the_engine_exactly``):
  ``TieredCache.serve`` (match, pin, evict until the new pages fit, insert, unpin; PD engines and
  the tree's own API use it) against the engine's cache driven by that loop, for every policy,
  capacity and page size (T-LRU in ``UnifiedRadixCache`` and the plugin's hooked policies
  included).

* lru, lfu, slru, priority and our ``span_lru``: SGLang's ``RadixCache``, built directly.
* tlru and our ``ghost_lru`` / ``ghost_lfu`` / ``hit_density``: the cache a *server* builds for
  ``--radix-eviction-policy <name>`` (its arguments parsed and published, then the
  engine's ``create_tree_cache``): ``UnifiedRadixCache`` with the Rust tree core for tlru
  (importing it needs ``openai`` and ``partial_json_parser`` in the reference venv, which
  ``.ci/run`` installs), and for the hooked policies (``HOOKED_POLICIES``: the ghost
  policies and ``hit_density``) the hooked ``RadixCache`` our plugin registers as a
  radix-cache backend and selects by the policy name alone.  ``hit_density`` must also
  differ from LRU somewhere (it learned retention ages, so the identity is not LRU's).

Our policies come from the plugin, found by the engine's plugin loader in the installed
wheel's entry-point metadata (the wheel is installed with ``--no-deps --target`` into an
overlay directory on the reference interpreter's ``PYTHONPATH``).

    SGLANG_HYDRA_REFERENCE_PYTHON=/path/to/ref-venv/bin/python python -m pytest tests/cache/test_engine_radix_differential.py
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sglang_hydra.cache.movers import CountingMover
from sglang_hydra.cache.policies import make_policy
from sglang_hydra.cache.radix import block_page_keys
from sglang_hydra.cache.tiered import TieredCache
from sglang_hydra.workload.deployment import request_units
from sglang_hydra.workload.synthetic import generate_conversations
from sglang_hydra.workload.trace import load_trace, trace_path

ROOT = Path(__file__).resolve().parents[2]
ORACLE = ROOT / "scripts" / "engine_radix_oracle.py"
REFERENCE_PYTHON = os.environ.get("SGLANG_HYDRA_REFERENCE_PYTHON")
pytestmark = [pytest.mark.reference, pytest.mark.skipif(
    not REFERENCE_PYTHON, reason="set SGLANG_HYDRA_REFERENCE_PYTHON to a venv with sglang 0.5.23 (docs/differential.md)")]

#: policy -> config (tokens of the replay's pages); span_lru and the ghost policies are ours
POLICIES = {"lru": None, "lfu": None, "slru": {"protected_threshold": 2}, "priority": None,
            "span_lru": {"alpha": 1.0}, "tlru": {"threshold": 8192, "next_prompt_estimate": 2048},
            "ghost_lru": None, "ghost_lfu": None, "hit_density": None}
#: policies whose engine run builds the cache as a server does, and the classes it must pick
SERVER_BUILT = {"tlru": ("UnifiedRadixCache", None),
                "ghost_lru": ("HydraHookedRadixCache", "GhostLRUStrategy"),
                "ghost_lfu": ("HydraHookedRadixCache", "GhostLFUStrategy"),
                "hit_density": ("HydraHookedRadixCache", "HitDensityStrategy")}
BLOCK_CAPACITIES = (1000, 4000, 16000)          # in 512-token blocks, as replay_rules.md
SYNTH_BLOCK_CAPACITIES = (60, 250, 1000)
PAGE_SIZES = (512, 128)
#: engine tokens per replay page: page alignment is exercised with a page of 2 tokens
PAGE_TOKENS = {512: 1, 128: 2}
CONVERSATION_REQUESTS_AT_128 = 1500


@pytest.fixture(scope="module")
def plugin_overlay(tmp_path_factory):
    """Our wheel, installed without dependencies into a directory the engine's
    interpreter gets on PYTHONPATH: the plugin is found through its metadata alone."""
    out = tmp_path_factory.mktemp("plugin")
    wheels = out / "wheels"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir",
                    str(wheels), str(ROOT)], check=True, timeout=600, capture_output=True)
    (wheel,) = wheels.glob("sglang_hydra-*.whl")
    target = out / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(wheel)], check=True, timeout=600, capture_output=True)
    return target


def _engine_config(policy, cfg, page_size):
    """T-LRU's token counts as the engine sees them: a replay page of ``page_size`` tokens is
    ``PAGE_TOKENS[page_size]`` engine tokens (the counts are multiples of every page size)."""
    if policy != "tlru" or not cfg:
        return cfg
    return {k: v * PAGE_TOKENS[page_size] // page_size for k, v in cfg.items()}


def _engine(requests, priorities, runs, overlay):
    env = dict(os.environ, PYTHONPATH=str(overlay), SGLANG_PLUGINS="hydra_eviction_policies")
    proc = subprocess.run([REFERENCE_PYTHON, str(ORACLE)], capture_output=True, text=True, timeout=1200,
                          input=json.dumps({"requests": requests, "priorities": priorities,
                                            "load_plugins": True, "runs": runs}), env=env)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return json.loads(proc.stdout)["runs"]


def _ours(reqs, policy, cfg, page_size, capacity_pages):
    """The tree's one-call loop: ``TieredCache.serve`` per request, in order."""
    cache = TieredCache(CountingMover(capacity_pages), policy=make_policy(policy, cfg, page_size=page_size),
                        page_size=page_size, hierarchical=False, semantics="sglang")
    out = []
    for r in reqs:
        keys, weights = request_units(r, page_size, 512)
        out.append(cache.serve(keys, priority=int(getattr(r, "priority", 0) or 0), weights=weights))
    return out


def _workloads():
    conv = list(load_trace(trace_path("conversation")))
    rng = random.Random(7)
    a = generate_conversations(conversations=90, max_turns=10, prefix_groups=3, seed=11)
    b = generate_conversations(conversations=150, max_turns=4, system_prompt_tokens=3000,
                               prefix_groups=6, think_time_s=5.0, seed=12)
    b = [dataclasses.replace(r, priority=rng.choice((0, 0, 1, 2))) for r in b]
    return {"conversation": (conv, BLOCK_CAPACITIES), "synthetic-long": (a, SYNTH_BLOCK_CAPACITIES),
            "synthetic-shared": (b, SYNTH_BLOCK_CAPACITIES)}


def _cases():
    for name, (reqs, caps) in _workloads().items():
        for ps in PAGE_SIZES:
            cut = reqs
            if name == "conversation" and ps == 128:
                cut = reqs[:CONVERSATION_REQUESTS_AT_128]
            yield name, cut, ps, caps


def test_sglang_semantics_hit_the_engine_exactly(plugin_overlay):
    """Identical per-request hit lengths, ours vs SGLang's RadixCache (plugin loaded)."""
    jobs = []
    for name, reqs, ps, caps in _cases():
        pages = [block_page_keys(r.hash_ids, r.input_length, ps) for r in reqs]
        prios = [int(getattr(r, "priority", 0) or 0) for r in reqs]
        per_block = 512 // ps
        runs = [{"policy": p, "policy_config": cfg, "page_tokens": PAGE_TOKENS[ps],
                 "capacity_pages": c * per_block, "cache": "server" if p in SERVER_BUILT else "radix"}
                for p, cfg in POLICIES.items() for c in caps]
        # the full trace: one engine process per policy, so that CI's cores share the work
        step = len(caps) if len(reqs) > 5000 else len(runs)
        for i in range(0, len(runs), step):
            jobs.append((name, reqs, ps, pages, prios, runs[i:i + step]))
    table = []
    problems = []
    totals = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        engine = [pool.submit(_engine, j[3], j[4],
                              [dict(r, policy_config=_engine_config(r["policy"], r["policy_config"], j[2]))
                               for r in j[5]], plugin_overlay) for j in jobs]
        # our replays run here while the engine processes work
        ours_all = [[_ours(reqs, run["policy"], run["policy_config"], ps, run["capacity_pages"])
                     for run in runs] for name, reqs, ps, pages, prios, runs in jobs]
        for (name, reqs, ps, pages, prios, runs), future, ours_runs in zip(jobs, engine, ours_all):
            for run, out, ours in zip(runs, future.result(), ours_runs):
                label = f"{name} page={ps} {run['policy']} C={run['capacity_pages']}"
                if "error" in out:
                    problems.append(f"{label}: engine failed: {out['error']}")
                    continue
                if run["policy"] == "span_lru":
                    assert out["policy_class"] == "SpanLRUStrategy", out["policy_class"]
                if run["policy"] in SERVER_BUILT:
                    cache_class, strategy = SERVER_BUILT[run["policy"]]
                    assert out["cache_class"] == cache_class, (label, out["cache_class"])
                    assert strategy is None or out["policy_class"] == strategy, (label, out["policy_class"])
                theirs = out["hits"]
                totals[(name, ps, run["policy"], run["capacity_pages"])] = sum(theirs)
                table.append(f"{label}: ours {sum(ours)} sglang {sum(theirs)} requests {len(reqs)}")
                if ours != theirs:
                    first = next(i for i, (x, y) in enumerate(zip(ours, theirs)) if x != y)
                    problems.append(f"{label}: first difference at request {first}: "
                                    f"ours {ours[first]} sglang {theirs[first]}")
    print("\n" + "\n".join(table))
    assert not problems, "\n".join(problems)
    # hit_density learned something the engine then applied: not LRU's hits everywhere
    learned = [k for k, v in totals.items() if k[2] == "hit_density" and v != totals[k[:2] + ("lru",) + k[3:]]]
    assert any(k[0] == "conversation" for k in learned), totals


@pytest.mark.parametrize("policy", ["span_lru", "ghost_lru"])
def test_plugin_policy_is_rejected_without_the_plugin(policy):
    """Without the plugin the engine does not know our policies (the plugin really is needed)."""
    proc = subprocess.run([REFERENCE_PYTHON, str(ORACLE)], capture_output=True, text=True, timeout=300,
                          input=json.dumps({"requests": [[1, 2]], "runs": [
                              {"policy": policy, "page_tokens": 1, "capacity_pages": 10}]}),
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    out = json.loads(proc.stdout)["runs"][0]
    assert f"Unknown eviction policy: {policy}" in out["error"]


@pytest.mark.parametrize("policy", ["span_lru", "ghost_lru", "hit_density"])
def test_check_engine_accepts_the_plugin_policy_once_installed(plugin_overlay, tmp_path, policy):
    """job=resolve job.check=engine with an interpreter that has SGLang and our wheel: the
    plugin check passes and SGLang itself (plugins loaded, as launch_server does) accepts
    --radix-eviction-policy <ours>."""
    python = tmp_path / "python-with-plugin"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={plugin_overlay} exec {REFERENCE_PYTHON} \"$@\"\n")
    python.chmod(0o755)
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=resolve", "job.check=engine", "job.format=argv",
                        f"memory.radix_eviction_policy={policy}", f"job.python={python}"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "SGLANG_PLUGINS"})
    assert r.returncode == 0, r.stderr
    assert f"--radix-eviction-policy {policy}" in r.stdout
    assert "SGLang 0.5.23 accepts this configuration" in r.stderr


def test_hooked_policy_refuses_a_server_its_cache_cannot_serve(plugin_overlay):
    """A ghost policy needs SGLang's RadixCache; for a hybrid (sliding-window) model the server
    stops with one line that says why, instead of running the policy without its hooks."""
    env = dict(os.environ, PYTHONPATH=str(plugin_overlay), SGLANG_PLUGINS="hydra_eviction_policies")
    proc = subprocess.run([REFERENCE_PYTHON, str(ORACLE)], capture_output=True, text=True, timeout=300,
                          input=json.dumps({"requests": [[1, 2]], "load_plugins": True, "runs": [
                              {"policy": "ghost_lru", "page_tokens": 1, "capacity_pages": 10, "cache": "server",
                               "model_shape": {"is_hybrid_swa": True}},
                              {"policy": "ghost_lru", "page_tokens": 1, "capacity_pages": 10, "cache": "server"}]}),
                          env=env)
    hybrid, plain = json.loads(proc.stdout)["runs"]
    assert "ghost_lru (sglang-hydra's plugin) runs in SGLang's RadixCache only" in hybrid["error"]
    assert "hybrid (sliding-window or state-space) model" in hybrid["error"]
    assert plain["cache_class"] == "HydraHookedRadixCache" and plain["hits"] == [0]


# ---------------------------------------------------------------------------------------------
# Through job=replay: the deployment loop the command line runs, one request at a time, against
# SGLang's RadixCache called as SGLang's scheduler calls it (oracle loop=scheduler): token ids
# from each block's hash, page 16, chunked prefill, the engine's own insertion of generated
# tokens at finish.  Cached tokens must be identical on every request.
SCHEDULER_POLICIES = {"lru": None, "lfu": None, "priority": None, "slru": {"protected_threshold": 2},
                      "span_lru": {"alpha": 1.0}, "ghost_lru": None, "ghost_lfu": None, "hit_density": None}
#: (workload, policy) pairs not yet identical through the scheduler path, and how many requests
#: may differ (docs/differential.md): ghost_lfu with request priorities and chunked prefill
NOT_YET_IDENTICAL = {("synthetic-shared", "ghost_lfu"): 3}
SCHEDULER_CASES = (  # workload, requests, page size, pool tokens, chunked prefill
    ("conversation", 400, 16, 30000, 4096),
    ("conversation", 2000, 16, 400000, 8192),
    ("synthetic-shared", 600, 16, 20000, 2048),
    ("synthetic-long", 500, 1, 12000, None),
)


def _replay_record(ps, pool, chunk, policy, cfg):
    from sglang_hydra.config.compose import compose_record

    over = ["model=llama3_1_8b", f"schedule.page_size={ps}", f"schedule.max_total_tokens={pool}",
            f"schedule.chunked_prefill_size={chunk or -1}", f"memory.radix_eviction_policy={policy}"]
    if cfg:
        over.append("memory.radix_eviction_policy_config={" + ",".join(f"{k}:{v}" for k, v in cfg.items()) + "}")
    return compose_record(over)


def _through_replay_job(reqs, policy, cfg, ps, pool, chunk):
    """``job=replay job.cache_semantics=sglang job.arrival=sequential``'s own path: the
    deployment ``jobs.replay.evaluate`` builds, simulated in its loop."""
    from sglang_hydra.config.hardware import compose_hardware
    from sglang_hydra.workload.assemble import DeploymentInputs, build_deployment
    from sglang_hydra.workload.deployment import simulate

    hw, problems = compose_hardware("h100_80gb", [])
    assert not problems
    built = build_deployment(DeploymentInputs(hardware=hw, record=_replay_record(ps, pool, chunk, policy, cfg),
                                              cache_mode="device_only", cache_semantics="sglang"))
    try:
        spec = built.model.groups["agg"].spec
        assert spec.pool_tokens == pool and spec.chunk_tokens == chunk
        fits = [r for r in reqs if r.input_length + 1 <= pool]
        sim = simulate(built.model, fits, arrival="sequential")
    finally:
        built.close()
    return fits, [s.device_hit for s in sim.requests]


def _scheduler_workloads():
    w = _workloads()
    return {name: reqs for name, (reqs, _) in w.items()}


def test_replay_job_follows_the_engine_scheduler_exactly(plugin_overlay):
    """Every request's cached tokens, job=replay's loop vs SGLang's RadixCache as its scheduler
    drives it (match capped at len-1 and page-aligned, checkpoints, output insertion)."""
    workloads = _scheduler_workloads()
    problems, table, totals = [], [], {}
    for name, n, ps, pool, chunk in SCHEDULER_CASES:
        reqs = workloads[name][:n]
        ours = {p: _through_replay_job(reqs, p, cfg, ps, pool, chunk) for p, cfg in SCHEDULER_POLICIES.items()}
        fits = ours["lru"][0]
        payload = [{"hash_ids": list(r.hash_ids), "input_length": r.input_length, "output_length": r.output_length,
                    "priority": int(getattr(r, "priority", 0) or 0)} for r in fits]
        runs = [{"loop": "scheduler", "policy": p, "policy_config": cfg, "page_size": ps, "pool_tokens": pool,
                 "chunk_tokens": chunk, "cache": "server" if p in SERVER_BUILT else "radix"}
                for p, cfg in SCHEDULER_POLICIES.items()]
        env = dict(os.environ, PYTHONPATH=str(plugin_overlay), SGLANG_PLUGINS="hydra_eviction_policies")
        proc = subprocess.run([REFERENCE_PYTHON, str(ORACLE)], capture_output=True, text=True, timeout=1800,
                              input=json.dumps({"requests": payload, "load_plugins": True, "runs": runs}), env=env)
        assert proc.stdout.strip(), proc.stderr[-3000:]
        for run, out in zip(runs, json.loads(proc.stdout)["runs"]):
            label = f"{name} page={ps} pool={pool} chunk={chunk} {run['policy']}"
            if "error" in out:
                problems.append(f"{label}: engine failed: {out['error']}")
                continue
            if run["policy"] in SERVER_BUILT:
                cache_class, strategy = SERVER_BUILT[run["policy"]]
                assert out["cache_class"] == cache_class and out["policy_class"] == strategy, (label, out)
            mine, theirs = ours[run["policy"]][1], out["hits"]
            assert sum(theirs) > 0, label            # the workload reuses something
            table.append(f"{label}: ours {sum(mine)} sglang {sum(theirs)} requests {len(theirs)}")
            if name == "conversation" and pool == 400000:
                totals[run["policy"]] = sum(theirs)
            allowed = NOT_YET_IDENTICAL.get((name, run["policy"]), 0)
            if sum(a != b for a, b in zip(mine, theirs)) > allowed or len(mine) != len(theirs):
                first = next(i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y)
                problems.append(f"{label}: first difference at request {first}: ours {mine[first]} "
                                f"sglang {theirs[first]} ({sum(a != b for a, b in zip(mine, theirs))} differ)")
    print("\n" + "\n".join(table))
    assert not problems, "\n".join(problems)
    # the pool is small enough to evict, and the policies choose differently
    assert len({totals[p] for p in SCHEDULER_POLICIES}) > 2, totals


def test_replay_job_command_line_gives_the_engine_hits(tmp_path):
    """The command line itself: job=replay's device_hit_tokens equal the sum the in-process loop
    (checked per request against the engine above) gives, for the same record."""
    reqs = list(load_trace(trace_path("conversation")))[:400]
    fits, hits = _through_replay_job(reqs, "lru", None, 16, 30000, 4096)
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=replay", "model=llama3_1_8b",
                        "hardware=h100_80gb", "job.trace=conversation", "job.max_requests=400",
                        "schedule.page_size=16", "schedule.max_total_tokens=30000",
                        "schedule.chunked_prefill_size=4096", "job.cache_semantics=sglang",
                        "job.arrival=sequential", "job.format=json", "job.progress=false"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cache"]["device_hit_tokens"] == sum(hits) > 0
    assert doc["requests"]["requests_completed"] == len(fits)
