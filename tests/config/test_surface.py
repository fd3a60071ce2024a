"""Every SGLang 0.5.23 flag in sglang-hydra: fields, flags, prefixes, errors, export, drift, check=engine."""
from __future__ import annotations

import copy
import json
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_hydra import ConfigError, compose_record
from sglang_hydra.config.compose import build_command, compose_values
from sglang_hydra.config.legacy import cli_fields, legacy_parser, split_argv, to_argv
from sglang_hydra.config.record import FIELDS
from sglang_hydra.config.drift import drift
from sglang_hydra.config.schema_snapshot import load_snapshot, reference_fields, top_namespace

sys.path.insert(0, str(Path(__file__).parent))
from surface_values import sample  # noqa: E402

SNAP = load_snapshot()
NAMESPACES_0_5_23 = {"device", "disagg", "exec", "lora", "memory", "mm", "model", "observability", "parallel",
                     "schedule", "serving", "spec"}


def test_every_reference_field_is_a_field_of_its_namespace():
    assert len(SNAP["fields"]) == 546
    assert {top_namespace(f["namespace"]) for f in SNAP["fields"]} == NAMESPACES_0_5_23
    for f in SNAP["fields"]:
        assert f["name"] in FIELDS, f["name"]
        assert FIELDS[f["name"]].namespace == top_namespace(f["namespace"]), f["name"]
    # Our own additions are hydra_only (no flag): the model's KV geometry and size, and the PD
    # bootstrap secret.
    extra = [n for n in FIELDS if n not in reference_fields()]
    assert extra and all(FIELDS[n].arg.hydra_only for n in extra)
    assert {FIELDS[n].namespace for n in extra} == {"model", "disagg"}
    assert [n for n in extra if FIELDS[n].namespace == "disagg"] == ["disaggregation_bootstrap_secret"]


def test_record_follows_the_reference_positional_order():
    ours = [n for n in FIELDS if n in reference_fields()]
    assert ours == SNAP["positional_order"]


def test_every_reference_flag_is_a_flag_here_with_its_action_facts():
    ours = {}
    for a in legacy_parser()._actions:
        for opt in a.option_strings:
            ours[opt] = a
    n = 0
    for fl in SNAP["flags"]:
        for opt in fl["flags"]:
            assert opt in ours, opt
            a = ours[opt]
            if fl["dest"] != "config":
                assert a.dest == fl["dest"], opt
            if fl.get("choices") and fl["action"] == "store":
                assert list(a.choices)[:len(fl["choices"])] == fl["choices"], opt
            if fl["action"] == "store":
                assert a.nargs == fl.get("nargs"), opt
            n += 1
    assert n >= 531


def test_defaults_equal_the_reference_except_model_path():
    for name, entry in reference_fields().items():
        if name == "model_path":
            continue  # the reference requires it; here it defaults to the 'tiny' preset
        assert json.loads(json.dumps(FIELDS[name].default_value())) == entry["default"], name


def test_the_operator_command_line_resolves():
    rec = compose_record(argv=["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--tp", "2", "--quantization", "fp8",
                               "--attention-backend", "fa3", "--context-length", "32768", "--enable-metrics"])
    assert (rec.tp_size, rec.quantization, rec.attention_backend, rec.context_length, rec.enable_metrics) == \
        (2, "fp8", "fa3", 32768, True)


def test_hand_written_rules_still_apply_to_generated_namespaces():
    with pytest.raises(ConfigError) as exc:
        compose_record(argv=["--tp", "0"])
    assert exc.value.key == "parallel.tp_size"
    rec = compose_record(overrides=["exec.moe_a2a_backend=deepep", "observability.enable_metrics=true",
                                    "lora.max_loras_per_batch=4"])
    assert rec.moe_a2a_backend == "deepep" and rec.enable_metrics is True and rec.max_loras_per_batch == 4
    assert FIELDS["num_hidden_layers"].arg.hydra_only  # the KV geometry is still there


@pytest.mark.parametrize("argv,name,value", [
    (["--tp", "2"], "tp_size", 2),
    (["--tensor-para", "4"], "tp_size", 4),
    (["--context-len=4k"], "context_length", 4000),
    (["--max-total-tokens", "2Ki"], "max_total_tokens", 2048),
    (["--no-dllm-fdfo"], "dllm_fdfo", False),
    (["--monokernel-backend", "amd"], "enable_amd_monokernel", True),
    (["--model-checksum"], "model_checksum", ""),
    (["--lora-paths", "a", '{"lora_name":"x","lora_path":"y"}'], "lora_paths", ["a", {"lora_name": "x", "lora_path": "y"}]),
])
def test_flag_kinds_and_unambiguous_prefixes(argv, name, value):
    split = split_argv(argv)
    assert not split.problems, split.problems
    assert [(s.name, s.value) for _, s in split.settings] == [(name, value)]


