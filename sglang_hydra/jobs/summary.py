"""Sweep summary: one CSV row per job (its overrides + every metric) and a plot.

Each job writes ``metrics.json`` into its own output directory, so the summary works with
every launcher (basic, joblib, submitit): at the end of the sweep the callback reads them
back from the sweep directory.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Dict, List

from hydra.experimental.callback import Callback

from .context import atomic_write


class SweepSummary(Callback):
    def on_multirun_end(self, config, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        write_summary(sweep_dir)


def _overrides(job_dir: Path) -> Dict[str, str]:
    import yaml
    p = job_dir / ".hydra" / "overrides.yaml"
    if not p.is_file():
        return {}
    out = {}
    for ov in yaml.safe_load(p.read_text()) or []:
        k, _, v = str(ov).partition("=")
        out[k.lstrip("+~")] = v
    return out


def write_summary(sweep_dir: Path) -> List[Dict[str, Any]]:
    rows = []
    for m in sorted(sweep_dir.glob("*/metrics.json"), key=lambda p: (len(p.parent.name), p.parent.name)):
        metrics = json.loads(m.read_text())
        rows.append({**metrics, **_overrides(m.parent), "run": m.parent.name})
    if not rows:
        return rows
    ov_keys = []
    for r in rows:
        for k in _overrides(sweep_dir / r["run"]):
            if k not in ov_keys:
                ov_keys.append(k)
    varying = [k for k in ov_keys if len({r.get(k) for r in rows}) > 1] or ov_keys
    metric_keys = []
    for r in rows:
        for k in r:
            if k != "run" and k not in ov_keys and k not in metric_keys:
                metric_keys.append(k)
    cols = ["run"] + varying + metric_keys
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    atomic_write(sweep_dir / "summary.csv", buf.getvalue())
    _plot(sweep_dir, rows, varying)
    return rows


def _plot(sweep_dir: Path, rows, varying) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hit_key = next((k for k in ("block_hit_rate", "token_hit_rate", "gbps") if k in rows[0]), None)
    tail_key = next((k for k in ("uncached_tokens_p90", "p99_ms", "ttft_ms_p90") if k in rows[0]), None)
    if hit_key is None:
        return
    labels = [", ".join(f"{k.split('.')[-1]}={r.get(k)}" for k in varying) or r["run"] for r in rows]
    fig, axes = plt.subplots(1, 2 if tail_key else 1, figsize=(max(8, 1.2 * len(rows) + 4), 4.5), squeeze=False)
    ax = axes[0][0]
    vals = [float(r.get(hit_key) or 0) * (100 if "rate" in hit_key else 1) for r in rows]
    ax.bar(range(len(rows)), vals, color="tab:blue")
    ax.set_ylabel(hit_key.replace("_", " ") + (" (%)" if "rate" in hit_key else ""))
    ax.set_xticks(range(len(rows)), labels, rotation=35, ha="right", fontsize=8)
    if tail_key:
        ax2 = axes[0][1]
        ax2.bar(range(len(rows)), [float(r.get(tail_key) or 0) for r in rows], color="tab:orange")
        ax2.set_ylabel(tail_key.replace("_", " "))
        ax2.set_xticks(range(len(rows)), labels, rotation=35, ha="right", fontsize=8)
    fig.suptitle(f"sweep summary ({len(rows)} jobs)")
    fig.tight_layout()
    tmp = sweep_dir / ".summary.png.tmp"
    fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    tmp.replace(sweep_dir / "summary.png")
