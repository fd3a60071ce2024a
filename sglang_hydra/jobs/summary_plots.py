"""The sweep's charts: ``summary.png`` (each key result against the swept setting) and
``pareto.png`` (the trade-off between two results, with its front).

Each drawing function returns what it drew (:class:`PanelData` per panel: axis labels, every
series with its points, the best mark or why there is none, the notes), so tests check the
chart's content rather than a file size.  Rules a reader relies on:

* no series hides another: series with the same points are drawn with distinct markers and a
  small sideways offset, and the legend says which coincide;
* a panel whose points all have the same value gets no "best" mark (there is nothing to pick),
  and says so;
* saturated or rejecting points are hollow, failed ones red, every axis starts at zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..config.objectives import MINIMIZE, OBJECTIVES
from ..utils.numbers import fmt_number
from .sweep_points import (DEGRADED_STATES, FAILED_STATES, METRIC_LABELS, context_title, direction_of, metric_label,
                           number, objective_of, pick_best, point_label, short_key, tied_points, value_text)
from .sweep_points import saved_file  # noqa: F401  (context of a point's saved config)

def _axes_of(rows, swept) -> Tuple[Optional[str], List[str]]:
    """The numeric swept key for x (the one with most distinct values) and the categorical keys."""
    # a failed job may have no overrides at all: judge keys by the points that have them
    numeric = [k for k in swept
               if any(k in r["_overrides"] for r in rows)
               and all(number(r["_overrides"][k]) is not None for r in rows if k in r["_overrides"])]
    x_key = max(numeric, key=lambda k: len({r["_overrides"].get(k) for r in rows})) if numeric else None
    cats = [k for k in swept if k != x_key]
    return x_key, cats


def _ordered_labels(rows, cats) -> List[str]:
    out: List[str] = []
    for r in rows:
        lab = point_label(r, cats)
        if lab not in out:
            out.append(lab)
    return out


def _tick(v: float, _pos=None) -> str:
    """An axis tick: 0, 2.5, 10, 1,500 (one style on a whole axis)."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"


def _series(rows, x_key, cats):
    """{label: [(x, row), ...]} sorted by x; x is the row index when no numeric key is swept."""
    groups: Dict[str, List[Tuple[float, Dict[str, Any]]]] = {}
    for i, r in enumerate(rows):
        x = number(r["_overrides"].get(x_key)) if x_key else float(i)
        if x is None:       # a job that left no overrides: only counted in the title
            continue
        groups.setdefault(point_label(r, cats), []).append((x, r))
    for g in groups.values():
        g.sort(key=lambda t: t[0])
    return groups


def _panels(rows) -> List[str]:
    """The key results to draw: the objective, latency, throughput, hit rate (those present)."""
    def has(k):
        return any(number(r.get(k)) is not None for r in rows if r.get("status") not in FAILED_STATES)
    objective, _ = objective_of(rows)
    panels = [objective] if objective in METRIC_LABELS and has(objective) else []
    latency = next((k for k in ("ttft_p90_ms", "ttft_ms") if has(k)), None)
    if latency and not any(p.startswith("ttft") for p in panels):
        panels.append(latency)
    for k in ("tokens_per_s_per_gpu", "token_hit_rate"):
        if has(k) and k not in panels:
            panels.append(k)
    return panels[:3]


def _clip_top(rows, metric: str, scale: float) -> Optional[float]:
    """The top of a lower-is-better panel when saturated points would flatten the others
    (over 3x the worst unsaturated value): they are drawn at the top edge with their value."""
    if OBJECTIVES.get(metric, MINIMIZE) != MINIMIZE or metric == "host_memory_gb":
        return None
    good = [number(r.get(metric)) for r in rows if r.get("status") not in FAILED_STATES + DEGRADED_STATES]
    bad = [number(r.get(metric)) for r in rows if r.get("status") in DEGRADED_STATES]
    good = [v for v in good if v is not None]
    bad = [v for v in bad if v is not None]
    if not good or not bad or max(good) <= 0 or max(bad) <= 3 * max(good):
        return None
    return max(good) * scale * 1.35


