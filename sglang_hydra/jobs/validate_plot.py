"""``validation.png``: predicted against measured for every request, and both distributions.

Top row: one point per request for TTFT, TPOT and cached tokens (predicted on x, measured on
y, the diagonal is a perfect prediction; time axes are logarithmic when they span more than a
decade).  Bottom row: the CDFs of TTFT, TPOT and E2E, predicted and measured, drawn with
different line styles and markers so that two identical curves still show both entries.
:func:`validation_figure` returns the figure, so tests read its axes, labels and series.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Tuple

__all__ = ["validation_figure", "plot_validation", "SCATTER_METRICS", "CDF_METRICS"]

SCATTER_METRICS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("cached_tokens", "cached tokens"))
CDF_METRICS = (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)"), ("e2e_ms", "E2E (ms)"))


def _pairs(predicted: Sequence[Mapping], measured: Sequence[Mapping], metric: str) -> Tuple[List[float], List[float]]:
    meas = {r["index"]: r for r in measured}
    xs, ys = [], []
    for p in predicted:
        m = meas.get(p["index"])
        if m is None or p.get(metric) is None or m.get(metric) is None:
            continue
        xs.append(float(p[metric]))
        ys.append(float(m[metric]))
    return xs, ys


def _cdf(values: Sequence[float]) -> Tuple[List[float], List[float]]:
    s = sorted(values)
    n = len(s)
    return s, [(i + 1) / n for i in range(n)]


def validation_figure(predicted: Sequence[Mapping], measured: Sequence[Mapping], title: str = ""):
    """The figure (matplotlib, Agg); see the module doc."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 9))
    for ax, (metric, label) in zip(axes[0], SCATTER_METRICS):
        xs, ys = _pairs(predicted, measured, metric)
        ax.scatter(xs, ys, s=12, alpha=0.6, color="tab:blue", label=f"requests ({len(xs)})")
        if xs:
            lo = min(min(xs), min(ys))
            hi = max(max(xs), max(ys))
            ax.plot([lo, hi], [lo, hi], color="gray", linestyle="--", linewidth=1, label="perfect prediction")
            if metric != "cached_tokens" and lo > 0 and hi / lo > 10:
                ax.set_xscale("log")
                ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no request with this metric on both sides", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_xlabel(f"predicted {label}")
        ax.set_ylabel(f"measured {label}")
        ax.set_title(f"{label}: per request")
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    for ax, (metric, label) in zip(axes[1], CDF_METRICS):
        for rows, name, style, marker in ((predicted, "predicted", "-", "o"), (measured, "measured", "--", "x")):
            vals = [float(r[metric]) for r in rows if r.get(metric) is not None]
            if not vals:
                continue
            x, y = _cdf(vals)
            ax.plot(x, y, linestyle=style, marker=marker, markevery=max(1, len(x) // 12), markersize=5,
                    label=f"{name} ({len(vals)})")
        ax.set_xlabel(label)
        ax.set_ylabel("share of requests")
        ax.set_title(f"{label}: distribution")
        ax.set_ylim(0, 1.02)
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_validation(predicted: Sequence[Mapping], measured: Sequence[Mapping], path, title: str = "") -> Path:
    """Draw :func:`validation_figure` into ``path`` (PNG, written atomically)."""
    import io

    import matplotlib.pyplot as plt
    from .context import atomic_write
    fig = validation_figure(predicted, measured, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return atomic_write(Path(path), buf.getvalue())
