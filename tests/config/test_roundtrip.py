"""The record ``job=resolve`` prints (yaml or json) reads back through ``--config`` unchanged,
and ``--config`` keys that name both a preset group and an SGLang flag mean what they say."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from sglang_hydra import ConfigError, compose_record
from sglang_hydra.config.record import FIELDS
from sglang_hydra.jobs.resolve import render

COMMAND_LINES = [
    ["--tp", "2", "--quantization", "fp8"],
    ["--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--tp", "2", "--quantization", "fp8",
     "--attention-backend", "fa3", "--context-length", "32768", "--enable-metrics"],
    ["--enable-hierarchical-cache", "--hicache-ratio", "3"],
    ["--enable-hierarchical-cache"],
    ["memory=hicache_file", "--hicache-host-memory-mode", "buffer_only"],
    ["--disaggregation-mode", "prefill"],
    ["--disaggregation-mode", "decode", "--page-size", "16"],
    ["--device", "cpu"],
    ["--tp", "2", "--dp", "2", "--enable-dp-attention"],
    ["--tp", "4", "--attn-dp-size", "2"],
    ["model=llama3_8b", "--page-size", "16"],
    ["--radix-eviction-policy", "lfu"],
    # unknown models: the printed stand-in shape must not become a stated Llama when read back
    ["--model-path", "Qwen/Qwen2.5-VL-7B-Instruct", "--encoder-only"],
    ["--model-path", "deepseek-ai/DeepSeek-V3", "--enable-hierarchical-cache", "--dcp-size", "2"],
]


def _read_back(text: str, fmt: str, tmp_path):
    path = tmp_path / f"record_{fmt}.yaml"
    data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    path.write_text(yaml.safe_dump(data, sort_keys=False) if fmt == "json" else text)
    return compose_record(argv=["--config", str(path)])


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=lambda a: " ".join(a))
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_printed_record_reads_back_as_the_same_record(argv, fmt, tmp_path):
    first = render(compose_record(argv=argv), fmt)
    again = render(_read_back(first, fmt, tmp_path), fmt)
    assert again == first


def test_round_trip_on_the_command_line(tmp_path):
    """The reviewer's exact commands: sglang-hydra ... job=resolve > rec.yaml; --config rec.yaml."""
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    first = subprocess.run([sys.executable, "-m", "sglang_hydra", "--tp", "2", "--quantization", "fp8", "job=resolve"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert first.returncode == 0, first.stderr
    (tmp_path / "rec.yaml").write_text(first.stdout)
    again = subprocess.run([sys.executable, "-m", "sglang_hydra", "--config", "rec.yaml", "job=resolve"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout


def test_dp_attention_is_reported_as_the_engine_reports_it():
    rec = compose_record(argv=["--tp", "2", "--dp", "2", "--enable-dp-attention"])
    assert (rec.enable_dp_attention, rec.attn_dp_size, rec.dp_size) == (True, 2, 1)
    # attention DP given the current way reports the switch too (the engine's resolved_dict does)
    assert compose_record(argv=["--tp", "4", "--attn-dp-size", "2"]).enable_dp_attention is True
    assert compose_record(argv=["--tp", "2", "--dp", "2"]).enable_dp_attention is False


def test_dp_attention_is_a_key_and_a_config_setting(tmp_path):
    rec = compose_record(argv=["parallel.enable_dp_attention=true", "parallel.dp_size=2", "parallel.tp_size=2"])
    assert (rec.attn_dp_size, rec.dp_size) == (2, 1)
    (tmp_path / "c.yaml").write_text("enable_dp_attention: true\ndp_size: 2\ntp_size: 2\n")
    rec = compose_record(argv=["--config", str(tmp_path / "c.yaml")])
    assert (rec.attn_dp_size, rec.dp_size, rec.enable_dp_attention) == (2, 1, True)


def test_config_model_and_device_keys_that_are_not_presets_mean_the_flags(tmp_path):
    (tmp_path / "m.yaml").write_text("model: meta-llama/Llama-3.1-8B-Instruct\n")
    assert compose_record(argv=["--config", str(tmp_path / "m.yaml")]).model_path == "meta-llama/Llama-3.1-8B-Instruct"
    (tmp_path / "d.yaml").write_text("device: cuda\ntp: 2\n")
    rec = compose_record(argv=["--config", str(tmp_path / "d.yaml")])
    assert (rec.device, rec.tp_size) == ("cuda", 2)


def test_config_model_and_device_keys_that_are_presets_select_them(tmp_path):
    (tmp_path / "p.yaml").write_text("model: llama3_8b\ndevice: default\n")
    rec = compose_record(argv=["--config", str(tmp_path / "p.yaml")])
    assert (rec.model_path, rec.num_hidden_layers) == ("meta-llama/Meta-Llama-3-8B-Instruct", 32)


def test_group_names_on_the_command_line_stay_preset_selections():
    with pytest.raises(ConfigError) as exc:
        compose_record(argv=["device=cpu"])
    assert "no preset 'cpu' in group 'device'" in str(exc.value)


def test_whole_number_defaults_of_float_fields_are_floats():
    fi = FIELDS["watchdog_timeout"]
    assert isinstance(fi.default_value(), float) and fi.default_value() == 300.0
    assert "watchdog_timeout: 300.0" in render(compose_record(), "yaml")


def test_a_ratio_other_than_the_default_still_turns_auto_sizing_off(tmp_path):
    (tmp_path / "r.yaml").write_text("hicache_ratio: 3.0\nhicache_host_memory_fraction: 0.8\n")
    rec = compose_record(argv=["--config", str(tmp_path / "r.yaml")])
    assert (rec.hicache_ratio, rec.hicache_host_memory_fraction) == (3.0, None)
    # the same pair on the command line follows the engine: a given ratio always turns it off
    rec = compose_record(argv=["--hicache-ratio", "2", "--hicache-host-memory-fraction", "0.8"])
    assert rec.hicache_host_memory_fraction is None


def test_a_defaulted_ratio_in_any_mapping_keeps_auto_sizing():
    """Deploy sides (``prefill:``/``decode:`` sections) are read by settings_from_mapping too."""
    from sglang_hydra.config.compose import Command, settings_from_mapping
    cmd = Command()
    settings_from_mapping({"hicache_ratio": 2.0, "hicache_host_memory_fraction": 0.8}, "side", cmd, choices_ok=True)
    assert [s.name for s in cmd.settings] == ["hicache_host_memory_fraction"]


def test_a_printed_pd_deployment_reads_back(tmp_path):
    """deploy=pd records read back per side (the router section and the private bookkeeping
    fields that render_deployment prints are left out: they are not settings)."""
    from sglang_hydra.config.deploy import compose_deployment, deployment_request
    from sglang_hydra.jobs.resolve import render_deployment

    def deployment(argv):
        return compose_deployment(deployment_request(argv))[0]

    def strip(text):
        data = yaml.safe_load(text)
        data.pop("router", None)
        for side in ("prefill", "decode"):
            data[side] = {k: v for k, v in data[side].items() if not k.startswith("_")}
        return data

    first = render_deployment(deployment(["deploy=pd", "decode.memory.hicache_ratio=3"]), "yaml")
    (tmp_path / "pd.yaml").write_text(yaml.safe_dump(strip(first), sort_keys=False))
    again = render_deployment(deployment(["--config", str(tmp_path / "pd.yaml")]), "yaml")
    assert strip(again) == strip(first)


def test_a_checkpoint_record_reads_back(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_hidden_layers": 3, "num_key_value_heads": 2,
        "num_attention_heads": 4, "hidden_size": 128, "max_position_embeddings": 8192}))
    first = render(compose_record(argv=["--model-path", str(ckpt), "--tp", "2"]), "yaml")
    assert render(_read_back(first, "yaml", tmp_path), "yaml") == first


def test_a_file_that_states_a_model_shape_keeps_it(tmp_path):
    (tmp_path / "s.yaml").write_text("model-path: Qwen/Qwen2.5-VL-7B-Instruct\nencoder-only: true\n"
                                     "architecture: LlamaForCausalLM\nnum_hidden_layers: 28\n")
    with pytest.raises(ConfigError, match="does not support LlamaForCausalLM"):
        compose_record(argv=["--config", str(tmp_path / "s.yaml")])
    (tmp_path / "q.yaml").write_text("model-path: Qwen/Qwen2.5-VL-7B-Instruct\nencoder-only: true\n"
                                     "architecture: Qwen2_5_VLForConditionalGeneration\n")
    assert compose_record(argv=["--config", str(tmp_path / "q.yaml")]).encoder_only is True