def plot_summary(sweep_dir: Path, rows, swept) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (the axes' number format)

    x_key, cats = _axes_of(rows, swept)
    objective, _ = objective_of(rows)
    panels = _panels(rows)
    if not panels:      # no point has a figure to draw (all failed or infeasible): the tables say why
        (sweep_dir / "summary.png").unlink(missing_ok=True)
        return
    groups = _series(rows, x_key, cats)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.0), squeeze=False)
    failed = [r for r in rows if r.get("status") in FAILED_STATES]
    saturated = [r for r in rows if r.get("status") == "saturated"]
    rejecting = [r for r in rows if (number(r.get("rejected_requests")) or 0) > 0 or r.get("status") == "rejected"]
    headline = ""
    for ax, metric in zip(axes[0], panels):
        name, unit, scale = metric_label(metric, rows)
        top = _clip_top(rows, metric, scale)
        for gi, (label, pts) in enumerate(groups.items()):
            c = colors[gi % len(colors)]
            ok = [(x, number(r.get(metric)), r) for x, r in pts
                  if r.get("status") not in FAILED_STATES and number(r.get(metric)) is not None]
            style = "-" if len(ok) <= 12 else ""
            if ok:
                ax.plot([x for x, _, _ in ok], [y * scale for _, y, _ in ok], style, color=c, label=label, lw=1.5)
                marks: Dict[Tuple[str, bool], List[Tuple[float, float]]] = {}
                for x, y, r in ok:    # ok points filled; saturated or rejecting points hollow
                    degraded = r.get("status") in DEGRADED_STATES or (number(r.get("rejected_requests")) or 0) > 0
                    off = top is not None and y * scale > top
                    marks.setdefault(("^" if off else "o", degraded), []).append(
                        (x, min(y * scale, top * 0.97) if off else y * scale))
                for (marker, degraded), xy in marks.items():    # one artist per kind keeps drawing fast
                    ax.plot([p[0] for p in xy], [p[1] for p in xy], marker, ls="none", ms=6, color=c,
                            mfc="white" if degraded else c, mew=1.5, clip_on=False)
                for x, y, r in ok:
                    off = top is not None and y * scale > top
                    notes = []
                    if r.get("status") == "saturated":
                        notes.append("saturated" + (f": {fmt_number(y * scale)} {unit} (off the scale)" if off else ""))
                    if (number(r.get("rejected_requests")) or 0) > 0:
                        notes.append(f"{int(number(r.get('rejected_requests'))):,} rejected")
                    if notes:
                        ax.annotate(", ".join(notes), (x, min(y * scale, top * 0.97) if off else y * scale),
                                    textcoords="offset points", xytext=(5, -10 if off else 5), fontsize=7,
                                    color="0.3")
            if metric == "token_hit_rate":
                dev = [(x, number(r.get("device_hit_rate"))) for x, r in pts
                       if r.get("status") not in FAILED_STATES and number(r.get("device_hit_rate")) is not None]
                if dev and any(number(r.get("host_hit_rate")) or number(r.get("storage_hit_rate")) for _, r in pts):
                    ax.plot([x for x, _ in dev], [y * scale for _, y in dev], "--", color=c, alpha=0.8, lw=1.2)
            for x, r in [(x, r) for x, r in pts if r.get("status") in FAILED_STATES]:
                y = number(r.get(metric))
                if y is not None:      # infeasible: its value is known, mark it
                    ax.plot([x], [y * scale], "x", color="red", ms=10, mew=2)
                elif x_key:
                    ax.axvline(x, color="red", alpha=0.2, lw=6)
        if metric != "token_hit_rate" or objective == "token_hit_rate":
            best, _note = pick_best(rows, metric, direction_of(metric, rows))
            if best is not None:
                bx = number(best["_overrides"].get(x_key)) if x_key else float(rows.index(best))
                by = number(best.get(metric)) * scale
                ax.plot([bx], [by], marker="*", ms=18, color="gold", mec="black", zorder=5, ls="none",
                        label=f"best: {fmt_number(by)} {unit}")
                if metric == panels[0]:
                    ties = tied_points(rows, best, metric)
                    if ties and ties + 1 == len([r for r in rows if r.get("status") == best.get("status")]):
                        headline = (f"every point gives the same {name} ({fmt_number(by)} {unit}): the swept settings "
                                    "make no difference to it here")
                    else:
                        headline = f"best {name}: {fmt_number(by)} {unit} at {point_label(best, swept)}"
                        if ties:
                            headline += f" (tied with {ties} other point{'s' if ties > 1 else ''})"
                    if best.get("status") != "ok":
                        headline += f" ({best['status']}: no point is ok)"
        better = "lower" if direction_of(metric, rows) == MINIMIZE else "higher"
        ax.set_title(f"{name} ({better} is better)", fontsize=10)
        ax.set_ylabel(f"{name} ({unit})")
        # from zero, with headroom above the highest point so the legend (upper right) covers none
        ax.set_ylim(0, ax.dataLim.y1 * 1.3 if ax.dataLim.y1 > 0 else None)
        if top is not None:
            ax.set_ylim(0, top)
        if metric == "token_hit_rate":
            ax.set_ylim(0, max(5.0, ax.get_ylim()[1]))
        if x_key:
            ax.set_xlabel(x_key)
            xs = sorted({x for pts in groups.values() for x, _ in pts if x is not None})
            if xs and xs[0] >= 0:
                ax.set_xlim(left=0, right=xs[-1] * 1.08 if xs[-1] > 0 else 1)
            if len(xs) <= 10:
                host = _host_by_x(rows, x_key)
                if host:   # the price of each x, when x alone decides it
                    ax.set_xticks(xs, [f"{value_text(x)}\n{host[x]:,.0f} GB host" for x in xs], fontsize=8)
                    ax.set_xlabel(f"{x_key} (host memory below each value)")
                else:
                    ax.set_xticks(xs, [value_text(x) for x in xs], fontsize=9)
        else:
            ax.set_xticks(range(len(rows)), [point_label(r, swept)[:40] for r in rows], rotation=30, ha="right",
                          fontsize=8)
            ax.set_xlim(-0.5, len(rows) - 0.5)       # categories: no point sits on the frame
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_tick))
        if metric == "token_hit_rate":
            if any(number(r.get("host_hit_rate")) or number(r.get("storage_hit_rate")) for r in rows):
                ax.plot([], [], "k-", label="all tiers")
                ax.plot([], [], "k--", label="device only")
        if saturated or rejecting:
            ax.plot([], [], "o", color="0.4", mfc="white", mew=1.5, label="hollow: saturated / rejected requests")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    title = context_title(rows) + f"  |  {len(rows)} points"
    if failed:
        title += f", {len(failed)} failed or infeasible (red: x = over budget, band = failed; see failed.csv)"
    if saturated:
        title += (f"\n{len(saturated)} saturated (hollow): the engine cannot keep up there, so their latency is "
                  "backlog that grows with the trace")
    if rejecting:
        total = sum(int(number(r.get("rejected_requests")) or 0) for r in rejecting)
        title += (f"\n{len(rejecting)} point{'s' if len(rejecting) > 1 else ''} rejected requests ({total:,} in all; "
                  "column rejected_requests)")
    if headline:
        title += "\n" + headline
    loads = [number(r.get("offered_load")) for r in rows if r.get("status") not in FAILED_STATES]
    loads = [x for x in loads if x is not None]
    if loads and max(loads) > 1.0:
        scale = math.ceil(max(loads) * 1.25 * 10) / 10 * (number(rows[0].get("time_scale")) or 1.0)
        title += (f"\nwarning: requests need up to {max(loads):.1f}x the time one prefill engine has, so TTFT is "
                  f"backlog that grows with trace length; job.time_scale={scale:g} replays the trace slower")
    fig.suptitle(_wrap(title, fig), fontsize=10)
    fig.tight_layout()
    _save(fig, sweep_dir / "summary.png")
    plt.close(fig)


