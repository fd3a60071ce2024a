"""The start-up shortcuts of runs that need Hydra's runtime (sglang_hydra.jobs.startup)."""
import json
import subprocess
import sys

from sglang_hydra.jobs.startup import mode_is_unset, plugin_packages_needed


def test_which_plugin_packages_a_command_needs():
    assert plugin_packages_needed([], []) == set()
    assert plugin_packages_needed(["hydra.run.dir=out"], []) == set()
    assert plugin_packages_needed(["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], ["-m"]) == {"hydra_joblib_launcher"}
    assert plugin_packages_needed(["hydra/launcher=ray_local"], ["-m"]) == {"hydra_ray_launcher"}
    assert plugin_packages_needed(["hydra/launcher=submitit_slurm"], []) == {"hydra_submitit_launcher"}
    assert plugin_packages_needed(["hydra/sweeper=optuna", "hydra/launcher=joblib"], ["-m"]) == {
        "hydra_optuna_sweeper", "hydra_joblib_launcher"}
    # Anything we cannot map to a package, and flags that list plugins, scan everything.
    assert plugin_packages_needed(["hydra/launcher=my_cluster"], ["-m"]) is None
    assert plugin_packages_needed(["hydra.searchpath=[file:///x]"], []) is None
    assert plugin_packages_needed([], ["--info", "plugins"]) is None
    assert plugin_packages_needed([], ["--hydra-help"]) is None


def test_when_the_mode_is_unset():
    assert mode_is_unset(["hydra.run.dir=out"]) and mode_is_unset([])
    assert not mode_is_unset(["hydra.mode=MULTIRUN"])
    assert not mode_is_unset(["hydra.searchpath=[pkg://x]"])


# Compares the registry built by discover_plugins with Hydra's own full scan, in a child
# process each (the registry is a process-wide singleton).
_REGISTRY = """
import json, sys
from hydra.core.plugins import Plugins
from sglang_hydra.jobs.startup import discover_plugins
needed = json.loads(sys.argv[1])
used = discover_plugins(None if needed is None else set(needed))
reg = Plugins.instance()
print(json.dumps({"used": used, "classes": sorted(reg.class_name_to_class),
                  "by_type": {t.__name__: sorted(c.__name__ for c in cs) for t, cs in reg.plugin_type_to_subclass_list.items()}}))
"""


def _registry(needed):
    r = subprocess.run([sys.executable, "-c", _REGISTRY, json.dumps(needed)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_slim_registry_is_the_full_one_minus_the_unselected_packages():
    full = _registry(None)
    assert full["used"] is False
    slim = _registry([])
    assert slim["used"] is True
    on_demand = ("hydra_ray_launcher", "hydra_submitit_launcher", "hydra_joblib_launcher", "hydra_optuna_sweeper")
    expected = [c for c in full["classes"] if not any(f"hydra_plugins.{p}." in c for p in on_demand)]
    assert slim["classes"] == expected and len(expected) < len(full["classes"])
    assert "hydra._internal.core_plugins.basic_launcher.BasicLauncher" in slim["classes"]
    assert any("file_config_source" in c for c in slim["classes"])
    # Asking for one package brings exactly its classes back.
    joblib = _registry(["hydra_joblib_launcher"])
    assert set(joblib["classes"]) - set(slim["classes"]) == {
        c for c in full["classes"] if "hydra_plugins.hydra_joblib_launcher." in c}
    assert "JoblibLauncher" in joblib["by_type"]["Launcher"]
