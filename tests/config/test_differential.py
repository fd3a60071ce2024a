"""Differential test: our resolution against the reference engine's, shape by shape.

Both engines resolve the same seeded legacy command lines (see ``reference_shapes.py``);
for every shape they must agree on success or failure, on every memory/disagg value when
both succeed, and on the cause when both fail (the field the reference names must be among
the fields we name).  The reference runs in its own virtual environment (a 5.5 GB CUDA
torch plus sglang 0.5.23; recipe in docs/differential.md), so this test is optional:

    SGLANG_HYDRA_REFERENCE_PYTHON=/path/to/ref-venv/bin/python python -m pytest tests/config/test_differential.py

``SGLANG_HYDRA_DIFF_SHAPES`` (default 300) and ``SGLANG_HYDRA_DIFF_SEED`` (default 0) pick
the shapes.  Where we differ from the reference on purpose (an eviction-policy config
with unknown keys fails at resolve time here, at server start there; ``--model-path
dummy`` still runs every rule here) no shape is drawn, and unit tests in test_rules.py pin
our behaviour.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_hydra import ConfigError, ServerArgs, compose_record, namespace_of
from sglang_hydra.config.record import FIELDS

sys.path.insert(0, str(Path(__file__).parent))
from reference_shapes import make_shapes, same_value, write_model_dir  # noqa: E402

REFERENCE_PYTHON = os.environ.get("SGLANG_HYDRA_REFERENCE_PYTHON")
ORACLE = Path(__file__).resolve().parents[2] / "scripts" / "reference_oracle.py"
pytestmark = [pytest.mark.reference, pytest.mark.skipif(
    not REFERENCE_PYTHON, reason="set SGLANG_HYDRA_REFERENCE_PYTHON to a venv with sglang 0.5.23 (docs/differential.md)")]

COMPARED = [f for f, ns in namespace_of(ServerArgs).items()
            if ns in ("memory", "disagg") and not FIELDS[f].arg.no_cli]
_FLAG_TO_FIELD = {}
for _name, _fi in FIELDS.items():
    _FLAG_TO_FIELD[_name] = _name
    _FLAG_TO_FIELD[_name.replace("_", "-")] = _name


def fields_named(text: str) -> set:
    """Record fields a message mentions, as --flag, kebab-case or snake_case words."""
    words = re.findall(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)+", text)
    return {_FLAG_TO_FIELD[w] for w in words if w in _FLAG_TO_FIELD}


def resolve_ours(argv, env):
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        rec = compose_record(argv=argv)
        return {"ok": True, "values": {f: getattr(rec, f) for f in COMPARED}}
    except ConfigError as exc:
        named = set()
        for p in exc.problems:
            named.add(p.key.rsplit(".", 1)[-1])
            named |= fields_named(p.message)
        return {"ok": False, "error": "; ".join(f"{p.key}: {p.message}" for p in exc.problems), "named": named}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_reference(shapes):
    proc = subprocess.run([REFERENCE_PYTHON, str(ORACLE)], input=json.dumps(shapes), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_resolution_matches_reference(tmp_path):
    count = int(os.environ.get("SGLANG_HYDRA_DIFF_SHAPES", "300"))
    seed = int(os.environ.get("SGLANG_HYDRA_DIFF_SEED", "0"))
    model = write_model_dir(tmp_path / "model")
    prefix = ["--model-path", model, "--device", "cpu"]
    shapes = make_shapes(count, seed)
    reference = run_reference([{"argv": prefix + ["--skip-tokenizer-init"] + s["argv"], "env": s["env"]}
                               for s in shapes])
    disagreements = []
    tally = {"both resolve": 0, "both fail": 0}
    for shape, ref in zip(shapes, reference):
        ours = resolve_ours(prefix + shape["argv"], shape["env"])
        where = f"{' '.join(shape['argv'])} {shape['env'] or ''}"
        if ours["ok"] != ref["ok"]:
            disagreements.append(f"{where}\n  ours: {ours.get('error', 'resolves')}\n  ref:  {ref.get('error', 'resolves')}")
        elif ours["ok"]:
            tally["both resolve"] += 1
            for f in COMPARED:
                if not same_value(ours["values"][f], ref["values"].get(f)):
                    disagreements.append(f"{where}\n  {f}: ours {ours['values'][f]!r}, ref {ref['values'].get(f)!r}")
        else:
            tally["both fail"] += 1
            ref_fields = fields_named(ref["error"])
            if ref_fields and not ref_fields & ours["named"]:
                disagreements.append(f"{where}\n  different cause\n  ours: {ours['error']}\n  ref:  {ref['error']}")
    print(f"{count} shapes (seed {seed}): {tally}")
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements[:30])
    # The shapes must exercise both outcomes, or the comparison says little.
    assert tally["both resolve"] > count // 4 and tally["both fail"] > count // 10


# --------------------------------------------------------------------------- every flag
def _flag_lines(count: int, seed: int, per_line: int = 40):
    """Seeded command lines that together use every flag of every namespace, many times."""
    import random
    from sglang_hydra.config.legacy import cli_fields
    from surface_values import sample

    rng = random.Random(seed)
    pool = [fi for fi in cli_fields() if fi.name != "model_path"]
    order: list = []
    lines = []
    for _ in range(count):
        picked, argv = set(), []
        while len(picked) < per_line:
            if not order:
                order = pool[:]
                rng.shuffle(order)
            fi = order.pop()
            if fi.name in picked:
                continue
            picked.add(fi.name)
            got = sample(fi, rng)
            if got is not None:
                argv += got[1]
        lines.append(argv)
    return lines


def test_every_flag_parses_and_exports_like_reference(tmp_path):
    """Seeded command lines over all flags: our parse, our exported argv and the reference's
    parse of both agree on every field of the record."""
    from sglang_hydra.config.compose import build_command, compose_values
    from sglang_hydra.config.legacy import to_argv

    count = int(os.environ.get("SGLANG_HYDRA_DIFF_LINES", "200"))
    seed = int(os.environ.get("SGLANG_HYDRA_DIFF_SEED", "0"))
    model = write_model_dir(tmp_path / "model")
    lines = [["--model-path", model] + argv for argv in _flag_lines(count, seed)]
    defaults = {n: fi.default_value() for n, fi in FIELDS.items()}
    ours, exported = [], []
    for argv in lines:
        cmd, _ = build_command(argv=argv)
        assert not cmd.problems, f"{argv}\n{cmd.problems}"
        values = compose_values(cmd).values
        ours.append(values)
        exported.append(to_argv(values, defaults))
    shapes = [{"argv": a, "env": {}, "mode": "parse"} for a in lines + exported]
    reference = run_reference(shapes)
    compared = [n for n, fi in FIELDS.items() if not fi.arg.no_cli and not fi.arg.hydra_only]
    disagreements = []
    for i, values in enumerate(ours):
        for label, ref in (("given", reference[i]), ("exported", reference[len(lines) + i])):
            argv = lines[i] if label == "given" else exported[i]
            if not ref["ok"]:
                disagreements.append(f"line {i} ({label}): reference rejects it: {ref['error']}\n  {argv}")
                continue
            for n in compared:
                if not same_value(values[n], ref["values"].get(n)):
                    disagreements.append(f"line {i} ({label}) {n}: ours {values[n]!r}, ref {ref['values'].get(n)!r}")
    flags_used = sum(len(a) for a in lines)
    print(f"{count} lines (seed {seed}), {flags_used} tokens, {len(compared)} fields compared per parse: "
          f"{len(disagreements)} disagreements")
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements[:40])


def test_check_engine_with_the_real_engine():
    """job.check=engine: the real SGLang accepts a plain record, rejects one its own rules
    refuse (EAGLE tree drafts need page size 1 on the CPU attention backend), and its
    memory/disagg fields match ours (no drift lines)."""
    from sglang_hydra.config.engine_check import check_with_engine

    problems, notes = check_with_engine(compose_record(argv=["--tp", "2"]), REFERENCE_PYTHON)
    assert problems == [], problems
    assert not [n for n in notes if n.startswith("version drift")], notes
    assert any("accepts this configuration" in n for n in notes)
    rec = compose_record(argv=["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4",
                               "--speculative-num-draft-tokens", "8", "--page-size", "16",
                               "--attention-backend", "torch_native"])
    problems, _ = check_with_engine(rec, REFERENCE_PYTHON, drift_check=False)
    assert len(problems) == 1 and "SGLang 0.5.23 rejects this configuration" in problems[0].message, problems