def _wrap(title: str, fig) -> str:
    """Break each title line to the figure's width (about 13 characters an inch at 10 pt),
    so a long line is wrapped instead of cut off at both edges."""
    import textwrap
    width = max(40, int(fig.get_figwidth() * 13))
    return "\n".join(textwrap.fill(line, width) for line in title.split("\n"))


def _host_by_x(rows, x_key) -> Optional[Dict[float, float]]:
    """x -> host memory (GB) when every point at an x needs the same host memory, and it varies."""
    seen: Dict[float, set] = {}
    for r in rows:
        x, h = number(r["_overrides"].get(x_key)), number(r.get("host_memory_gb"))
        if x is None or h is None:
            return None
        seen.setdefault(x, set()).add(round(h, 3))
    if any(len(v) != 1 for v in seen.values()) or len({next(iter(v)) for v in seen.values()}) < 2:
        return None
    return {x: next(iter(v)) for x, v in seen.items()}


def pareto_front(points: Sequence[Tuple[float, float]], directions: Tuple[str, str] = (MINIMIZE, MINIMIZE)) \
        -> List[int]:
    """Indices of points no other point beats on both coordinates (by default lower is better
    on both; ``directions`` says otherwise per coordinate)."""
    sx = 1.0 if directions[0] == MINIMIZE else -1.0
    sy = 1.0 if directions[1] == MINIMIZE else -1.0
    pts = [(sx * x, sy * y) for x, y in points]
    order = sorted(range(len(pts)), key=lambda i: (pts[i][0], pts[i][1]))
    front, best_y = [], math.inf
    for i in order:
        if pts[i][1] < best_y:
            front.append(i)
            best_y = pts[i][1]
    return front


def pareto_axes(rows) -> Optional[Tuple[str, str]]:
    """(x metric, y metric) of the Pareto plot: host memory against P90 TTFT where host memory
    varies between points, else tokens/s per user against tokens/s per GPU; None without them."""
    usable = [r for r in rows if r.get("status") not in ("failed", "interrupted")]
    host = {round(number(r.get("host_memory_gb")), 6) for r in usable if number(r.get("host_memory_gb")) is not None}
    if len(host) > 1 and any(number(r.get("ttft_p90_ms")) is not None for r in usable):
        return "host_memory_gb", "ttft_p90_ms"
    if any(number(r.get("tokens_per_s_per_gpu")) is not None and number(r.get("tokens_per_s_per_user")) is not None
           for r in usable):
        return "tokens_per_s_per_gpu", "tokens_per_s_per_user"
    if host and any(number(r.get("ttft_p90_ms")) is not None for r in usable):
        return "host_memory_gb", "ttft_p90_ms"
    return None


