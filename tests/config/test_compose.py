"""Composition: both syntaxes, presets, strict keys, --config, and the two composers agreeing."""
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from sglang_hydra import ConfigError, ServerArgs, compose_record
from sglang_hydra.config.coerce import allowed_choices, base_type
from sglang_hydra.config.compose import (build_command, compose_values, compose_with_hydra, record_from_values,
                                          render_value, needs_hydra)
from sglang_hydra.config.legacy import cli_fields
from sglang_hydra.config.record import FIELDS
from sglang_hydra.config.spec import primary_flag

sys.path.insert(0, str(Path(__file__).parent))


def _non_default(fi):
    """A legal value different from the default, as (python value, legacy argv tokens)."""
    if fi.arg.actions:  # reference fields from the schema snapshot: every action kind
        import random
        from surface_values import sample
        return sample(fi, random.Random(fi.name))
    tp, optional = base_type(fi)
    opts = allowed_choices(fi)
    default = fi.default_value()
    flag = primary_flag(fi.name, fi.arg)
    if tp is bool:
        return True, [flag]
    if opts:
        v = next(o for o in reversed(opts) if o != default)
        return v, [flag, v]
    if fi.arg.parser == "json":
        return {"k": 1}, [flag, '{"k": 1}']
    if fi.arg.parser == "json_list":
        return ["a", "b"], [flag, '["a", "b"]']
    if typing.get_origin(tp) is list:
        return ["u1", "u2"], [flag, "u1", "u2"]
    if tp is int:
        v = (default or 0) + 3
        return v, [flag, str(v)]
    if tp is float:
        return 0.5, [flag, "0.5"]
    return "value-x", [flag, "value-x"]


def test_every_legacy_flag_equals_its_hydra_override_batched():
    """One legacy command line with every field, one Hydra override list: identical settings."""
    argv, overrides, expect = [], [], {}
    for fi in cli_fields():
        got = _non_default(fi)
        if got is None:  # a flag that cannot leave its default (a single choice, store_true on a True default)
            continue
        v, tokens = got
        argv += tokens
        overrides.append(f"{fi.key}={render_value(v)}")
        expect[fi.name] = v
    legacy, _ = build_command(argv=argv)
    hydra, _ = build_command(overrides=overrides)
    assert not legacy.problems and not hydra.problems
    a = compose_values(legacy).values
    b = compose_values(hydra).values
    for name, v in expect.items():
        assert a[name] == v, name
        assert b[name] == v, name
    assert a == b


def test_direct_and_hydra_composers_agree():
    cases = [
        [], ["memory=hicache", "memory.hicache_ratio=3"], ["disagg=decode", "model=llama3_8b"],
        ["memory=hicache_file", "schedule.page_size=16", "++memory.hicache_size=4"],
        ["memory.radix_eviction_policy_config={threshold:8192,next_prompt_estimate:512}", "memory.radix_eviction_policy=tlru"],
        ["disagg.encoder_urls=[a,b]", "memory.hicache_storage_backend_extra_config='{\"a\": 1}'"],
    ]
    for ov in cases:
        cmd, _ = build_command(overrides=ov)
        assert not cmd.problems, ov
        direct = compose_values(cmd)
        via_hydra = compose_with_hydra(cmd)
        assert direct.values == via_hydra.values, ov
        assert direct.explicit == via_hydra.explicit, ov


def test_no_overrides_equals_defaults():
    cmd, _ = build_command()
    values = compose_with_hydra(cmd).values
    plain = ServerArgs()
    for name in FIELDS:
        assert values[name] == getattr(plain, name), name


def test_last_occurrence_wins_across_syntaxes():
    assert compose_record(argv=["--hicache-ratio", "3", "memory.hicache_ratio=4"]).hicache_ratio == 4.0
    assert compose_record(argv=["memory.hicache_ratio=4", "--hicache-ratio", "3"]).hicache_ratio == 3.0
    assert compose_record(argv=["--hicache-ratio=5", "--hicache-ratio", "6"]).hicache_ratio == 6.0


