"""Legacy-flag reading and value checks that the issue-13 review found wanting.

nargs flags take NAME=VALUE items (``--lora-paths a=/x``) as values; the export reads back to
the same record; non-finite floats are refused; a Hydra-side value meets the same value
parser as the flag form; flag mistakes are reported by the flag, not as Hydra noise.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from sglang_hydra import ConfigError, compose_record
from sglang_hydra.config.compose import build_command, compose_values
from sglang_hydra.config.legacy import is_hydra_override, split_argv, to_argv
from sglang_hydra.config.record import FIELDS

DEFAULTS = {n: fi.default_value() for n, fi in FIELDS.items()}


def _values(argv=(), overrides=()):
    cmd, _ = build_command(overrides=overrides, argv=list(argv))
    assert not cmd.problems, cmd.problems
    return compose_values(cmd).values


def _problems(argv=(), overrides=()):
    with pytest.raises(ConfigError) as exc:
        compose_record(argv=list(argv), overrides=list(overrides))
    return exc.value.problems


def _round_trip(values):
    back = to_argv(values, DEFAULTS)
    cmd, _ = build_command(argv=back)
    assert not cmd.problems, (back, cmd.problems)
    return compose_values(cmd).values


# --------------------------------------------------------------------------- nargs values
def test_lora_paths_take_name_equals_path_items_as_the_reference_does():
    split = split_argv(["--lora-paths", "a=/x", "b=/y", "job=resolve"])
    assert not split.problems, split.problems
    assert [(s.name, s.value) for _, s in split.settings] == [("lora_paths", ["a=/x", "b=/y"])]
    assert [t for _, t in split.overrides] == ["job=resolve"]


@pytest.mark.parametrize("override", ["memory.hicache_ratio=2", "job=resolve", "hydra.run.dir=out",
                                      "+extra=1", "deploy=pd", "decode.parallel.tp_size=2", "model=tiny"])
def test_an_override_of_a_known_key_ends_the_values_of_an_nargs_flag(override):
    assert is_hydra_override(override)
    split = split_argv(["--lora-paths", "a=/x", override])
    assert [s.value for _, s in split.settings] == [["a=/x"]]
    assert [t for _, t in split.overrides] == [override]


@pytest.mark.parametrize("token", ["a=/x", "my-adapter=/models/a", "adapter@v2=/x"])
def test_other_name_value_text_is_a_value(token):
    assert not is_hydra_override(token)


@pytest.mark.parametrize("argv, name, value", [
    (["--lora-paths", "a=/x", "b=/y"], "lora_paths", ["a=/x", "b=/y"]),
    (["--lora-paths", "a=/x", '{"lora_name":"n","lora_path":"/p"}'], "lora_paths",
     ["a=/x", {"lora_name": "n", "lora_path": "/p"}]),
    (["--lora-paths=job=weird"], "lora_paths", ["job=weird"]),
    (["--cuda-graph-bs-decode", "1", "2", "8"], "cuda_graph_bs_decode", [1, 2, 8]),
    (["--lora-target-modules", "q_proj", "v_proj"], "lora_target_modules", ["q_proj", "v_proj"]),
    (["--encoder-urls", "http://a:1", "http://b:2"], "encoder_urls", ["http://a:1", "http://b:2"]),
])
def test_exported_nargs_flags_read_back_to_the_same_record(argv, name, value):
    values = _values(argv)
    assert values[name] == value
    assert _round_trip(values) == values


def test_lora_paths_with_overrides_after_them_export_and_read_back():
    values = _values(["--lora-paths", "a=/x", "b=/y", "memory.hicache_ratio=2", "--enable-hierarchical-cache"])
    assert values["lora_paths"] == ["a=/x", "b=/y"] and values["hicache_ratio"] == 2.0
    exported = to_argv(values, DEFAULTS)
    assert exported[exported.index("--lora-paths") + 1:][:2] == ["a=/x", "b=/y"]
    assert _round_trip(values) == values


def test_lora_items_that_read_as_overrides_export_as_equivalent_json_objects():
    """The engine reads NAME=PATH and {"lora_name": NAME, "lora_path": PATH} alike
    (sglang/srt/arg_groups/lora_hook.py), so the export may spell a clashing item that way."""
    values = dict(DEFAULTS, lora_paths=["a=/x", "job=/y", "-odd"])
    exported = to_argv(values, DEFAULTS)
    i = exported.index("--lora-paths")
    assert exported[i + 1:i + 4] == ["a=/x", '{"lora_name": "job", "lora_path": "/y"}',
                                     '{"lora_name": "-odd", "lora_path": "-odd"}']
    assert _round_trip(values)["lora_paths"] == ["a=/x", {"lora_name": "job", "lora_path": "/y"},
                                                 {"lora_name": "-odd", "lora_path": "-odd"}]


# --------------------------------------------------------------------------- non-finite numbers
@pytest.mark.parametrize("argv, overrides, key, flag, allowed", [
    (["--hicache-ratio", "inf", "--enable-hierarchical-cache"], [], "memory.hicache_ratio", "--hicache-ratio",
     "allowed: a finite number"),
    (["--mem-fraction-static", "nan"], [], "schedule.mem_fraction_static", "--mem-fraction-static",
     "allowed: a finite number > 0 and <= 1"),
    ([], ["schedule.mem_fraction_static=nan"], "schedule.mem_fraction_static", "--mem-fraction-static",
     "allowed: a finite number > 0 and <= 1"),
    ([], ["memory.hicache_ratio=-inf"], "memory.hicache_ratio", "--hicache-ratio", "allowed: a finite number"),
    (["--swa-full-tokens-ratio", "inf"], [], "schedule.swa_full_tokens_ratio", "--swa-full-tokens-ratio",
     "allowed: a finite number"),
])
def test_non_finite_numbers_are_refused_naming_key_flag_value_and_range(argv, overrides, key, flag, allowed):
    (p,) = _problems(argv, overrides)
    assert (p.key, p.flag) == (key, flag)
    assert "is not a finite number" in p.message and allowed in p.message
    assert ("inf" in p.message) or ("nan" in p.message)


def test_plan_with_an_infinite_hicache_ratio_is_a_config_error_not_a_crash():
    proc = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=plan", "--hicache-ratio", "inf",
                           "--enable-hicache", "hardware=h100_80gb"], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2, proc.stderr
    assert "memory.hicache_ratio (--hicache-ratio)" in proc.stderr and "finite" in proc.stderr
    assert "Traceback" not in proc.stderr and "OverflowError" not in proc.stderr


def test_a_list_item_must_be_finite_too():
    (p,) = _problems(overrides=["exec.cuda_graph_bs_decode=[1,2]", "device.gpu_id_step=1",
                                "observability.bucket_time_to_first_token=[0.1,inf]"])
    assert p.key == "observability.bucket_time_to_first_token" and "item 2" in p.message and "finite" in p.message


# --------------------------------------------------------------------------- structured values
@pytest.mark.parametrize("override, words", [
    ("exec.cuda_graph_config={decode:{bogus:1}}", ["unknown key 'bogus'", "backend, bs, max_bs"]),
    ("exec.cuda_graph_config=[1]", ["must be a JSON object", "a list"]),
    ("exec.cuda_graph_config={warmup:{bs:[1]}}", ["unknown phase 'warmup'", "decode, prefill"]),
    ("exec.cuda_graph_config={decode:[1]}", ["['decode'] must be a JSON object"]),
    ("exec.cuda_graph_config={decode:{backend:tc_piecewise}}", ["tc_piecewise no longer exists"]),
])
def test_hydra_cuda_graph_config_meets_the_flags_value_parser(override, words):
    (p,) = _problems(overrides=[override])
    assert (p.key, p.flag) == ("exec.cuda_graph_config", "--cuda-graph-config")
    for w in words:
        assert w in p.message, p.message


def test_hydra_and_flag_cuda_graph_config_give_the_same_value_and_export():
    hydra = _values(overrides=["exec.cuda_graph_config={decode:{bs:[1,2]},prefill:{max_seq_len:128}}"])
    flag = _values(["--cuda-graph-config", '{"decode":{"bs":[1,2]},"prefill":{"max_seq_len":128}}'])
    assert hydra["cuda_graph_config"] == flag["cuda_graph_config"] == {"decode": {"bs": [1, 2]},
                                                                       "prefill": {"max_seq_len": 128}}
    assert to_argv(hydra, DEFAULTS) == to_argv(flag, DEFAULTS)
    assert _round_trip(hydra) == hydra


# --------------------------------------------------------------------------- list and suffix consistency
def test_a_scalar_for_a_list_field_is_a_one_item_list_on_both_sides():
    assert _values(overrides=["exec.cuda_graph_bs_decode=4"])["cuda_graph_bs_decode"] == [4]
    assert _values(["--cuda-graph-bs-decode", "4"])["cuda_graph_bs_decode"] == [4]
    assert _values(overrides=["lora.lora_target_modules=q_proj"])["lora_target_modules"] == ["q_proj"]


def test_si_suffixes_work_for_the_key_as_for_the_flag():
    assert _values(overrides=["model.context_length=32k"])["context_length"] == 32000
    assert _values(["--context-length", "32k"])["context_length"] == 32000
    assert _values(overrides=["model.context_length=4Ki"])["context_length"] == 4096
    (p,) = _problems(overrides=["model.context_length=32q"])
    assert p.key == "model.context_length" and "32q" in p.message


def test_a_bad_list_item_is_named():
    (p,) = _problems(overrides=["exec.cuda_graph_bs_decode=[1,2,a]"])
    assert (p.key, p.flag) == ("exec.cuda_graph_bs_decode", "--cuda-graph-bs-decode")
    assert "item 3 ('a') is not an integer" in p.message
    assert "is not a list" not in p.message


# --------------------------------------------------------------------------- flag mistakes
def test_single_dash_flag_suggests_the_double_dash_one_and_skips_its_value():
    split = split_argv(["-tp", "2", "job=resolve"])
    assert [p.message for p in split.problems] == [
        "unrecognized flag -tp; did you mean --tp (--tp-size)? (flags take two dashes)"]
    assert [t for _, t in split.overrides] == ["job=resolve"]


@pytest.mark.parametrize("flag, words", [("--cuda-graph-bs", "ambiguous flag --cuda-graph-bs"),
                                         ("--cuda-graf-bs-decode", "did you mean --cuda-graph-bs-decode?")])
def test_an_unknown_or_ambiguous_flag_skips_all_its_values(flag, words):
    split = split_argv([flag, "1", "2", "4", "8", "job=resolve"])
    assert len(split.problems) == 1 and words in split.problems[0].message
    assert [t for _, t in split.overrides] == ["job=resolve"]


@pytest.mark.parametrize("flag, key", [("--enable-metrics", "observability.enable_metrics"),
                                       ("--disable-radix-cache", "memory.disable_radix_cache")])
def test_a_switch_given_a_word_names_the_flag(flag, key):
    split = split_argv([flag, "yes", "job=resolve"])
    (p,) = split.problems
    assert (p.key, p.flag) == (key, flag)
    assert "takes no value" in p.message and "'yes'" in p.message and f"{key}=true/false" in p.message
    assert [t for _, t in split.overrides] == ["job=resolve"]


def test_a_valued_flag_followed_by_an_override_says_its_value_is_missing():
    split = split_argv(["--tp", "job=resolve", "job.format=argv"])
    (p,) = split.problems
    assert (p.key, p.flag) == ("parallel.tp_size", "--tp-size")
    assert "expects a value" in p.message and "'job=resolve'" in p.message
    assert [t for _, t in split.overrides] == ["job=resolve", "job.format=argv"]


def test_a_valued_flag_still_takes_plain_name_value_text():
    split = split_argv(["--served-model-name", "team=a"])
    assert not split.problems and [s.value for _, s in split.settings] == ["team=a"]
