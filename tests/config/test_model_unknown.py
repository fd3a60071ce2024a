"""A model whose architecture/geometry nobody stated is not judged as the tiny stand-in; engine
verdicts say where the engine failed; JSON-text settings, deprecated flags and X-POD."""
import json
import logging
import sys
import types

import pytest

from sglang_hydra import ConfigError, compose_record
from sglang_hydra.config import engine_check, engine_probe

VL = "Qwen/Qwen2.5-VL-7B-Instruct"


def _problems(argv):
    with pytest.raises(ConfigError) as exc:
        compose_record(argv=argv)
    return exc.value.problems


def _info_notes(caplog, argv):
    with caplog.at_level(logging.INFO, logger="sglang_hydra.config"):
        rec = compose_record(argv=argv)
    return rec, [r.getMessage() for r in caplog.records]


# --------------------------------------------------------------------------- finding 4
def test_unknown_model_is_not_refused_for_the_stand_in_architecture(caplog):
    rec, notes = _info_notes(caplog, ["--model-path", VL, "--encoder-only"])
    assert rec.encoder_only is True
    skipped = [n for n in notes if "encoder disaggregation" in n and "not checked" in n]
    assert skipped and "architecture is unknown" in skipped[0] and "model=<preset>" in skipped[0]
    assert "model.architecture=" in skipped[0]


def test_a_stated_architecture_is_still_judged(tmp_path):
    # the default tiny model is a known Llama
    assert any("does not support LlamaForCausalLM" in p.message for p in _problems(["--encoder-only"]))
    # stated explicitly: judged, both ways
    assert any("does not support LlamaForCausalLM" in p.message
               for p in _problems(["--model-path", VL, "--encoder-only", "model.architecture=LlamaForCausalLM"]))
    compose_record(argv=["--model-path", VL, "--encoder-only",
                         "model.architecture=Qwen2_5_VLForConditionalGeneration"])
    # from a checkpoint's config.json
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                      "num_hidden_layers": 2, "num_key_value_heads": 2,
                                                      "num_attention_heads": 2, "hidden_size": 32}))
    assert any("does not support LlamaForCausalLM" in p.message
               for p in _problems(["--model-path", str(tmp_path), "--encoder-only"]))
    # from a chosen preset, whatever the model path says
    assert any("does not support LlamaForCausalLM" in p.message
               for p in _problems(["model=llama3_8b", "--model-path", VL, "--encoder-only"]))


def test_language_model_only_is_not_judged_for_an_unknown_model(caplog):
    rec, notes = _info_notes(caplog, ["--model-path", "some/model", "--language-model-only"])
    assert rec.language_model_only is True
    assert any("--language-model-only" in n and "not checked" in n for n in notes)
    assert any("not supported" in p.message for p in _problems(["--language-model-only"]))


def test_mla_only_checks_do_not_judge_an_unknown_model(caplog):
    hicache_dcp = ["--enable-hierarchical-cache", "--dcp-size", "2"]
    rec, notes = _info_notes(caplog, ["--model-path", "deepseek-ai/DeepSeek-V3", *hicache_dcp])
    assert rec.dcp_size == 2 and any("MLA model" in n and "KV geometry is unknown" in n for n in notes)
    assert any("architecture and KV geometry fields are the tiny preset's defaults" in n for n in notes)
    compose_record(argv=["model=deepseek_v3", *hicache_dcp])                  # MLA preset: fine
    assert any("needs an MLA model" in p.message for p in _problems(["model=llama3_8b", *hicache_dcp]))
    um = ["--enable-unified-memory", "--dcp-size", "2", "--attention-backend", "flashinfer"]
    compose_record(argv=["--model-path", "x/y", *um])
    assert any("needs an MLA model" in p.message for p in _problems(um))


def test_page_major_backends_for_an_unknown_model_are_checked_against_every_geometry():
    pm = ["--enable-unified-memory", "--enable-page-major-kv-layout"]
    # flashmla is an MLA-only backend: refused for the tiny MHA model, allowed for an unknown one
    assert any("not supported with it" in p.message for p in _problems([*pm, "--attention-backend", "flashmla"]))
    compose_record(argv=["--model-path", "x/y", *pm, "--attention-backend", "flashmla"])
    # a backend no geometry accepts is refused either way
    assert any("not supported with it" in p.message
               for p in _problems(["--model-path", "x/y", *pm, "--attention-backend", "torch_native"]))


def test_plan_jobs_still_refuse_unknown_geometry():
    from sglang_hydra.memory.geometry import check_geometry_known
    with pytest.raises(Exception, match="geometry is unknown"):
        check_geometry_known(compose_record(argv=["--model-path", VL]))


def _fake_engine(monkeypatch, verdict):
    monkeypatch.setattr(engine_check, "run_probe", lambda python, request, timeout=600.0: {
        "installed": True, "version": "0.5.23", "verdict": verdict, "schema": None})


