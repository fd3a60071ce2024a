"""Sweep summary: a table (summary.csv, failed.csv) and plots a person reads in ten seconds.

Each job writes ``metrics.json`` into its own output directory (and a failed job leaves
``error.json``), so the summary works with every launcher (basic, joblib, submitit, ray)
and sweeper (grid, Optuna): at the end of the sweep the callback reads them back.

* ``summary.csv``: one row per point: ``run``, ``status``, every swept key, then the
  metrics (per-tier hit rates, TTFT percentiles, host memory, ...).
* ``failed.csv``: the points that failed or broke a constraint, with the reason.
* ``summary.png``: one panel per metric (P90 TTFT in seconds; token hit rate split by
  tier), x = the swept numeric key, one line per categorical choice, best point starred.
* ``pareto.png``: host memory against P90 TTFT, with the Pareto front.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.experimental.callback import Callback

from .context import atomic_write

#: metrics that come first in summary.csv, in this order
LEAD_METRICS = ("objective", "objective_value", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_mean_ms",
                "token_hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate", "host_memory_gb",
                "host_memory_bytes", "prefill_throughput", "engine_busy_share")
#: statuses of points that did not give a result (listed in failed.csv, marked in the plots);
#: ``no_objective`` points (no TTFT without hardware figures) still have their hit rates
FAILED_STATES = ("failed", "infeasible")
#: overrides that describe the setting rather than a swept dimension
_CONTEXT_KEYS = ("model", "hardware", "job", "job.trace", "hydra/launcher", "hydra/sweeper")


class SweepSummary(Callback):
    def on_job_end(self, config, job_return=None, **kwargs: Any) -> None:
        """Keep the tables current after every point, so a sweep that dies still leaves them;
        under Optuna, turn a point without an objective value into a failed trial."""
        try:
            from hydra.core.hydra_config import HydraConfig
            if str(HydraConfig.get().mode) != "RunMode.MULTIRUN":
                return
            mark_failed_trial(job_return, Path(HydraConfig.get().runtime.output_dir))
            write_summary(Path(config.hydra.sweep.dir), plots=False)
        except Exception:  # noqa: BLE001 - the end-of-sweep summary reports problems
            pass

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            write_summary(sweep_dir)
        except Exception as exc:  # noqa: BLE001 - a broken plot must not hide the sweep's results
            print(f"sglang-hydra: could not write the sweep summary in {sweep_dir}: {exc}")


def mark_failed_trial(job_return, job_dir: Path) -> bool:
    """A completed job whose value is not a number becomes FAILED, under the Optuna sweeper.

    Optuna 2.10 cannot be told NaN: the plugin's second ``tell`` (state FAIL, values [nan])
    raises and ends the whole study.  A FAILED job return is recorded as a failed trial and
    the study goes on.  Runs in the job's process (this callback fires there with every
    launcher), before the return travels back to the sweeper."""
    from hydra.core.utils import JobStatus
    from .sweeps import under_optuna

    if job_return is None or job_return.status != JobStatus.COMPLETED or not under_optuna():
        return False
    value = job_return._return_value
    try:
        ok = math.isfinite(float(value))
    except (TypeError, ValueError):
        ok = False
    if ok:
        return False
    reason = "the job returned no objective value"
    try:
        m = json.loads((job_dir / "metrics.json").read_text())
        reason = f"{m.get('status')}: {m.get('status_reason')}"
    except (OSError, ValueError):
        try:
            reason = json.loads((job_dir / "error.json").read_text()).get("error", reason)
        except (OSError, ValueError):
            pass
    job_return.status = JobStatus.FAILED
    job_return.return_value = RuntimeError(f"trial failed ({reason})")
    return True


def _overrides_list(job_dir: Path) -> List[str]:
    import yaml
    p = job_dir / ".hydra" / "overrides.yaml"
    if p.is_file():
        return [str(o) for o in (yaml.safe_load(p.read_text()) or [])]
    err = job_dir / "error.json"
    if err.is_file():
        try:
            return [str(o) for o in json.loads(err.read_text()).get("overrides", [])]
        except (ValueError, AttributeError):
            return []
    return []


def _split(overrides: Sequence[str]) -> Dict[str, str]:
    out = {}
    for ov in overrides:
        k, _, v = ov.partition("=")
        out[k.lstrip("+~")] = v
    return out


def _job_dirs(sweep_dir: Path) -> List[Path]:
    dirs = [p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
            and ((p / "metrics.json").is_file() or (p / "error.json").is_file() or (p / ".hydra").is_dir())]
    return sorted(dirs, key=lambda p: (len(p.name), p.name))


def collect(sweep_dir: Path) -> Tuple[List[Dict[str, Any]], List[str]]:
    """One dict per job dir (its overrides, metrics and status) and the swept keys."""
    rows: List[Dict[str, Any]] = []
    for d in _job_dirs(sweep_dir):
        ovs = _split(_overrides_list(d))
        row: Dict[str, Any] = {"run": d.name}
        if (d / "metrics.json").is_file():
            m = json.loads((d / "metrics.json").read_text())
            if isinstance(m, dict) and m.get("schema_version") == 2:   # nested groups: one column per leaf
                from ..workload.metrics import flatten_metrics
                m = {k: v for k, v in flatten_metrics(m).items() if not isinstance(v, (list, dict))}
            row.update(m)
            row.setdefault("status", "ok")
        if (d / "error.json").is_file():
            try:
                err = json.loads((d / "error.json").read_text())
            except ValueError:
                err = {"error": "unreadable error.json"}
            if row.get("status", "ok") == "ok":
                row["status"] = "failed"
            row["error"] = str(err.get("error", ""))
            row["exit_code"] = err.get("exit_code")
        elif "status" not in row:
            row["status"] = "failed"
            row["error"] = "the job left no metrics.json (killed, or it failed before writing)"
        if row.get("status") not in ("ok", "failed") and not row.get("error"):
            row["error"] = row.get("status_reason", "")
        row.update(ovs)
        row["_overrides"] = ovs
        rows.append(row)
    keys: List[str] = []
    for r in rows:
        for k in r["_overrides"]:
            if k not in keys:
                keys.append(k)
    swept = [k for k in keys if len({r["_overrides"].get(k) for r in rows}) > 1]
    if not swept:
        swept = [k for k in keys if k not in _CONTEXT_KEYS] or keys
    return rows, swept


def write_summary(sweep_dir: Path, *, plots: bool = True) -> List[Dict[str, Any]]:
    """Write summary.csv, failed.csv, best_config.yaml, summary.png and pareto.png into ``sweep_dir``."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return []
    rows, swept = collect(sweep_dir)
    if not rows:
        return rows
    metric_keys: List[str] = [k for k in LEAD_METRICS if any(k in r for r in rows)]
    fixed = {k for r in rows for k in r["_overrides"]}     # overrides every point shares: not a column
    for r in rows:
        for k, v in r.items():
            if (k not in ("run", "status", "error", "exit_code", "_overrides") and k not in swept
                    and k not in fixed and k not in metric_keys and not isinstance(v, (dict, list))):
                metric_keys.append(k)
    cols = ["run", "status"] + swept + metric_keys + ["error"]
    atomic_write(sweep_dir / "summary.csv", _csv(rows, cols))
    failed = [r for r in rows if r["status"] in FAILED_STATES]
    fpath = sweep_dir / "failed.csv"
    if failed:
        fcols = ["run", "status", "exit_code", "error", "overrides"]
        for r in failed:
            r["overrides"] = " ".join(f"{k}={v}" for k, v in r["_overrides"].items())
        atomic_write(fpath, _csv(failed, fcols))
    elif fpath.exists():
        fpath.unlink()
    if not plots:
        return rows
    best = write_best_config(sweep_dir, rows)
    if best is not None:
        print(f"best point: {best}")
    try:
        if _has_replay_figures(rows):
            plot_summary(sweep_dir, rows, swept)
            plot_pareto(sweep_dir, rows, swept)
        else:     # resolve/plan sweeps: the table is the answer; an empty chart is not
            (sweep_dir / "summary.png").unlink(missing_ok=True)
    except ImportError:  # matplotlib missing: the tables are still there
        pass
    return rows


