"""The engine plugin: what it imports, how it is declared, and the checks that need it.

That SGLang itself loads it and uses its strategy (identical hits) is
tests/cache/test_engine_radix_differential.py (reference venv)."""
import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from sglang_hydra.cache.policies import (
    available_policies,
    make_policy,
    policy_needs_plugin,
    policy_runs_in_sglang,
    validate_policy_config,
)
from sglang_hydra.cache import sglang_plugin

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "sglang_hydra" / "cache" / "sglang_plugin.py"


def test_entry_point_declared_in_the_plugin_group():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = meta["project"]["entry-points"]["sglang.srt.plugins"]
    assert eps == {sglang_plugin.PLUGIN_NAME: "sglang_hydra.cache.sglang_plugin:register"}


def test_plugin_module_imports_only_the_standard_library_and_sglang():
    """The plugin and the sibling modules it imports relatively (the ``hit_density`` core),
    recursively: nothing but the standard library and SGLang."""
    todo, seen = [PLUGIN], set()
    while todo:
        path = todo.pop()
        seen.add(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    assert node.level == 1 and node.module, (path.name, node.module)
                    sibling = PLUGIN.parent / (node.module.replace(".", "/") + ".py")
                    assert sibling.is_file(), (path.name, node.module)
                    if sibling not in seen:
                        todo.append(sibling)
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top == "sglang" or top in sys.stdlib_module_names or name == "__future__", (path.name, name)
    assert PLUGIN.parent / "hit_density_core.py" in seen


def test_importing_the_plugin_pulls_in_no_hydra_omegaconf_or_torch():
    code = ("import sys, sglang_hydra.cache.sglang_plugin as p; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('hydra', 'omegaconf', 'torch', 'numpy', 'yaml', 'triton')); "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr


def test_importing_the_plugin_in_a_clean_interpreter_loads_no_other_project_module():
    """The package's import side effects are deferred: SGLang loading the plugin gets the plugin, its
    std-lib-only sibling, the two package ``__init__`` files and the config layer's std-lib-only
    registry (which only stores the deferred registration) -- no jobs, config composer or cache."""
    code = ("import sys, json, sglang_hydra.cache.sglang_plugin; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'sglang_hydra')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["sglang_hydra", "sglang_hydra.cache", "sglang_hydra.cache.hit_density_core",
                                    "sglang_hydra.cache.sglang_plugin", "sglang_hydra.config",
                                    "sglang_hydra.config.registry"]


def test_the_deferred_registration_runs_on_the_first_read_of_a_registry():
    code = ("import sys, sglang_hydra; from sglang_hydra.config.choices import choices; "
            "before = 'sglang_hydra.jobs.specs' in sys.modules; names = choices('RADIX_EVICTION_POLICY'); "
            "print(before, 'ghost_lru' in names, 'hit_density' in names, 'sglang_hydra.jobs.specs' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "True", "True"]


def test_which_policies_need_the_plugin():
    for name in ("span_lru", "ghost_lru", "ghost_lfu"):
        assert policy_needs_plugin(name) and policy_runs_in_sglang(name)
    assert not policy_needs_plugin("lru") and policy_runs_in_sglang("lru")
    assert not policy_runs_in_sglang("belady")
    # the ghost policies need insert/evict hooks: the plugin's hooked radix cache provides them
    assert set(sglang_plugin.HOOKED_POLICIES) == {"ghost_lru", "ghost_lfu", "hit_density"}
    # auto_ghost_lfu's miniature caches are not in the plugin: replay-only
    assert "auto_ghost_lfu" in available_policies() and not policy_runs_in_sglang("auto_ghost_lfu")
    # hit_density's state machine is in the std-lib-only core the plugin runs
    assert policy_needs_plugin("hit_density") and policy_runs_in_sglang("hit_density")
    # every plugin policy is one of ours with the same parameters
    for name, params in sglang_plugin.PLUGIN_POLICIES.items():
        assert name in available_policies()
        assert make_policy(name).params() == params


def test_span_lru_config_keys_are_checked():
    assert validate_policy_config("span_lru", {"alpha": 2}) == []
    (msg,) = validate_policy_config("span_lru", {"beta": 1})
    assert "unknown key 'beta'" in msg and "'alpha'" in msg


def _no_plugin_python(tmp_path):
    """An interpreter that sees no installed distributions (isolated, no site-packages)."""
    exe = tmp_path / "bare-python"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def run(*args, cwd):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


def test_check_engine_says_how_to_install_the_plugin(tmp_path):
    py = _no_plugin_python(tmp_path)
    r = run("job=resolve", "job.check=engine", "memory.radix_eviction_policy=span_lru", f"job.python={py}",
            cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("  - ")]
    assert len(lines) == 1 and "memory.radix_eviction_policy (--radix-eviction-policy)" in lines[0]
    assert f"{py} -m pip install --no-deps sglang-hydra" in lines[0]


def test_replay_only_policies_cannot_be_deployed(tmp_path):
    r = run("job=resolve", "job.check=engine", "memory.radix_eviction_policy=auto_ghost_lfu", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "'auto_ghost_lfu' is a replay-only policy" in r.stderr and "ghost_lru" in r.stderr
    r = run("job=launch", "job.dry_run=true", "memory.radix_eviction_policy=auto_ghost_lfu", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--radix-eviction-policy auto_ghost_lfu" in r.stdout
    assert "note: memory.radix_eviction_policy: 'auto_ghost_lfu' is a replay-only policy" in r.stderr
    for policy in ("span_lru", "ghost_lru"):
        # job=launch carries the plugin to its servers itself (an overlay on their PYTHONPATH,
        # docs/launch.md), so an interpreter without it is no problem; this one fails for its own
        # reasons (no SGLang, a test geometry), and only those are reported
        r = run("job=launch", f"memory.radix_eviction_policy={policy}", f"job.python={_no_plugin_python(tmp_path)}",
                cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert "engine plugin" not in r.stderr and "cannot import 'sglang'" in r.stderr


def test_ghost_lru_is_not_replay_only_for_launch(tmp_path):
    """With the plugin in job.python (here: this interpreter, which has the package's entry
    point), job=launch job.dry_run=true prints the policy without a replay-only note."""
    import importlib.metadata as md
    assert any(e.name == sglang_plugin.PLUGIN_NAME for e in md.entry_points(group="sglang.srt.plugins"))
    r = run("job=launch", "job.dry_run=true", "memory.radix_eviction_policy=ghost_lru", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "--radix-eviction-policy ghost_lru" in r.stdout
    assert "replay-only" not in r.stderr and "ghost_lru" not in r.stderr


# ------------------------------------------------------------ the ghost history (shared with the replay)
def test_ghost_history_resumes_the_largest_count_and_forgets_first_in_first_out():
    h = sglang_plugin.ghost_history("ghost_lru", {})
    h.bind(2)                          # 8 x 2 pages of ghost
    h.forget(["a", "b", "c"], 3, idle=10)
    assert h.life == 0.0               # only nodes read once teach the lifetime
    h.forget(["d"], 1, idle=100)
    assert h.life == 100 * 0.01
    assert h.admit(["x", "b", "d"]) == 3 and "b" not in h.ghost and "d" not in h.ghost
    assert h.admit(["b"]) == 0         # popped
    h.forget([f"p{i}" for i in range(20)], 1, idle=0)
    assert len(h.ghost) == 16 and "a" not in h.ghost and "p19" in h.ghost


def test_ghost_priorities():
    lru = sglang_plugin.ghost_history("ghost_lru", {"alpha": 2.0})
    lru.life = 10.0
    assert lru.priority(1, 5.0) == (5.0, 5.0)
    assert lru.priority(2, 5.0) == lru.priority(9, 5.0) == (25.0, 5.0)
    lfu = sglang_plugin.ghost_history("ghost_lfu", {"alpha": 1.0, "beta": 1.0, "cap": 3.0})
    lfu.life = 10.0
    assert [lfu.priority(c, 0.0)[0] for c in (1, 2, 3, 4, 9)] == [0.0, 10.0, 20.0, 30.0, 30.0]


def test_ghost_history_checks_its_parameters():
    import pytest
    with pytest.raises(ValueError, match="'ewma' must be a number in"):
        sglang_plugin.ghost_history("ghost_lru", {"ewma": 0})
    with pytest.raises(ValueError, match="unknown parameter"):
        sglang_plugin.ghost_history("ghost_lru", {"beta": 1})


# ------------------------------------------------- the replay runs the ghost policies as the plugin does
def _engine_tree(capacity, name="ghost_lru", **cfg):
    from sglang_hydra.cache.radix import RadixTree
    return RadixTree(capacity, make_policy(name, cfg or None), semantics="sglang")


def test_sglang_semantics_evaluate_ghost_keys_when_evict_starts():
    """The engine builds its eviction heap from every leaf's priority at each evict(): a
    credit learnt after a leaf was last touched still protects it."""
    tree = _engine_tree(4)
    assert tree.serve([1, 2]) == 0 and tree.serve([1, 2]) == 2     # proven: two hits
    tree.serve([3, 4])                                               # read once, younger
    tree.policy.history.life = 1000.0                                # a long one-hit lifetime
    tree.serve([5, 6])                                               # evicts [3, 4], not [1, 2]
    assert tree.serve([1, 2]) == 2
    tree.check_invariants()


def test_sglang_semantics_keep_one_count_per_engine_node_and_a_ghost_per_page():
    tree = _engine_tree(3)
    tree.serve([1, 2, 3])
    tree.serve([1, 2, 3])                                            # one engine node, 2 hits
    before = tree._mono
    tree.serve([7, 8, 9])                                            # evicts the whole node
    assert tree._mono == before + 1 + 1 + 2 + 1                      # match, evict (one clock read), insert, new node
    ghost = tree.policy.history.ghost
    assert dict(ghost) == {(1, 0): 2, (2, 0): 2, (3, 0): 2}
    tree.serve([1, 2])                                               # a new node of two of those pages
    counts = {n.key: n.hit_count for n in tree.iter_nodes()}
    assert counts == {1: 3, 2: 3}                                    # resumed 2, plus this insert
    assert (3, 0) in ghost and (1, 0) not in ghost


def test_rules_semantics_keep_the_documented_ghost_lru():
    """Under the replay rules nothing changes: per-page ghost entries, keys frozen at push."""
    from sglang_hydra.cache.radix import RadixTree
    tree = RadixTree(4, make_policy("ghost_lru"))
    assert not tree.policy.engine_node_hooks and tree.policy.wants_insert_hook
    tree.serve([1, 2])
    tree.serve([3, 4, 5])
    assert dict(tree.policy._ghost) == {2: 1}                        # one page (the leaf) freed, as the rules say


def test_a_ghost_policy_with_hicache_cannot_be_deployed(tmp_path):
    """The hooked RadixCache serves plain models only: with HiCache SGLang builds another cache."""
    r = run("job=resolve", "job.check=engine", "memory.radix_eviction_policy=ghost_lru",
            "memory.enable_hierarchical_cache=true", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("  - ")]
    assert len(lines) == 1 and "memory.radix_eviction_policy (--radix-eviction-policy)" in lines[0]
    assert "does not use with --enable-hierarchical-cache" in lines[0]
