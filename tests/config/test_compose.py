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


# ----------------------------------------------------------------- the two composers on many commands
_GROUPS = {"memory": ["default", "hicache", "hicache_file"], "disagg": ["none", "prefill", "decode"],
           "model": ["tiny", "llama3_8b", "qwen2_7b", "deepseek_v3", "tiny_mla"],
           "hardware": ["local", "h100_80gb", "a100_80gb", "h200_141gb", "l40s_48gb"]}
# sweeps as a user writes them; a sweep job composes one point of each (what the sweeper hands it)
_SWEEPS = {"memory.hicache_ratio": "1,2,4", "memory.radix_eviction_policy": "lru,lfu,slru",
           "schedule.page_size": "1,16,64", "schedule.max_total_tokens": "4096,65536",
           "memory.hicache_write_policy": "write_through,write_back"}
_CONFIG_FILES = {
    "flags.yaml": "hicache-ratio: 5\nenable-hierarchical-cache: true\ntp-size: 2\n",
    "nested.yaml": "memory:\n  hicache_size: 0\n  radix_eviction_policy: lfu\nschedule:\n  page_size: 32\n",
    "mixed.yaml": "page-size: 16\nserving:\n  port: 31000\n",
}
N_SEEDED = 500


def _seeded_command(rng, cfg_dir):
    """One random command: presets, Hydra overrides and legacy flags for random fields, sweep
    points, maybe a --config file (all legal, so both composers must give a record)."""
    fields = [fi for fi in cli_fields()]
    overrides, argv, config_file = [], [], None
    for g, opts in _GROUPS.items():
        if rng.random() < 0.4:
            overrides.append(f"{g}={rng.choice(opts)}")
    for _ in range(rng.randrange(0, 5)):
        fi = rng.choice(fields)
        got = _non_default(fi)
        if got is None:
            continue
        v, tokens = got
        if rng.random() < 0.5:
            overrides.append(f"{fi.key}={render_value(v)}")
        else:
            argv += tokens
    for key, sweep in _SWEEPS.items():
        if rng.random() < 0.2:
            overrides.append(f"{key}={rng.choice(sweep.split(','))}")
    if rng.random() < 0.25:
        config_file = str(cfg_dir / rng.choice(sorted(_CONFIG_FILES)))
    rng.shuffle(overrides)
    return overrides, argv, config_file


def _resolved(composed):
    """The resolved record's fields, or the resolution's problems (both composers must agree)."""
    from sglang_hydra.config.resolve import resolve
    try:
        return resolve(composed.values, explicit=composed.explicit, env={}).to_dict()
    except ConfigError as e:
        return sorted(str(p) for p in e.problems)


class _HydraComposer:
    """Hydra's own composition, with one ``compose`` per distinct set of group choices.

    A Hydra compose is ~0.3-1 s here, nearly all of it building the defaults list, which
    depends only on the group choices. So the defaults are composed by Hydra once per
    distinct choice set, and each command's value overrides are then applied by Hydra's own
    ``ConfigLoaderImpl._apply_overrides_to_config``, the function ``compose`` itself runs
    after the defaults (same order: groups first, then values in command order).
    ``test_the_cached_hydra_path_equals_a_full_compose`` holds the shortcut to full composes.
    """

    def __init__(self):
        from sglang_hydra.config.presets import conf_dir
        self.groups = {p.name for p in conf_dir().iterdir() if p.is_dir()}
        self.cache = {}
        self.composes = 0

    def __call__(self, cmd):
        import copy
        from hydra import compose
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf
        from sglang_hydra.config.compose import _ensure_hydra, hydra_override_list, values_from_cfg

        _ensure_hydra()
        parsed = OverridesParser.create().parse_overrides(hydra_override_list(cmd, include_hydra=False))
        choices = tuple(o.input_line for o in parsed if o.key_or_group in self.groups)
        values = [o for o in parsed if o.key_or_group not in self.groups]
        if choices not in self.cache:
            self.cache[choices] = compose(config_name="config", overrides=list(choices))
            self.composes += 1
        cfg = copy.deepcopy(self.cache[choices])
        OmegaConf.set_struct(cfg, True)
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        return values_from_cfg(cfg, cmd)


def _seeded_commands(tmp_path, n, seed=20260301):
    import random
    for name, text in _CONFIG_FILES.items():
        (tmp_path / name).write_text(text)
    rng = random.Random(seed)
    # a pool of group choice sets, so Hydra builds few defaults lists (see _HydraComposer)
    pool = [[f"{g}={rng.choice(o)}" for g, o in _GROUPS.items() if rng.random() < 0.5] for _ in range(16)]
    for _ in range(n):
        overrides, argv, config_file = _seeded_command(rng, tmp_path)
        overrides = [o for o in overrides if o.split("=")[0] not in _GROUPS] + rng.choice(pool)
        rng.shuffle(overrides)
        yield overrides, argv, config_file


def test_the_cached_hydra_path_equals_a_full_compose(tmp_path):
    hydra_cached = _HydraComposer()
    for overrides, argv, config_file in _seeded_commands(tmp_path, 12, seed=7):
        cmd, _ = build_command(overrides=overrides, argv=argv, config_file=config_file)
        full, cached = compose_with_hydra(cmd), hydra_cached(cmd)
        assert full.values == cached.values and full.explicit == cached.explicit, (overrides, argv, config_file)


def test_direct_and_hydra_composers_agree_on_500_seeded_commands(tmp_path):
    """The direct composer (fast path) and Hydra's give identical records on every command:
    presets of every group, Hydra overrides and legacy flags for random fields, single points
    of sweeps, --config files, mixed in random order."""
    hydra_composer = _HydraComposer()
    seen_kinds = {"group": 0, "legacy": 0, "config": 0, "sweep point": 0}
    for i, (overrides, argv, config_file) in enumerate(_seeded_commands(tmp_path, N_SEEDED)):
        seen_kinds["group"] += any(o.split("=")[0] in _GROUPS for o in overrides)
        seen_kinds["legacy"] += bool(argv)
        seen_kinds["config"] += config_file is not None
        seen_kinds["sweep point"] += any(o.split("=")[0] in _SWEEPS for o in overrides)
        cmd, _ = build_command(overrides=overrides, argv=argv, config_file=config_file)
        case = f"case {i}: overrides={overrides} argv={argv} config={config_file}"
        assert not cmd.problems, f"{case}: {cmd.problems}"
        try:
            direct = compose_values(cmd)
        except ConfigError:
            with pytest.raises(ConfigError):
                compose_with_hydra(cmd)
            continue
        via_hydra = hydra_composer(cmd)
        assert direct.values == via_hydra.values, case
        assert direct.explicit == via_hydra.explicit, case
        assert _resolved(direct) == _resolved(via_hydra), case
    assert min(seen_kinds.values()) >= 50, seen_kinds   # every kind of input was exercised
    assert hydra_composer.composes <= 48   # (config files add choices of their own)