def _has_replay_figures(rows) -> bool:
    """True when some point has a figure the plots show (hit rates, TTFT)."""
    return any(_num(r.get(k)) is not None for r in rows for k in ("token_hit_rate", "ttft_p90_ms"))


def _value(text: str) -> Any:
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def write_best_config(sweep_dir: Path, rows) -> Optional[str]:
    """``best_config.yaml``: the best point's settings, in the form ``--config FILE`` reads.

    Group choices (``model: llama3_8b``) and dotted settings (``memory.hicache_ratio: 4``)
    come from the point's overrides; ``job.*`` settings are listed as comments (they belong
    to the job, not to the server).  Returns a one-line description, or None without a best."""
    objective = next((r.get("objective") for r in rows if r.get("objective")), None)
    direction = next((r.get("objective_direction") for r in rows if r.get("objective_direction")), "minimize")
    if not objective:
        return None
    best = _best(rows, objective, direction)
    if best is None:
        return None
    import yaml
    settings: Dict[str, Any] = {}
    job_lines = []
    for k, v in best["_overrides"].items():
        if k.startswith("hydra") or k == "job":
            continue
        if k.startswith("job."):
            job_lines.append(f"#   {k}={v}")
            continue
        settings[k] = _value(v)
    ordered = dict(sorted(settings.items(), key=lambda kv: ("." in kv[0], kv[0])))
    head = [f"# Best of {len(rows)} points in {sweep_dir} by {objective} ({direction}): "
            f"{_fmt(float(best.get(objective)))} (run {best['run']}).",
            "# Use it with: sglang-hydra --config best_config.yaml [job=... overrides]"]
    if job_lines:
        head.append("# The sweep also set these job settings:")
        head += job_lines
    text = "\n".join(head) + "\n" + (yaml.safe_dump(ordered, sort_keys=False) if ordered else "{}\n")
    atomic_write(sweep_dir / "best_config.yaml", text)
    return f"{objective}={_fmt(float(best.get(objective)))} at " + \
        " ".join(f"{k}={v}" for k, v in best["_overrides"].items() if not k.startswith("job.")) + \
        f" (written to {sweep_dir / 'best_config.yaml'})"


