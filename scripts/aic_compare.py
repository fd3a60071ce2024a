"""Hold the pass-time model's static-batch TTFT/TPOT against aiconfigurator's, point by point.

    python scripts/aic_compare.py RESULTS.json [--before] [--set hardware.field=value ...]

``RESULTS.json`` is what ``scripts/aic_oracle.py`` wrote for a grid from ``scripts/aic_grid.py``.
Prints the median and worst ratio (ours / aiconfigurator) per figure and hardware, and the
worst points.  ``--set`` tries other hardware values without editing the presets.
The CI differential (tests/perf/test_aic_differential.py) uses :func:`ours` and :func:`ratios`.
"""
from __future__ import annotations

import json
import statistics
import sys
from typing import Dict, List, Optional, Tuple

_CACHE: Dict[Tuple, object] = {}


def pass_model(preset: str, hardware: str, tp: int, hw_overrides: Tuple[str, ...] = ()):
    key = (preset, hardware, tp, hw_overrides)
    if key not in _CACHE:
        from sglang_hydra.config.compose import compose
        from sglang_hydra.perf import PassModel
        rec, composed = compose([f"model={preset}", f"hardware={hardware}", f"parallel.tp_size={tp}",
                                 *hw_overrides])
        _CACHE[key] = PassModel.from_record(rec, composed.hardware)
    return _CACHE[key]


def ours(point: Dict, hw_overrides: Tuple[str, ...] = ()) -> Dict[str, float]:
    """Our TTFT and TPOT (ms) for an oracle point: one unchunked prefill pass, as static_ctx states."""
    from sglang_hydra.perf.static_batch import static_batch
    m = pass_model(point["preset"], point["hardware"], point["tp"], hw_overrides)
    r = static_batch(m, isl=point["isl"], osl=point["osl"], batch_size=point["batch_size"],
                     prefix=point["prefix"], chunk_tokens=None)
    return {"ttft_ms": r.ttft_s * 1e3, "tpot_ms": r.tpot_s * 1e3}


def before(point: Dict) -> Dict[str, float]:
    """The model this project had before the pass-time model (for the benchmarks table): every
    request its own prefill pass at bf16_tflops x 0.5 x tp (2 x params FLOPs per token plus
    causal attention), never faster than reading the weights; no decode model (no TPOT)."""
    from sglang_hydra.config.compose import compose
    from sglang_hydra.workload.ttft import HardwareSpec, ModelShape, PrefillTimeline
    rec, composed = compose([f"model={point['preset']}", f"hardware={point['hardware']}",
                             f"parallel.tp_size={point['tp']}"])
    hw = dict(composed.hardware.to_dict(), prefill_efficiency=0.5)
    tl = PrefillTimeline(HardwareSpec.from_any(hw), ModelShape.from_record(rec), chunk_tokens=None)
    new = max(1, point["isl"] - point["prefix"])
    one = tl.pass_seconds(new, point["isl"] - new)
    return {"ttft_ms": 1e3 * one * point["batch_size"]}


def ratios_before(results: List[Dict]) -> List[Dict]:
    rows = []
    for p in results:
        if "error" in p or "ttft_ms" not in p:
            continue
        rows.append(dict(point=p, key="ttft_ms", aic=p["ttft_ms"], ours=before(p)["ttft_ms"],
                         ratio=before(p)["ttft_ms"] / p["ttft_ms"]))
    return rows


def ratios(results: List[Dict], hw_overrides: Tuple[str, ...] = ()) -> List[Dict]:
    """One row per compared figure: the point, the figure, aiconfigurator's value, ours, ratio."""
    rows = []
    for p in results:
        if "error" in p:
            continue
        mine = ours(p, hw_overrides)
        for key in p.get("want") or ("ttft_ms", "tpot_ms"):
            if key in p and p[key] > 0:
                rows.append(dict(point=p, key=key, aic=p[key], ours=mine[key], ratio=mine[key] / p[key]))
    return rows


def describe(row: Dict) -> str:
    p = row["point"]
    return (f"{row['key']:7s} {p['hardware']:10s} {p['preset']:12s} tp{p['tp']} isl={p['isl']:<5d} "
            f"prefix={p['prefix']:<5d} bs={p['batch_size']:<3d} osl={p['osl']:<4d} "
            f"aic={row['aic']:9.2f} ours={row['ours']:9.2f} ratio={row['ratio']:.3f}")


def report(rows: List[Dict], worst: int = 10, out=sys.stdout) -> Tuple[float, float]:
    """Print the summary; returns (median ratio, worst |ratio - 1|)."""
    rs = [r["ratio"] for r in rows]
    med = statistics.median(rs)
    worst_dev = max(abs(r - 1) for r in rs)
    print(f"{len(rows)} figures: median ratio {med:.3f}, worst {min(rs):.3f} .. {max(rs):.3f}, "
          f"within 15%: {sum(abs(r - 1) <= 0.15 for r in rs)}/{len(rs)}", file=out)
    groups: Dict[Tuple[str, str], List[float]] = {}
    for r in rows:
        groups.setdefault((r["key"], r["point"]["hardware"]), []).append(r["ratio"])
    for (key, hw), v in sorted(groups.items()):
        print(f"  {key:7s} {hw:10s} n={len(v):3d} median {statistics.median(v):.3f} "
              f"min {min(v):.3f} max {max(v):.3f}", file=out)
    print("worst points:", file=out)
    for r in sorted(rows, key=lambda r: -abs(r["ratio"] - 1))[:worst]:
        print("  " + describe(r), file=out)
    return med, worst_dev


def main(argv: List[str]) -> int:
    path = argv[0]
    overrides: List[str] = []
    if "--set" in argv:
        overrides = argv[argv.index("--set") + 1:]
    results = json.load(open(path))
    errors = [p for p in results if "error" in p]
    if errors:
        print(f"{len(errors)} points aiconfigurator refused, e.g. {errors[0]['error']}")
    if "--before" in argv:
        print("BEFORE (the single-factor prefill model; it had no TPOT):")
        report(ratios_before(results), worst=5)
        return 0
    report(ratios(results, tuple(overrides)), worst=15)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
