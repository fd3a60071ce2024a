"""The sweep's charts: ``summary.png`` (each key result against the swept setting) and
``pareto.png`` (the trade-off between two results, with its front).

Each drawing function returns what it drew (:class:`PanelData` per panel: axis labels, every
series with its points, the best mark or why there is none, the notes), so tests check the
chart's content rather than a file size.  Rules a reader relies on:

* no series hides another: a series whose points lie on an earlier one's (within half a percent
  of the panel's height; within 1 % of both axes in pareto.png) is drawn dashed, with smaller
  markers of another shape on top, and the legend and a note on the panel say which overlap;
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
from ..utils.numbers import fmt_gb, fmt_number
from .sweep_points import (DEGRADED_STATES, FAILED_STATES, METRIC_LABELS, context_title, direction_of, metric_label,
                           number, objective_of, pick_best, point_label, short_key, tied_points, value_text)


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


#: markers for series that share points: each later one is smaller and drawn on top, so all show
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: dash patterns for a line that lies on an earlier one (the earlier colour shows in its gaps)
_DASHES = ((0, (5, 4)), (0, (2, 3)), (0, (7, 3, 1, 3)), (0, (1, 2)))


@dataclass
class SeriesData:
    """One drawn series: its legend label, its (x, y) points as drawn (chart units) and, when its
    points are those of an earlier series, that series' label (it is then drawn smaller on top)."""
    label: str
    points: List[Tuple[float, float]]
    marker: str = "o"
    same_as: Optional[str] = None


@dataclass
class PanelData:
    """One panel as a reader sees it: what its axes say, its series, the best mark (or why none)."""
    metric: str
    title: str
    xlabel: str
    ylabel: str
    series: List[SeriesData] = field(default_factory=list)
    best: Optional[Tuple[float, float]] = None
    flat: bool = False
    notes: List[str] = field(default_factory=list)


@dataclass
class ChartData:
    """A chart written to ``path``: its title and panels (what tests check instead of bytes)."""
    path: Path
    title: str
    panels: List[PanelData] = field(default_factory=list)


