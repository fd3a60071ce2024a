"""job=calibrate: a clear exit without a GPU, and the CPU rehearsal of the whole procedure."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from sglang_hydra.workload.ttft import HardwareSpec


def run(*args, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "sglang_hydra", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _cuda():
    try:
        import torch
        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(_cuda(), reason="this machine has a GPU")
def test_calibrate_without_a_gpu_measures_through_the_engine(tmp_path):
    """Without a GPU, job=calibrate launches the real engine (docs/validate.md); an interpreter
    without SGLang and a model without a checkpoint are named before anything starts."""
    r = run("job=calibrate", "job.python=" + sys.executable, cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "job.python" in r.stderr and "cannot import 'sglang'" in r.stderr and "Traceback" not in r.stderr
    assert "tiny_llama" in r.stderr          # the model preset a CPU engine can serve is offered


def test_calibrate_the_kernels_without_a_gpu_exits_2_saying_so(tmp_path):
    r = run("job=calibrate", "job.via=kernels", cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs a CUDA GPU" in r.stderr and "job.device=cpu" in r.stderr and "Traceback" not in r.stderr


def test_calibrate_cpu_rehearsal_writes_a_usable_preset(tmp_path):
    out = tmp_path / "cal"
    r = run("job=calibrate", "job.device=cpu", "job.repeats=1", "job.preset_name=rehearsal", "job.format=json",
            f"hydra.run.dir={out}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((out / "calibrate.json").read_text())
    assert result["rehearsal"] is True and len(result["checks"]) == 5
    for c in result["checks"]:
        assert c["measured_s"] > 0 and c["predicted_s"] > 0
        assert c["error_pct"] == pytest.approx(100 * (c["predicted_s"] - c["measured_s"]) / c["measured_s"])
    text = (out / "hardware" / "rehearsal.yaml").read_text()
    assert "REHEARSAL" in text
    preset = yaml.safe_load(text)
    assert preset["name"] == "rehearsal"
    for key in ("gemm_efficiency", "memory_efficiency", "attention_prefill_efficiency", "attention_decode_efficiency"):
        assert 0 < preset[key] <= 1, key
    assert set(result["fit"]) == {"gemm", "attention_prefill", "attention_decode"}
    from sglang_hydra.config.hardware import HARDWARE_FIELDS
    assert set(preset) <= set(HARDWARE_FIELDS)     # a hardware preset, field for field
    spec = HardwareSpec.from_any(preset)     # the TTFT model accepts it as it is
    assert spec.bf16_tflops > 0 and spec.h2d_gbps > 0 and spec.hbm_bandwidth_gbps > 0
    # usable right away: on Hydra's search path, and as a --config file
    r = run(f"hydra.searchpath=[file://{out}]", "hardware=rehearsal", "model=llama3_8b", "job=plan", cwd=tmp_path)
    assert r.returncode == 0 and "target rehearsal" in r.stdout, r.stdout + r.stderr
    r = run("--config", str(out / "calibrated_config.yaml"), "model=llama3_8b", "job=plan", cwd=tmp_path)
    assert r.returncode == 0 and "target rehearsal" in r.stdout, r.stdout + r.stderr