def test_ambiguous_unknown_and_hydra_prefixes_are_explained():
    probs = split_argv(["--enable-hi", "--conf", "x", "--ver", "--enable-metricz"]).problems
    text = [p.message for p in probs]
    assert "ambiguous flag --enable-hi" in text[0] and "--enable-hicache" in text[0]
    assert "Hydra's own flags" in text[1] and "--config" in text[1]
    assert "--version" in text[2]
    assert text[3].endswith("did you mean --enable-metrics?")


def test_wrong_type_names_field_flag_and_type():
    with pytest.raises(ConfigError) as exc:
        compose_record(argv=["--tp", "two", "--mem-fraction-static", "x", "--log-requests-level", "7"])
    got = {(p.key, p.flag) for p in exc.value.problems}
    assert got == {("parallel.tp_size", "--tp-size"), ("schedule.mem_fraction_static", "--mem-fraction-static"),
                   ("observability.log_requests_level", "--log-requests-level")}
    msgs = " ".join(p.message for p in exc.value.problems)
    assert "expected an integer" in msgs and "expected a number" in msgs and "invalid choice: 7" in msgs


def test_bad_hydra_values_of_generated_fields_all_reported():
    with pytest.raises(ConfigError) as exc:
        compose_record(overrides=["exec.attention_backend=fa9", "lora.max_loras_per_batch=x", "observability.bogus=1"])
    assert len(exc.value.problems) == 3


def test_export_reparses_to_the_same_values():
    """Our own round trip over all flags (the reference test does the same against SGLang)."""
    rng = random.Random(5)
    pool = [fi for fi in cli_fields() if fi.name != "model_path"]
    defaults = {n: fi.default_value() for n, fi in FIELDS.items()}
    for _ in range(15):
        argv = []
        for fi in rng.sample(pool, 60):
            got = sample(fi, rng)
            if got:
                argv += got[1]
        cmd, _ = build_command(argv=argv)
        assert not cmd.problems, cmd.problems
        values = compose_values(cmd).values
        back, _ = build_command(argv=to_argv(values, defaults))
        assert not back.problems
        assert compose_values(back).values == values


def _fabricated_newer():
    snap = copy.deepcopy(SNAP)
    snap["version"] = "0.6.0"
    fields = snap["fields"]
    fields.append({"name": "hicache_prefetch_depth", "namespace": "memory", "type": "int", "default": 2, "required": False})
    snap["flags"].append({"flags": ["--hicache-prefetch-depth"], "dest": "hicache_prefetch_depth", "action": "store",
                          "parser": "int", "default": 2})
    snap["fields"] = [f for f in fields if f["name"] != "enable_flexkv"]
    snap["flags"] = [f for f in snap["flags"] if f["dest"] != "enable_flexkv"]
    for f in snap["fields"]:
        if f["name"] == "hicache_size":
            f["default"] = 4
    for fl in snap["flags"]:
        if fl["dest"] == "hicache_io_backend":
            fl["choices"] = ["direct", "kernel", "rdma"]
    return snap


def _fabricated_with_kind_changes():
    """The newer snapshot plus a changed type, value parser, action kind, and removed/added flags."""
    snap = _fabricated_newer()
    for f in snap["fields"]:
        if f["name"] == "hicache_write_policy":
            f["type"] = "Optional[str]"
        if f["name"] == "sm_group_num":
            f["type"] = "float"
    for fl in snap["flags"]:
        if fl["dest"] == "hicache_storage_prefetch_retry_max_attempts":
            fl["parser"] = "human_readable_int"
        if fl["dest"] == "hicache_ratio":
            fl.update(action="store_true", default=False)
            fl.pop("parser", None)
        if fl["dest"] == "encoder_bootstrap_port":
            fl["flags"] = fl["flags"] + ["--encoder-bs-port"]
    snap["flags"] = [f for f in snap["flags"] if f["dest"] != "disaggregation_bootstrap_port"]
    return snap