def is_flat(values: Sequence[float], rel: float = 1e-3) -> bool:
    """All values equal within ``rel`` of the largest: a panel with nothing to pick."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return False
    top = max(abs(v) for v in vals)
    return max(vals) - min(vals) <= rel * top


def coinciding(series: Sequence[Tuple[str, List[Tuple[float, float]]]], y_tol: float = 0.0) -> Dict[str, str]:
    """label -> the first earlier label whose points this series' points would hide: the same x
    values and every y within ``y_tol`` (half a percent of the panel's height hides a marker)."""
    out: Dict[str, str] = {}
    for i, (lab, pts) in enumerate(series):
        for other, opts in series[:i]:
            if other in out or len(opts) != len(pts) or not pts:
                continue
            if all(math.isclose(a[0], b[0], rel_tol=1e-9, abs_tol=1e-12)
                   and abs(a[1] - b[1]) <= max(y_tol, 1e-12 * abs(a[1])) for a, b in zip(pts, opts)):
                out[lab] = other
                break
    return out


def plot_summary(sweep_dir: Path, rows, swept) -> Optional[ChartData]:
    """Draw summary.png: one panel per key result against the swept numeric key, one series per
    categorical choice.  Returns what it drew (None, and no file, when no point has a figure)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401  (the axes' number format)

    x_key, cats = _axes_of(rows, swept)
    objective, _ = objective_of(rows)
    panels = _panels(rows)
    if not panels:      # no point has a figure to draw (all failed or infeasible): the tables say why
        (sweep_dir / "summary.png").unlink(missing_ok=True)
        return None
    groups = _series(rows, x_key, cats)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.0), squeeze=False)
    failed = [r for r in rows if r.get("status") in FAILED_STATES]
    saturated = [r for r in rows if r.get("status") == "saturated"]
    rejecting = [r for r in rows if (number(r.get("rejected_requests")) or 0) > 0 or r.get("status") == "rejected"]
    chart = ChartData(path=sweep_dir / "summary.png", title="")
    headline = ""
    for ax, metric in zip(axes[0], panels):
        name, unit, scale = metric_label(metric, rows)
        top = _clip_top(rows, metric, scale)
        better = "lower" if direction_of(metric, rows) == MINIMIZE else "higher"
        panel = PanelData(metric=metric, title=f"{name} ({better} is better)", ylabel=f"{name} ({unit})",
                          xlabel=x_key or "point")
        drawn = []
        for label, pts in groups.items():
            ok = [(x, number(r.get(metric)) * scale, r) for x, r in pts
                  if r.get("status") not in FAILED_STATES and number(r.get(metric)) is not None]
            drawn.append((label, [(x, y) for x, y, _ in ok], ok))
        tallest = max((abs(y) for _, xy, _ in drawn for _, y in xy), default=0.0)
        same = coinciding([(lab, xy) for lab, xy, _ in drawn], y_tol=0.005 * tallest)
        depths = _depths([lab for lab, _, _ in drawn], same)
        for gi, (label, xy, ok) in enumerate(drawn):
            c = colors[gi % len(colors)]
            depth = depths[label]                   # 0: first of its points; 1, 2...: drawn smaller on top
            marker = _MARKERS[depth % len(_MARKERS)]
            size = max(3.0, 7.0 - 1.6 * depth)
            series = SeriesData(label=label, points=xy, marker=marker, same_as=same.get(label))
            panel.series.append(series)
            if not ok:
                continue
            legend = label + (f" (overlaps {_short_label(same[label])})" if label in same else "")
            style = ("-" if depth == 0 else _DASHES[(depth - 1) % len(_DASHES)]) if len(ok) <= 12 else "none"
            ax.plot([x for x, _ in xy], [y for _, y in xy], ls=style, color=c, lw=1.5, zorder=2 + depth)
            ax.plot([], [], ls="-" if style == "none" else style, color=c, lw=1.5, marker=marker, ms=size,
                    label=legend)        # the legend shows the line and the marker of the series
            marks: Dict[Tuple[str, bool], List[Tuple[float, float]]] = {}
            for x, y, r in ok:    # ok points filled; saturated or rejecting points hollow
                degraded = r.get("status") in DEGRADED_STATES or (number(r.get("rejected_requests")) or 0) > 0
                off = top is not None and y > top
                marks.setdefault(("^" if off else marker, degraded), []).append((x, min(y, top * 0.97) if off else y))
            for (mk, degraded), pxy in marks.items():    # one artist per kind keeps drawing fast
                ax.plot([p[0] for p in pxy], [p[1] for p in pxy], mk, ls="none", ms=size, color=c,
                        mfc="white" if degraded else c, mew=1.5, clip_on=False, zorder=3 + depth)
            for x, y, r in ok:
                off = top is not None and y > top
                notes = []
                if r.get("status") == "saturated":
                    notes.append("saturated" + (f": {fmt_number(y)} {unit} (off the scale)" if off else ""))
                if (number(r.get("rejected_requests")) or 0) > 0:
                    notes.append(f"{int(number(r.get('rejected_requests'))):,} rejected")
                if notes and depth == 0:
                    ax.annotate(", ".join(notes), (x, min(y, top * 0.97) if off else y),
                                textcoords="offset points", xytext=(5, -10 if off else 5), fontsize=7,
                                color="0.3")
            if metric == "token_hit_rate":
                dev = [(x, number(r.get("device_hit_rate"))) for x, r in groups[label]
                       if r.get("status") not in FAILED_STATES and number(r.get("device_hit_rate")) is not None]
                if dev and any(number(r.get("host_hit_rate")) or number(r.get("storage_hit_rate"))
                               for _, r in groups[label]):
                    ax.plot([x for x, _ in dev], [y * scale for _, y in dev], ls=(0, (4, 2 + 2 * depth)), color=c,
                            alpha=0.8, lw=1.2, zorder=2 + depth)
            for x, r in [(x, r) for x, r in groups[label] if r.get("status") in FAILED_STATES]:
                y = number(r.get(metric))
                if y is not None:      # infeasible: its value is known, mark it
                    ax.plot([x], [y * scale], "x", color="red", ms=10, mew=2)
                elif x_key:
                    ax.axvline(x, color="red", alpha=0.2, lw=6)
        if same:
            panel.notes += [f"{lab} overlaps {other}" for lab, other in same.items()]
            ax.text(0.01, 0.01, "overlapping lines: dashed, smaller markers on top", transform=ax.transAxes,
                    fontsize=7, color="0.35", ha="left", va="bottom")
        values = [y for s_ in panel.series for _, y in s_.points]
        panel.flat = is_flat(values)
        if panel.flat:         # nothing to pick: say so instead of starring one point
            panel.notes.append(f"every point: {fmt_number(values[0])} {unit}; the swept settings do not change it")
            ax.text(0.5, 0.5, f"every point: {fmt_number(values[0])} {unit}\n(no best: the swept settings do not "
                    "change it)", transform=ax.transAxes, ha="center", va="bottom", fontsize=9, color="0.25",
                    bbox=dict(boxstyle="round", fc="white", ec="0.7", alpha=0.9))
        elif metric != "token_hit_rate" or objective == "token_hit_rate":
            best, _note = pick_best(rows, metric, direction_of(metric, rows))
            if best is not None:
                bx = number(best["_overrides"].get(x_key)) if x_key else float(rows.index(best))
                by = number(best.get(metric)) * scale
                panel.best = (bx, by)
                ax.plot([bx], [by], marker="*", ms=18, color="gold", mec="black", zorder=9, ls="none",
                        label=f"best: {fmt_number(by)} {unit}")
        if metric == panels[0]:
            headline = _headline(rows, metric, name, unit, scale, swept, panel.flat, values)
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(panel.ylabel)
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
                    ax.set_xticks(xs, [f"{value_text(x)}\n{fmt_gb(host[x])} host" for x in xs], fontsize=8)
                    panel.xlabel = f"{x_key} (host memory below each value)"
                    ax.set_xlabel(panel.xlabel)
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
        chart.panels.append(panel)
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
    chart.title = _wrap(title, fig)
    fig.suptitle(chart.title, fontsize=10)
    fig.tight_layout()
    _save(fig, chart.path)
    plt.close(fig)
    return chart


def _short_label(label: str) -> str:
    """``radix_eviction_policy=lru`` -> ``lru``: a legend names the series it overlaps briefly
    (a label of several settings stays whole)."""
    return label.split("=", 1)[1] if label.count("=") == 1 else label


def _depths(labels: Sequence[str], same: Dict[str, str]) -> Dict[str, int]:
    """label -> how many earlier series have its points (0: none; it is drawn that much smaller)."""
    seen: Dict[str, int] = {}
    out = {}
    for lab in labels:
        root = same.get(lab, lab)
        out[lab] = seen.get(root, 0)
        seen[root] = out[lab] + 1
    return out


def _headline(rows, metric, name, unit, scale, swept, flat, values) -> str:
    """The first panel's verdict: the best point, or that every point gives the same value."""
    if flat and values:
        return (f"every point gives the same {name} ({fmt_number(values[0])} {unit}): the swept settings "
                "make no difference to it here")
    best, _note = pick_best(rows, metric, direction_of(metric, rows))
    if best is None:
        return ""
    by = number(best.get(metric)) * scale
    text = f"best {name}: {fmt_number(by)} {unit} at {point_label(best, swept)}"
    ties = tied_points(rows, best, metric)
    if ties:
        text += f" (tied with {ties} other point{'s' if ties > 1 else ''})"
    if best.get("status") != "ok":
        text += f" ({best['status']}: no point is ok)"
    return text


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


def plot_pareto(sweep_dir: Path, rows, swept) -> Optional[ChartData]:
    """Draw pareto.png and return what it drew; None (and no file) when the points have no pair
    of figures to trade.  A point on (or within 1 % of the axes of) a point of an earlier series
    is drawn smaller, with another marker, on top, and the legend says which series overlap."""
    axes_pair = pareto_axes(rows)
    if axes_pair is None:
        (sweep_dir / "pareto.png").unlink(missing_ok=True)
        return None
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
    xy_of = {id(r): (number(r[xm]) * xs, number(r[ym]) * ys) for r in pts}
    span = (max((p[0] for p in xy_of.values()), default=0.0) or 1.0, max((p[1] for p in xy_of.values()), default=0.0)
            or 1.0)
    chart = ChartData(path=sweep_dir / "pareto.png", title="")
    panel = PanelData(metric=f"{ym} vs {xm}", title="", xlabel=f"{xname} ({xunit})", ylabel=f"{yname} ({yunit})")
    placed: List[Tuple[float, float, str]] = []        # (x, y, label) of points already drawn
    overlaps: Dict[str, str] = {}
    kinds: Dict[Tuple[str, str, int], List[Tuple[float, float]]] = {}
    for lab in labels:       # series in order; a point on an earlier series' point goes one size down
        mine = [r for r in pts if point_label(r, cats) == lab]
        series = SeriesData(label=lab, points=[xy_of[id(r)] for r in mine if r["status"] != "infeasible"])
        depth_here = []
        for r in mine:
            x, y = xy_of[id(r)]
            under = [q for q in placed if q[2] != lab and abs(q[0] - x) <= 0.01 * span[0]
                     and abs(q[1] - y) <= 0.01 * span[1]]
            if under and r["status"] != "infeasible":
                overlaps.setdefault(lab, under[0][2])
            depth = len({q[2] for q in under})
            depth_here.append(depth)
            kind = "infeasible" if r["status"] == "infeasible" else ("hollow" if r["status"] in DEGRADED_STATES else "ok")
            kinds.setdefault((lab, kind, depth), []).append((x, y))
        placed += [(*xy_of[id(r)], lab) for r in mine]
        series.same_as = overlaps.get(lab)
        series.marker = _MARKERS[0]
        panel.series.append(series)
    for (lab, kind, depth), pxy in kinds.items():     # one artist per label, kind and depth keeps drawing fast
        c = colors[labels.index(lab) % len(colors)]
        if kind == "infeasible":
            ax.plot([p[0] for p in pxy], [p[1] for p in pxy], "x", ls="none", color="red", ms=9)
        else:
            ax.plot([p[0] for p in pxy], [p[1] for p in pxy], _MARKERS[depth % len(_MARKERS)], ls="none", color=c,
                    ms=max(3.0, 7.0 - 1.6 * depth), mfc="white" if kind == "hollow" else c, mew=1.5,
                    zorder=3 + depth)
    shown = {point_label(r, cats) for r in pts if r["status"] != "infeasible"}
    for lab in labels:
        if lab in shown:
            note = f" (overlaps {_short_label(overlaps[lab])}: smaller, on top)" if lab in overlaps else ""
            ax.plot([], [], _MARKERS[1] if lab in overlaps else _MARKERS[0], ls="none",
                    color=colors[labels.index(lab) % len(colors)], label=lab + note)
    panel.notes += [f"{lab} overlaps {other}" for lab, other in overlaps.items()]
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
    chart.title = panel.title = _wrap(f"{what}  |  {context_title(rows)}", fig)
    ax.set_title(chart.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, chart.path)
    plt.close(fig)
    chart.panels.append(panel)
    return chart


def _save(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    tmp.replace(path)