def test_presets_and_precedence(tmp_path):
    r = compose_record(overrides=["memory=hicache_file"])
    assert r.enable_hierarchical_cache and r.hicache_storage_backend == "file"
    cfg = tmp_path / "server.yaml"
    cfg.write_text("hicache-ratio: 5\nenable-hierarchical-cache: true\nmemory:\n  hicache_size: 0\ntp-size: 2\n")
    r = compose_record(config_file=str(cfg))
    assert (r.hicache_ratio, r.enable_hierarchical_cache, r.tp_size) == (5.0, True, 2)
    r = compose_record(argv=["--config", str(cfg), "--hicache-ratio", "7"])
    assert r.hicache_ratio == 7.0  # the command line beats the file
    (tmp_path / "bad.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        compose_record(config_file=str(tmp_path / "bad.yaml"))
    with pytest.raises(ConfigError, match="only .yaml"):
        compose_record(config_file=str(tmp_path / "x.json"))


def test_strict_keys_even_with_plus():
    for ov in ["memory.hicache_ratoi=5", "+memory.hicache_ratoi=5", "++memory.hicache_ratoi=5"]:
        with pytest.raises(ConfigError) as ei:
            compose_record(overrides=[ov])
        assert ei.value.problems[0].key == "memory.hicache_ratoi"
        assert "did you mean 'memory.hicache_ratio'" in ei.value.problems[0].message
    with pytest.raises(ConfigError, match="no preset 'hicach'.*did you mean"):
        compose_record(overrides=["memory=hicach"])
    with pytest.raises(ConfigError, match="did you mean --hicache-ratio"):
        compose_record(argv=["--hicache-ration", "2"])


def test_type_errors_name_key_flag_value_and_allowed():
    with pytest.raises(ConfigError) as ei:
        compose_record(overrides=["memory.hicache_ratio=abc", "memory.radix_eviction_policy=fifo", "schedule.page_size=1.5"])
    ps = {p.key: p for p in ei.value.problems}
    assert ps["memory.hicache_ratio"].flag == "--hicache-ratio" and "'abc' is not a number" in ps["memory.hicache_ratio"].message
    assert "lru, lfu, slru, priority, tlru" in ps["memory.radix_eviction_policy"].message
    assert "schedule.page_size" in ps


def test_null_string_choice_from_hydra():
    r = compose_record(overrides=["disagg.disaggregation_mode=null"])
    assert r.disaggregation_mode == "null"


def test_plugin_extends_choices():
    from sglang_hydra.config.choices import add_radix_eviction_policy_choices
    add_radix_eviction_policy_choices("myplugin_policy")
    r = compose_record(argv=["--radix-eviction-policy", "myplugin_policy"])
    assert r.radix_eviction_policy == "myplugin_policy"


def test_sweep_needs_multirun():
    with pytest.raises(ConfigError, match="run it with -m"):
        compose_record(overrides=["memory.hicache_ratio=1,2"])


@settings(max_examples=200, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=20),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.from_regex(r'[A-Za-z_][A-Za-z0-9_]{0,5}', fullmatch=True), c, max_size=3),
    max_leaves=6))
def test_rendered_values_parse_back(value):
    """Legacy values are handed to Hydra as override text; the grammar must give them back unchanged."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    (ov,) = OverridesParser.create().parse_overrides([f"memory.radix_cache_backend={render_value(value)}"])
    assert ov.value() == value


def test_record_from_values_rejects_bookkeeping_fields():
    with pytest.raises(ConfigError):
        record_from_values({"_radix_eviction_policy_explicitly_set": True})


def test_global_preset_sets_other_namespaces_and_the_command_line_wins():
    # memory/hicache_file is a `# @package _global_` preset: it also picks 64-token pages,
    # because the file tier keeps one file per page.
    r = compose_record(overrides=["memory=hicache_file"])
    assert (r.hicache_storage_backend, r.page_size) == ("file", 64) and r.is_explicit("page_size")
    assert compose_record(overrides=["memory=hicache_file"], argv=["--page-size", "16"]).page_size == 16
    cmd, _ = build_command(overrides=["memory=hicache_file"])
    assert not needs_hydra(cmd)   # still the fast direct composer