def _csv(rows, cols) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: r.get(k, "") for k in cols})
    return buf.getvalue()


# ----------------------------------------------------------------------------- plotting helpers
def _num(v: Any) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _short(key: str) -> str:
    return key.split(".")[-1]


def _axes_of(rows, swept) -> Tuple[Optional[str], List[str]]:
    """The numeric swept key for x (the one with most distinct values) and the categorical keys."""
    # a failed job may have no overrides at all: judge keys by the points that have them
    numeric = [k for k in swept
               if any(k in r["_overrides"] for r in rows)
               and all(_num(r["_overrides"][k]) is not None for r in rows if k in r["_overrides"])]
    x_key = max(numeric, key=lambda k: len({r["_overrides"].get(k) for r in rows})) if numeric else None
    cats = [k for k in swept if k != x_key]
    return x_key, cats


def _val(v: Any) -> str:
    """An override value for a label: sampled floats shortened (5.263881031938146 -> 5.264)."""
    text = str(v)
    if "." in text:
        f = _num(text)
        if f is not None:
            return f"{f:.4g}"
    return text


def _label(row, cats) -> str:
    return ", ".join(f"{_short(k)}={_val(row['_overrides'].get(k))}" for k in cats) or "all points"


def _fmt(v: float) -> str:
    """A number as a person reads it: 2,625 / 31.4 / 0.052."""
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 1:
        return f"{v:.3g}" if a < 10 else f"{v:.1f}"
    return f"{v:.3g}"


def _ordered_labels(rows, cats) -> List[str]:
    out: List[str] = []
    for r in rows:
        lab = _label(r, cats)
        if lab not in out:
            out.append(lab)
    return out


def _context_title(rows) -> str:
    r = next((r for r in rows if r.get("status") == "ok"), rows[0])
    trace = r.get("trace") or "trace"
    model = r.get("model") or r["_overrides"].get("model") or "model"
    hw = r.get("hardware") or r["_overrides"].get("hardware") or "no hardware"
    scale = _num(r.get("time_scale"))
    if scale is not None and scale != 1.0:
        trace += f" (arrival times x{scale:g})"
    return f"{trace}  |  {model} on {hw}"


_METRIC_LABEL = {
    "ttft_p50_ms": ("P50 TTFT", "s", 1e-3), "ttft_p90_ms": ("P90 TTFT", "s", 1e-3),
    "ttft_p99_ms": ("P99 TTFT", "s", 1e-3), "ttft_mean_ms": ("mean TTFT", "s", 1e-3),
    "token_hit_rate": ("token hit rate", "%", 100.0), "block_hit_rate": ("block hit rate", "%", 100.0),
    "prefill_throughput": ("prefill throughput", "tokens/s", 1.0), "host_memory_gb": ("host memory", "GB", 1.0),
}


