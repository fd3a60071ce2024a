"""The pieces of a deployment sweep: splitting Hydra's part off, expanding the points, the
directories, and which swept values are refused before anything runs."""
from pathlib import Path

from sglang_hydra.config.deploy.request import _nest_dotted
from sglang_hydra.config.errors import Problem
from sglang_hydra.jobs.deploy_sweep import (command_overrides, expand_sweep, never_working, resolve_dirs,
                                            split_runtime)


def test_split_runtime_keeps_what_a_deployment_honours():
    rt = split_runtime(["-m", "deploy=pd", "hydra.sweep.dir=S", "hydra/launcher=basic", "hydra.run.dir=R",
                        "--page-size", "16"])
    assert rt.multirun and rt.settings == {"hydra.sweep.dir": "S", "hydra.run.dir": "R"}
    assert rt.argv == ["deploy=pd", "--page-size", "16"] and not rt.problems
    rt = split_runtime(["deploy=pd", "hydra/sweeper=optuna", "hydra.job.chdir=true"])
    assert [p.key for p in rt.problems] == ["hydra/sweeper", "hydra.job.chdir"] and not rt.multirun


def test_expand_sweep_is_the_basic_sweepers_product_in_order():
    points, problems = expand_sweep(["deploy=pd", "deploy.prefill_workers=range(1,3)",
                                     "disagg.disaggregation_transfer_backend=choice(mooncake,zmq)",
                                     "--page-size", "16", "x=1"])
    assert not problems
    assert [p.overrides for p in points] == [
        ["deploy=pd", "deploy.prefill_workers=1", "disagg.disaggregation_transfer_backend=mooncake", "x=1"],
        ["deploy=pd", "deploy.prefill_workers=1", "disagg.disaggregation_transfer_backend=zmq", "x=1"],
        ["deploy=pd", "deploy.prefill_workers=2", "disagg.disaggregation_transfer_backend=mooncake", "x=1"],
        ["deploy=pd", "deploy.prefill_workers=2", "disagg.disaggregation_transfer_backend=zmq", "x=1"]]
    assert points[3].argv[3:5] == ["--page-size", "16"] and [p.num for p in points] == [0, 1, 2, 3]


def test_expand_sweep_globs_config_groups_and_refuses_intervals():
    points, problems = expand_sweep(["model=glob(llama3_1_8*)"])
    assert not problems and [p.overrides for p in points] == [["model=llama3_1_8b"]]
    _points, problems = expand_sweep(["deploy.workers=interval(1,4)"])
    assert problems[0].key == "deploy.workers" and "interval()" in problems[0].message


def test_resolve_dirs_follows_sweep_dir_and_subdir():
    points, _ = expand_sweep(["a=1,2"])
    root, dirs, problems = resolve_dirs({"hydra.sweep.dir": "S", "hydra.sweep.subdir": "${hydra.job.override_dirname}"},
                                        points, multirun=True)
    assert not problems and root == Path("S") and dirs == [Path("S/a=1"), Path("S/a=2")]
    root, dirs, _ = resolve_dirs({}, points, multirun=True)
    assert root.parts[0] == "multirun" and dirs == [root / "0", root / "1"]
    _root, _dirs, problems = resolve_dirs({"hydra.sweep.subdir": "same"}, points, multirun=True)
    assert problems[0].key == "hydra.sweep.subdir"
    assert resolve_dirs({}, points[:1], multirun=False) == (None, [], [])
    assert resolve_dirs({"hydra.run.dir": "R"}, points[:1], multirun=False)[0] == Path("R")


def test_never_working_names_values_that_fail_everywhere_on_their_own_key():
    points, _ = expand_sweep(["deploy.prefill_workers=0,2,7", "prefill.parallel.tp_size=1,2"])
    zero = Problem("deploy.prefill_workers", None, "0 is not a positive whole number")
    budget = Problem("deploy", None, "15 GPUs, over one node")
    failed = {0: [zero], 1: [zero], 5: [budget]}      # 7 x tp 2 fails on the budget alone
    assert never_working(points, failed) == [zero]
    assert never_working(points, {5: [budget]}) == []


def test_command_overrides_and_flat_deploy_keys_in_a_config_file():
    assert command_overrides(["-m", "a=1", "--page-size", "16", "b=2"]) == ["a=1", "b=2"]
    assert _nest_dotted({"deploy": "pd", "deploy.prefill_workers": 4, "prefill.parallel.tp_size": 2, "model": "m"}) \
        == {"deploy": {"name": "pd", "prefill_workers": 4}, "prefill": {"parallel.tp_size": 2}, "model": "m"}
