"""The Triton transfer kernel compiled for sm_80, sm_89 and sm_90 without a GPU, with what
its PTX must show (issue 22).

One run of ``scripts/compile_kernels.py`` per test session (a fresh ``TRITON_CACHE_DIR`` that
the script makes and removes itself: nothing is reused across runs) feeds the end-to-end and
per-configuration checks; the rest are fast unit tests of the pieces.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_hydra.memory import kernel_compile as kc
from sglang_hydra.memory.geometry import MHA_LAYOUTS, MLA_LAYOUTS
from sglang_hydra.memory import transfer_triton
from sglang_hydra.memory.transfer_triton import LANE_BYTES, plan_group_launch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "compile_kernels.py"
TARGETS = ("sm_80", "sm_89", "sm_90")

#: configurations allowed narrower than 128-bit accesses, by (element bytes, VEC), and why.
#: The element width is the widest integer every row of the pool can be read as, so a
#: narrow width already says the row length is not a multiple of the next width; VEC 1 at
#: 8 bytes means rows of 8 mod 16 bytes.  Nothing else may be narrow.
NARROW_ACCESS = {
    (1, 1): "rows of an odd number of bytes (fp8 with an odd head/latent dim): only 1-byte accesses are aligned "
            "at every row start",
    (2, 1): "rows of 2 mod 4 bytes (bf16 with an odd head dim): only 2-byte accesses are aligned at every row",
    (4, 1): "rows of 4 mod 8 bytes (e.g. bf16 head dim 66 or 22): only 4-byte accesses are aligned at every row",
    (8, 1): "rows of 8 mod 16 bytes (e.g. tiny_mla in fp8: 24-byte rows): only 8-byte accesses are aligned at every row",
}


def load_script():
    spec = importlib.util.spec_from_file_location("compile_kernels_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """One full run of the script for the three targets: (process, JSON report)."""
    out = tmp_path_factory.mktemp("compile_kernels")
    env = dict(os.environ, TRITON_CACHE_DIR=str(out / "unused_cache"))   # the script must not use it
    proc = subprocess.run([sys.executable, str(SCRIPT), "--targets", ",".join(TARGETS), "--jobs", "2",
                           "--json", str(out / "report.json")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=1200)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return proc, report, out


# ------------------------------------------------------------------------ the full run
def test_every_configuration_compiles_for_three_targets(compiled):
    proc, report, out = compiled
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    n = len(report["configurations"])
    assert lines[-1] == f"{n}/{n} kernel configurations compiled for 3 targets"
    for target in TARGETS:
        row = next(line for line in lines if line.startswith(target + " "))
        configs, ok, _regs, spills = row.split()[1:5]
        assert int(configs) == int(ok) == n and int(spills) == 0 and row.endswith("pass"), row
    assert {r["target"] for r in report["results"]} == set(TARGETS)
    assert len(report["results"]) == 3 * n and all(r["ok"] for r in report["results"])
    # compiled in a cache directory of its own, removed afterwards: nothing reused across runs
    assert report["cache_dir"] and not Path(report["cache_dir"]).exists()
    assert not (out / "unused_cache").exists()


def test_configurations_span_widths_modes_and_blocks(compiled):
    _, report, _ = compiled
    configs = report["configurations"]
    assert {c["elem_bytes"] for c in configs} == {1, 2, 4, 8}
    for width in (1, 2, 4, 8):
        assert {c["mode"] for c in configs if c["elem_bytes"] == width} == {0, 1, 2}
    # full-width 8-byte rows (every preset model): every block size from one warp of 16-byte
    # accesses (64 elements) to the 16 KiB cap, in both fast paths
    for mode in (0, 1):
        blocks = {c["block"] for c in configs if c["elem_bytes"] == 8 and c["vec"] == 2 and c["mode"] == mode}
        assert blocks == {64, 128, 256, 512, 1024, 2048}, (mode, blocks)
    # every host layout of both architectures went through the launch path
    assert set(report["launches"]) == {f"mha {lay}" for lay in MHA_LAYOUTS} | {f"mla {lay}" for lay in MLA_LAYOUTS}
    assert all(n > 0 for n in report["launches"].values())
    keys = {(c["elem_bytes"], c["mode"], c["block"], c["vec"], c["num_warps"]) for c in configs}
    assert len(keys) == len(configs)        # Triton's key is exactly these five and nothing else


def test_ptx_of_every_configuration(compiled):
    """No local memory (spills), no 64-bit integer division, and every data load/store as
    wide as the alignment allows: 128 bits per lane, or a justified narrow row."""
    _, report, _ = compiled
    configs = {c["name"]: c for c in report["configurations"]}
    problems, narrow = [], set()
    for r in report["results"]:
        c = configs[r["name"]]
        where = f"{r['target']} {c['name']} (e.g. {c['origins'][0]})"
        if r["local_bytes"] or r["stack_bytes"] or r["local_ops"]:
            problems.append(f"{where}: local memory {r['local_bytes']}+{r['stack_bytes']} B")
        if r["div64"]:
            problems.append(f"{where}: 64-bit division {r['div64']}")
        bits = 8 * c["elem_bytes"] * c["vec"]
        if bits < 8 * LANE_BYTES:
            if (c["elem_bytes"], c["vec"]) not in NARROW_ACCESS:
                problems.append(f"{where}: {bits}-bit accesses with no justification in NARROW_ACCESS")
            narrow.add(c["name"])
        elif c["vec"] * c["elem_bytes"] != LANE_BYTES:
            problems.append(f"{where}: VEC {c['vec']} x {c['elem_bytes']} B is not a 16-byte access")
        loads = list(r["load_bits"])
        for _ in range(2):                  # the two 64-bit page ids
            loads.remove(64)
        if set(loads) != {bits} or set(r["store_bits"]) != {bits}:
            problems.append(f"{where}: loads {sorted(set(loads))} / stores {sorted(set(r['store_bits']))} bits, "
                            f"want {bits}")
    assert not problems, "\n".join(problems)
    # the narrow ones are exactly the odd-row shapes, never a preset model in bf16
    for name in narrow:
        assert not any(o.startswith(("llama3_8b", "qwen2_7b", "deepseek_v3")) and "/bf16" in o
                       for o in configs[name]["origins"]), configs[name]
    print(f"{len(narrow)} narrow configurations:", *sorted(narrow), sep="\n  ")


def test_fast_paths_of_real_models_are_128_bit(compiled):
    _, report, _ = compiled
    real = [c for c in report["configurations"] if c["mode"] in (0, 1)
            and any(o.split()[0] in ("llama3_8b/8h/bf16", "qwen2_7b/4h/bf16", "deepseek_v3/bf16")
                    for o in c["origins"])]
    assert real
    for c in real:
        assert c["elem_bytes"] * c["vec"] == LANE_BYTES, c
    results = [r for r in report["results"] if r["name"] in {c["name"] for c in real}]
    assert results and all(max(r["store_bits"]) == 128 and max(r["load_bits"]) == 128 for r in results)


# -------------------------------------------------------------------------- bad input
def test_unknown_targets_exit_2_one_line_each():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--targets", "sm_80,sm_91,hopper", "--jobs", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3, proc.stderr
    assert "unknown target 'sm_91'" in lines[0] and "sm_90" in lines[0]
    assert "unknown target 'hopper'" in lines[1]
    assert "--jobs" in lines[2] and "Traceback" not in proc.stderr


def test_argparse_errors_are_one_line():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--jobs", "two"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--jobs" in proc.stderr


def test_triton_without_cuda_backend_exits_2(monkeypatch, capsys):
    import triton.backends
    monkeypatch.delitem(triton.backends.backends, "nvidia")
    script = load_script()
    assert script.main(["--targets", "sm_90"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA backend" in err[0]


# ------------------------------------------------------------------------------ pieces
def test_access_widths_from_ptx():
    ptx = """
    ld.global.b64 %rd5, [%rd4+0];
    @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd9 + 0 ];
    @%p1 st.global.v2.b64 [ %rd10 + 0 ], { %rd11, %rd12 };
    @%p2 ld.global.L1::evict_last.b16 { %rs1 }, [ %rd13 + 0 ];
    div.s32 %r7, %r5, %r6;
    rem.u64 %rd3, %rd1, %rd2;
    st.local.u32 [%SP+0], %r1;
    """
    facts = kc.ptx_facts(ptx)
    assert facts["load_bits"] == [16, 64, 128] and facts["store_bits"] == [128]
    assert facts["div64"] == ["rem.u64"] and facts["local_ops"] == 1
    assert kc.access_bits(".v4.b32") == 128 and kc.access_bits(".v2.b64") == 128 and kc.access_bits(".b8") == 8


def test_compile_key_ignores_call_values():
    """Page count, tail and page ids vary per call: none of them may change the compile key
    (Triton would compile a new variant at run time)."""
    backend = kc.cuda_backend()
    binder = kc._binder(transfer_triton.jit_page_copy(), backend)
    storage = torch.zeros(2, 2, 5, 4, 2, 8, dtype=torch.int64)
    views = [storage[0], storage[1]]
    keys = set()
    for pages, tail in (([1], 4), ([3, 1, 4], 1), (list(range(5)), 3), ([2] * 16, 2)):
        index = torch.tensor(pages)
        plan = plan_group_launch(views, views, index, index, tail)
        keys.add(kc.triton_key(binder, plan)[0])
    assert len(keys) == 1


def test_signature_memo_matches_binding_every_launch():
    """The enumeration binds once per launch signature; binding every launch gives the same
    keys (a scalar specialised on its value would raise)."""
    shapes = [s for s in kc.pool_shapes() if s.name in ("tiny/2h/bf16", "odd-mla-fp8/3L", "k192-v128-bf16")]
    fast, n_fast = kc.launch_configurations(shapes, page_sizes=(1, 3, 16, 64))
    full, n_full = kc.launch_configurations(shapes, page_sizes=(1, 3, 16, 64), bind_every=True)
    assert n_fast == n_full and sum(n_full.values()) > 0
    assert [c.triton_key for c in fast] == [c.triton_key for c in full]


def test_vector_width_follows_alignment():
    assert transfer_triton.vector_elems(2, (0, 64), (1024, 64), 64) == 8
    assert transfer_triton.vector_elems(2, (0, 8), (1024, 64), 64) == 4        # a pointer 8 bytes off
    assert transfer_triton.vector_elems(2, (0, 64), (1024, 66), 64) == 2       # a stride of 66 elements
    assert transfer_triton.vector_elems(8, (0, 0), (6, 6), 3) == 1             # 24-byte rows
    assert transfer_triton.vector_elems(1, (0, 0), (65,), 65) == 1


def test_bad_target_names():
    with pytest.raises(kc.CompileSetupError, match="unknown target 'sm_91'"):
        kc.cuda_target("sm_91")
    assert kc.cuda_target("sm_89").arch == 89


def test_gpu_check_rehearsal_still_runs_the_transfer_step(tmp_path):
    """scripts/gpu_check.sh (the day a GPU is lent) in its CPU rehearsal: the compiled-kernel
    transfer step imports the changed kernel module and runs (its CUDA tests skip here)."""
    env = dict(os.environ, GPU_CHECK_REHEARSE="1", OUT=str(tmp_path), GPU_CHECK_ONLY="transfer_cuda")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = (tmp_path / "summary.txt").read_text()
    assert re.search(r"^transfer_cuda\s+PASS", summary, re.M), summary