def test_version_drift_names_each_difference():
    assert drift(SNAP) == []
    lines = drift(_fabricated_newer())
    assert len(lines) == 4, lines
    text = "\n".join(lines)
    assert "memory.hicache_prefetch_depth: SGLang 0.6.0 has this field" in text
    assert "memory.enable_flexkv: sglang-hydra has this field, SGLang 0.6.0 does not" in text
    assert "memory.hicache_size: default 0 here, 4 in SGLang 0.6.0" in text
    assert "memory.hicache_io_backend: choices" in text and "rdma" in text


def test_version_drift_names_type_parser_action_and_flag_changes():
    lines = drift(_fabricated_with_kind_changes())
    expected = {
        "memory.hicache_write_policy: type str here, Optional[str] in SGLang 0.6.0",
        "disagg.sm_group_num: type int here, float in SGLang 0.6.0",
        "memory.hicache_storage_prefetch_retry_max_attempts: value parser int here, human_readable_int in SGLang 0.6.0",
        "memory.hicache_ratio: action store here, store_true in SGLang 0.6.0",
        "disagg.disaggregation_bootstrap_port: flag --disaggregation-bootstrap-port removed in SGLang 0.6.0",
        "disagg.encoder_bootstrap_port: flag --encoder-bs-port added in SGLang 0.6.0",
    }
    assert expected <= set(lines), sorted(set(lines) - {l for l in lines if "0.6.0" not in l})
    assert len(lines) == 4 + len(expected), lines


def _fake_engine(tmp_path, answer) -> str:
    """An executable that answers like engine_probe.py would, without SGLang."""
    script = tmp_path / "fake_python"
    script.write_text(f"#!{sys.executable}\nimport sys, json\nsys.stdin.read()\nprint(json.dumps({answer!r}))\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def _cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], capture_output=True, text=True, timeout=timeout)


def test_check_engine_without_sglang_is_a_clear_error():
    proc = _cli("job=resolve", "job.check=engine", f"job.python={sys.executable}")
    assert proc.returncode == 2
    assert f"SGLang is not installed in {sys.executable}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_check_engine_reports_the_verdict_and_drift(tmp_path):
    answer = {"installed": True, "version": "0.6.0", "schema": _fabricated_newer(),
              "verdict": {"ok": False, "error": "ValueError: --speculative-eagle-topk must be 1 with page_size > 1"}}
    proc = _cli("--tp", "2", "job=resolve", "job.check=engine", f"job.python={_fake_engine(tmp_path, answer)}")
    assert proc.returncode == 2, proc.stderr
    assert "spec.speculative_eagle_topk (--speculative-eagle-topk): SGLang 0.6.0 rejects this configuration" in proc.stderr
    assert "version drift: memory.hicache_size: default 0 here, 4 in SGLang 0.6.0" in proc.stderr
    ok = dict(answer, verdict={"ok": True, "error": ""}, schema=None)
    proc = _cli("--tp", "2", "job=resolve", "job.check=engine", "job.format=argv",
                f"job.python={_fake_engine(tmp_path, ok)}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "--model-path tiny --tp-size 2"
    assert "SGLang 0.6.0 accepts this configuration" in proc.stderr


def test_config_file_takes_flag_names_prefixes_and_optional_booleans(tmp_path):
    cfg = tmp_path / "server.yaml"
    cfg.write_text("tp: 2\ndllm-fdfo: false\nenable-metrics: true\nmax-loras-per-batch: 3\n")
    rec = compose_record(argv=["--config", str(cfg)])
    assert (rec.tp_size, rec.dllm_fdfo, rec.enable_metrics, rec.max_loras_per_batch) == (2, False, True, 3)
    cfg.write_text("enable-metric: true\n")  # a prefix of two flags: ambiguous, so unknown
    with pytest.raises(ConfigError):
        compose_record(argv=["--config", str(cfg)])


def test_docs_surface_counts_match_the_code():
    """docs/surface.md states the field and action counts; they must be today's numbers."""
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "surface.md").read_text().split())
    ours = [fi for n, fi in FIELDS.items() if n not in reference_fields()]
    geometry = [fi for fi in ours if fi.namespace == "model"]
    assert f"its {len(SNAP['fields'])} fields in 12 namespaces" in doc
    assert f"and {len(SNAP['flags'])} argparse actions" in doc
    assert f"plus {len(ours)} fields of this project's own" in doc
    assert f"the {len(geometry)} model-geometry fields" in doc
    assert f"{len(FIELDS)} record fields in all" in doc
    assert f"all {len(FIELDS)} (`cli._shows_config`)" in doc