def _best(rows, metric: str, direction: str):
    ok = [r for r in rows if r.get("status") not in FAILED_STATES and _num(r.get(metric)) is not None]
    if not ok:
        return None
    pick = min if direction == "minimize" else max
    return pick(ok, key=lambda r: _num(r.get(metric)))


def _series(rows, x_key, cats):
    """{label: [(x, row), ...]} sorted by x; x is the row index when no numeric key is swept."""
    groups: Dict[str, List[Tuple[float, Dict[str, Any]]]] = {}
    for i, r in enumerate(rows):
        x = _num(r["_overrides"].get(x_key)) if x_key else float(i)
        if x is None:       # a job that left no overrides: only counted in the title
            continue
        groups.setdefault(_label(r, cats), []).append((x, r))
    for g in groups.values():
        g.sort(key=lambda t: t[0])
    return groups


def plot_summary(sweep_dir: Path, rows, swept) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x_key, cats = _axes_of(rows, swept)
    objective = next((r.get("objective") for r in rows if r.get("objective")), None)
    direction = next((r.get("objective_direction") for r in rows if r.get("objective_direction")), "minimize")
    has_ttft = any(_num(r.get("ttft_p90_ms")) is not None for r in rows)
    first = objective if objective in _METRIC_LABEL and any(_num(r.get(objective)) is not None for r in rows) \
        else ("ttft_p90_ms" if has_ttft else None)
    panels = ([first] if first and first != "token_hit_rate" else []) + ["token_hit_rate"]
    groups = _series(rows, x_key, cats)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.8), squeeze=False)
    failed = [r for r in rows if r.get("status") in FAILED_STATES]
    headline = ""
    for ax, metric in zip(axes[0], panels):
        name, unit, scale = _METRIC_LABEL.get(metric, (metric, "", 1.0))
        for gi, (label, pts) in enumerate(groups.items()):
            c = colors[gi % len(colors)]
            ok = [(x, _num(r.get(metric))) for x, r in pts
                  if r.get("status") not in FAILED_STATES and _num(r.get(metric)) is not None]
            style = "-o" if len(ok) <= 12 else "o"
            if ok:
                ax.plot([x for x, _ in ok], [y * scale for _, y in ok], style, color=c, label=label, ms=5)
            if metric == "token_hit_rate":
                dev = [(x, _num(r.get("device_hit_rate"))) for x, r in pts
                       if r.get("status") not in FAILED_STATES and _num(r.get("device_hit_rate")) is not None]
                if dev and any(_num(r.get("host_hit_rate")) or _num(r.get("storage_hit_rate")) for _, r in pts):
                    ax.plot([x for x, _ in dev], [y * scale for _, y in dev], "--", color=c, alpha=0.8, lw=1.2)
            bad = [(x, r) for x, r in pts if r.get("status") in FAILED_STATES]
            for x, r in bad:
                y = _num(r.get(metric))
                if y is not None:      # infeasible: its value is known, mark it
                    ax.plot([x], [y * scale], "x", color="red", ms=10, mew=2)
                elif x_key:
                    ax.axvline(x, color="red", alpha=0.2, lw=6)
        if metric != "token_hit_rate" or objective == "token_hit_rate":
            d = direction if metric == objective else ("maximize" if metric in ("token_hit_rate", "prefill_throughput") else "minimize")
            best = _best(rows, metric, d)
            if best is not None:
                bx = _num(best["_overrides"].get(x_key)) if x_key else float(rows.index(best))
                by = _num(best.get(metric)) * scale
                ax.plot([bx], [by], marker="*", ms=18, color="gold", mec="black", zorder=5, ls="none",
                        label=f"best: {_fmt(by)} {unit}")
                if metric == first:
                    headline = f"best {name}: {_fmt(by)} {unit} at {_label(best, swept)}"
        ax.set_title(f"{name} ({'lower' if metric.startswith('ttft') or metric == 'host_memory_gb' else 'higher'} is better)",
                     fontsize=10)
        ax.set_ylabel(f"{name} ({unit})")
        if x_key:
            ax.set_xlabel(x_key)
            xs = sorted({x for pts in groups.values() for x, _ in pts if x is not None})
            if len(xs) <= 10:
                host = _host_by_x(rows, x_key)
                if host:   # the price of each x, when x alone decides it
                    ax.set_xticks(xs, [f"{x:g}\n{host[x]:,.0f} GB host" for x in xs])
                    ax.set_xlabel(f"{x_key} (host memory below each value)")
                else:
                    ax.set_xticks(xs)
        else:
            ax.set_xticks(range(len(rows)), [_label(r, swept) for r in rows], rotation=30, ha="right", fontsize=8)
        if metric == "token_hit_rate":
            ax.set_ylim(bottom=0)
            if any(_num(r.get("host_hit_rate")) or _num(r.get("storage_hit_rate")) for r in rows):
                ax.plot([], [], "k-", label="all tiers")
                ax.plot([], [], "k--", label="device only")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    title = _context_title(rows) + f"  |  {len(rows)} points"
    if failed:
        title += f", {len(failed)} failed or infeasible (red: x = over budget, band = failed; see failed.csv)"
    if headline:
        title += "\n" + headline
    loads = [_num(r.get("offered_load")) for r in rows if r.get("status") not in FAILED_STATES]
    loads = [x for x in loads if x is not None]
    if loads and max(loads) > 1.0:
        scale = math.ceil(max(loads) * 1.25 * 10) / 10 * _num(rows[0].get("time_scale") or 1.0)
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
        x, h = _num(r["_overrides"].get(x_key)), _num(r.get("host_memory_gb"))
        if x is None or h is None:
            return None
        seen.setdefault(x, set()).add(round(h, 3))
    if any(len(v) != 1 for v in seen.values()) or len({next(iter(v)) for v in seen.values()}) < 2:
        return None
    return {x: next(iter(v)) for x, v in seen.items()}