def test_engine_check_says_what_a_stand_in_model_cannot_judge(monkeypatch):
    _fake_engine(monkeypatch, {"ok": True, "error": ""})
    problems, notes = engine_check.check_with_engine(compose_record(argv=["--model-path", VL]), sys.executable,
                                                     drift_check=False)
    assert problems == []
    caveat = [n for n in notes if n.startswith("not judged for")]
    assert caveat and VL in caveat[0] and "architecture and KV geometry are unknown" in caveat[0]
    assert "stand-in config.json (LlamaForCausalLM" in caveat[0]
    assert any("accepts this configuration (with the stand-in model)" in n for n in notes)
    _fake_engine(monkeypatch, {"ok": False, "error": "ValueError: Model type LlamaForCausalLM is not supported"})
    problems, _ = engine_check.check_with_engine(compose_record(argv=["--model-path", VL]), sys.executable,
                                                 drift_check=False)
    assert "judged with a stand-in model" in problems[0].message


def test_engine_check_has_no_caveat_for_a_known_model(monkeypatch):
    _fake_engine(monkeypatch, {"ok": True, "error": ""})
    for argv in ([], ["model=llama3_8b"], ["--model-path", VL, "model.architecture=Qwen2_5_VLForConditionalGeneration",
                                           "model.num_hidden_layers=28"]):
        _, notes = engine_check.check_with_engine(compose_record(argv=argv), sys.executable, drift_check=False)
        assert not [n for n in notes if n.startswith("not judged for")], argv


# --------------------------------------------------------------------------- finding 14
def test_a_bare_engine_assertion_names_the_failing_assert(monkeypatch):
    def failing(argv):  # a bare `assert` (pytest would rewrite one written here) raises this
        raise AssertionError

    def prepare_server_args(argv):
        failing([3])
    fake = types.ModuleType("sglang.srt.server_args")
    fake.prepare_server_args = prepare_server_args
    for name in ("sglang", "sglang.srt"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", fake)
    got = engine_probe.verdict(["--tp", "2"])
    assert got["ok"] is False
    assert got["error"].startswith("AssertionError at ") and got["error"].endswith("in failing: raise AssertionError")
    assert "test_model_unknown.py:" in got["error"]


def test_json_text_settings_are_checked_at_resolve_time():
    (p,) = _problems(["--json-model-override-args", "{bad"])
    assert p.key == "model.json_model_override_args" and p.flag == "--json-model-override-args"
    assert "not valid JSON" in p.message
    (p,) = _problems(["--model-loader-extra-config", "[1, 2]"])
    assert p.key.endswith("model_loader_extra_config") and "not an object" in p.message
    (p,) = _problems(["--kv-events-config", "publisher=zmq"])
    assert p.flag == "--kv-events-config" and "not valid JSON" in p.message
    rec = compose_record(argv=["--json-model-override-args", '{"rope_scaling": {"factor": 2}}'])
    assert json.loads(rec.json_model_override_args) == {"rope_scaling": {"factor": 2}}


# --------------------------------------------------------------------------- finding 17
def test_deprecated_flags_warn_with_their_replacement(caplog, tmp_path):
    with caplog.at_level(logging.WARNING, logger="sglang_hydra.config"):
        compose_record(argv=["--tp", "2", "--dp", "2", "--enable-dp-attention", "--disable-cuda-graph"])
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "--enable-dp-attention (command line) is deprecated" in text and "--attn-dp-size" in text
    assert "--disable-cuda-graph (command line) is deprecated" in text and "--cuda-graph-backend-decode disabled" in text
    caplog.clear()
    (tmp_path / "d.yaml").write_text("monokernel-backend: amd\n")
    with caplog.at_level(logging.WARNING, logger="sglang_hydra.config"):
        rec = compose_record(argv=["--config", str(tmp_path / "d.yaml")])
    assert rec.enable_amd_monokernel is True
    assert any("--monokernel-backend" in r.getMessage() and "--enable-amd-monokernel" in r.getMessage()
               for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sglang_hydra.config"):
        compose_record(argv=["--attn-dp-size", "2", "--tp", "2"])
    assert not [r for r in caplog.records if "deprecated" in r.getMessage()]


def test_prefill_only_without_kv_follows_the_engine_preconditions():
    base = ["--prefill-only-disable-kv-cache", "--disable-radix-cache"]
    texts = " | ".join(p.message for p in _problems(base + ["--device", "cpu"]))
    assert "--is-embedding" in texts and "--chunked-prefill-size -1" in texts and "fa3 or fa4" in texts
    ok = base + ["--is-embedding", "--chunked-prefill-size", "-1", "--attention-backend", "fa3"]
    compose_record(argv=ok)
    assert any("mxfp8" in p.message for p in _problems(ok + ["--kv-cache-dtype", "mxfp8"]))
    assert any("--disable-radix-cache" in p.message for p in _problems([ok[0], *ok[2:]]))