def plot_pareto(sweep_dir: Path, rows, swept) -> bool:
    """Draw pareto.png; False (and no file) when the points have no pair of figures to trade."""
    axes_pair = pareto_axes(rows)
    if axes_pair is None:
        (sweep_dir / "pareto.png").unlink(missing_ok=True)
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (the axes' number format)

    xm, ym = axes_pair
    xname, xunit, xs = METRIC_LABELS[xm]
    yname, yunit, ys = METRIC_LABELS[ym]
    dirs = (OBJECTIVES.get(xm, MINIMIZE), OBJECTIVES.get(ym, MINIMIZE))
    pts = [r for r in rows if r.get("status") in ("ok", "infeasible", "no_objective") + DEGRADED_STATES
           and number(r.get(xm)) is not None and number(r.get(ym)) is not None]
    x_key, cats = _axes_of(rows, swept)
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = _ordered_labels(rows, cats)
    kinds: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
    for r in pts:     # one artist per label and kind keeps drawing fast
        kind = "infeasible" if r["status"] == "infeasible" else ("hollow" if r["status"] in DEGRADED_STATES else "ok")
        kinds.setdefault((point_label(r, cats), kind), []).append((number(r[xm]) * xs, number(r[ym]) * ys))
    for (lab, kind), xy in kinds.items():
        c = colors[labels.index(lab) % len(colors)]
        if kind == "infeasible":
            ax.plot([p[0] for p in xy], [p[1] for p in xy], "x", ls="none", color="red", ms=9)
        else:
            ax.plot([p[0] for p in xy], [p[1] for p in xy], "o", ls="none", color=c,
                    mfc="white" if kind == "hollow" else c, mew=1.5)
    shown = {point_label(r, cats) for r in pts if r["status"] != "infeasible"}
    for lab in labels:
        if lab in shown:
            ax.plot([], [], "o", color=colors[labels.index(lab) % len(colors)], label=lab)
    feasible = [r for r in pts if r["status"] not in ("infeasible",) + DEGRADED_STATES]
    idx = pareto_front([(number(r[xm]), number(r[ym])) for r in feasible], dirs)
    front = sorted((feasible[i] for i in idx), key=lambda r: number(r[xm]))
    if front:
        where = "post" if dirs == (MINIMIZE, MINIMIZE) else "pre"
        ax.step([number(r[xm]) * xs for r in front], [number(r[ym]) * ys for r in front], "k--", where=where, lw=1,
                label="Pareto front (no point is better on both)")
        for i, r in enumerate(front):     # labels alternate above and below the line
            txt = ", ".join(value_text(r["_overrides"].get(k)) for k in swept)
            ax.annotate(txt, (number(r[xm]) * xs, number(r[ym]) * ys), textcoords="offset points",
                        xytext=(6, 4 if i % 2 == 0 else -12), fontsize=8)
    budget = next((number(r["_overrides"].get("job.max_host_memory_gb")) for r in rows
                   if number(r["_overrides"].get("job.max_host_memory_gb")) is not None), None)
    if budget is not None and xm == "host_memory_gb":
        ax.axvline(budget, color="red", ls=":", lw=1, label=f"host-memory budget ({fmt_number(budget)} GB)")
    if any(r["status"] == "infeasible" for r in pts):
        ax.plot([], [], "x", color="red", label="over the host-memory budget")
    if any(r["status"] in DEGRADED_STATES for r in pts):
        ax.plot([], [], "o", color="0.4", mfc="white", mew=1.5, label="saturated / rejected requests (off the front)")
    if front and swept:
        ax.plot([], [], " ", label="labels: " + ", ".join(short_key(k) for k in swept))
    ax.set_xlabel(f"{xname} ({xunit})")
    ax.set_ylabel(f"{yname} ({yunit})")
    # room above and to the right of the highest points for their labels and the legend
    ax.set_xlim(left=0, right=ax.dataLim.x1 * 1.15 if ax.dataLim.x1 > 0 else None)
    ax.set_ylim(bottom=0, top=ax.dataLim.y1 * 1.3 if ax.dataLim.y1 > 0 else None)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(_tick))
    what = "memory vs latency" if xm == "host_memory_gb" else "throughput per GPU vs speed per user"
    ax.set_title(_wrap(f"{what}  |  {context_title(rows)}", fig), fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, sweep_dir / "pareto.png")
    plt.close(fig)
    return True


def _save(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    tmp.replace(path)