def pareto_front(points: Sequence[Tuple[float, float]]) -> List[int]:
    """Indices of points no other point beats on both coordinates (lower is better on both)."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front, best_y = [], math.inf
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def plot_pareto(sweep_dir: Path, rows, swept) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.get("status") in ("ok", "infeasible")
          and _num(r.get("host_memory_gb")) is not None and _num(r.get("ttft_p90_ms")) is not None]
    if not ok:
        return
    x_key, cats = _axes_of(rows, swept)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = _ordered_labels(rows, cats)
    for r in ok:
        c = colors[labels.index(_label(r, cats)) % len(colors)]
        if r["status"] == "ok":
            ax.plot(r["host_memory_gb"], r["ttft_p90_ms"] / 1000, "o", color=c)
        else:
            ax.plot(r["host_memory_gb"], r["ttft_p90_ms"] / 1000, "x", color="red", ms=9)
    shown = {_label(r, cats) for r in ok if r["status"] == "ok"}
    for lab in labels:
        if lab in shown:
            ax.plot([], [], "o", color=colors[labels.index(lab) % len(colors)], label=lab)
    feasible = [r for r in ok if r["status"] == "ok"]
    idx = pareto_front([(r["host_memory_gb"], r["ttft_p90_ms"]) for r in feasible])
    front = [feasible[i] for i in idx]
    if front:
        ax.step([r["host_memory_gb"] for r in front], [r["ttft_p90_ms"] / 1000 for r in front], "k--",
                where="post", lw=1, label="Pareto front (no point is better on both)")
        for i, r in enumerate(front):     # labels alternate above and below the line
            txt = ", ".join(_val(r["_overrides"].get(k)) for k in swept)
            ax.annotate(txt, (r["host_memory_gb"], r["ttft_p90_ms"] / 1000), textcoords="offset points",
                        xytext=(6, 4 if i % 2 == 0 else -12), fontsize=8)
    budget = next((_num(r["_overrides"].get("job.max_host_memory_gb")) for r in rows
                   if _num(r["_overrides"].get("job.max_host_memory_gb")) is not None), None)
    if budget is not None:
        ax.axvline(budget, color="red", ls=":", lw=1, label=f"host-memory budget ({_fmt(budget)} GB)")
    if any(r["status"] == "infeasible" for r in ok):
        ax.plot([], [], "x", color="red", label="over the host-memory budget")
    if front and swept:
        ax.plot([], [], " ", label="labels: " + ", ".join(_short(k) for k in swept))
    ax.set_xlabel("host memory for the KV tier (GB)")
    ax.set_ylabel("P90 TTFT (s)")
    ax.set_title(f"memory vs latency  |  {_context_title(rows)}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, sweep_dir / "pareto.png")
    plt.close(fig)


def _save(fig, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="png", dpi=110)
    tmp.replace(path)
