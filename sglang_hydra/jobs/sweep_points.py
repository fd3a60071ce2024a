"""The points of a sweep: reading each job directory back, and which point is best.

Each job writes ``metrics.json`` into its own output directory (a failed job leaves
``error.json``), so every launcher (basic, joblib, submitit, ray) and sweeper (grid, Optuna)
gives the same points.  ``metrics.json`` is read by leaf name: the nested, versioned schema
(groups such as ``latency`` whose leaves are unique and carry their unit), the flat figures of
``job=estimate`` and the flat metrics of older runs give the same keys.  A point's settings come
from its overrides (``.hydra/overrides.yaml``), with Hydra's quoting removed.

Used by the table and report (:mod:`.summary`) and the charts (:mod:`.summary_plots`).
"""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..config.objectives import MINIMIZE, OBJECTIVES
from .override_values import plain_overrides, typed_overrides

#: a point with results that must not be compared as if it were ok
DEGRADED_STATES = ("saturated", "rejected")
#: statuses of points that did not give a result (listed in failed.csv, marked in the plots);
#: ``no_objective`` points (no TTFT without hardware figures) still have their hit rates
FAILED_STATES = ("failed", "infeasible", "interrupted")
#: overrides that describe the setting rather than a swept dimension
CONTEXT_KEYS = ("model", "hardware", "job", "job.trace", "hydra/launcher", "hydra/sweeper")
#: metric groups that are not results (the point's settings as the job saw them)
NOT_RESULTS = ("settings",)
#: leaves of schema 2 that copied another figure (``objective_value`` = the objective's own leaf,
#: ``host_memory_bytes`` = ``host_memory_gb`` x 1e9): a point of an older sweep reads without them
COPIES = ("objective_value", "host_memory_bytes")


# ----------------------------------------------------------------------------- reading the points
def flatten_by_leaf(data: Dict[str, Any]) -> Dict[str, Any]:
    """Nested metric groups to one level, keyed by leaf name (leaves are unique in schema 2).
    A dict that is one figure (``rejected_reasons``: reason -> count) stays one value."""
    out: Dict[str, Any] = {}

    def walk(node: Dict[str, Any]) -> None:
        for k, v in node.items():
            if isinstance(v, dict) and k not in _DICT_LEAVES:
                walk(v)
            else:
                out.setdefault(k, v)
    walk(data)
    return out


#: leaves of schema 2 whose value is a dict
_DICT_LEAVES = ("rejected_reasons",)


def _without_dict_leaves(data: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the document without its dict-valued leaves, those leaves): a flattening that walks
    into every dict would turn each rejection reason into a column of its own."""
    whole: Dict[str, Any] = {}

    def strip(node: Dict[str, Any]) -> Dict[str, Any]:
        out = {}
        for k, v in node.items():
            if k in _DICT_LEAVES and isinstance(v, dict):
                whole.setdefault(k, v)
            elif isinstance(v, dict):
                out[k] = strip(v)
            else:
                out[k] = v
        return out
    return strip(data), whole


def flatten_metrics(data: Dict[str, Any]) -> Dict[str, Any]:
    """One point's ``metrics.json`` as ``{leaf name: value}``: schema 2 (nested groups), the
    estimate's flat keys and older flat metrics alike.  The point's settings are not results
    (they come from its overrides), nor are dotted keys older metrics copied from them."""
    data = {k: v for k, v in data.items() if k not in NOT_RESULTS}
    if int(number(data.get("schema_version")) or 1) >= 2:
        data, whole = _without_dict_leaves(data)
        try:     # the replay's own flattening, where it has one
            from ..workload.metrics import flatten_metrics as replay_flatten
        except ImportError:
            replay_flatten = flatten_by_leaf
        try:
            flat = dict(replay_flatten(data))
        except ValueError:   # a leaf named twice: keep the first rather than lose the point
            flat = flatten_by_leaf(data)
        flat.update(whole)
    else:
        flat = dict(data)
    return {k: v for k, v in flat.items() if "." not in str(k) and k not in NOT_RESULTS}


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


def job_dirs(sweep_dir: Path, *, interrupted: bool = False) -> List[Path]:
    """The job directories of a sweep, in job order.  After an interrupt a directory the launcher
    made but the job never filled (no ``.hydra`` yet) is a point too: it was cut off."""
    dirs = [p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
            and ((p / "metrics.json").is_file() or (p / "error.json").is_file() or (p / ".hydra").is_dir()
                 or (interrupted and p.name.isdigit()))]
    return sorted(dirs, key=lambda p: (len(p.name), p.name))


@functools.lru_cache(maxsize=512)
def _yaml_file(path: str, mtime_ns: int) -> Any:
    from ..config.presets import yaml_load
    try:
        return yaml_load(Path(path)) or {}
    except Exception:  # noqa: BLE001 - a point's saved config is context, never fatal
        return {}


def saved_file(job_dir: Path, name: str) -> Dict[str, Any]:
    """A point's saved Hydra file (``config.yaml``, ``hydra.yaml``), read once per change."""
    p = job_dir / ".hydra" / name
    try:
        data = _yaml_file(str(p), p.stat().st_mtime_ns)
    except OSError:
        return {}
    return data if isinstance(data, dict) else {}


def _job_setting(job_dir: Path, key: str) -> Any:
    job = saved_file(job_dir, "config.yaml").get("job") or {}
    return job.get(key) if isinstance(job, dict) else None


def collect(sweep_dir: Path, *, interrupted: bool = False) -> Tuple[List[Dict[str, Any]], List[str]]:
    """One dict per job dir (its results, status and, under ``_overrides``, its settings) and
    the swept keys.  ``interrupted``: a point with neither metrics nor an error was cut off."""
    rows: List[Dict[str, Any]] = []
    for d in job_dirs(sweep_dir, interrupted=interrupted):
        given = _overrides_list(d)
        ovs = plain_overrides(given)
        row: Dict[str, Any] = {"run": d.name}
        if (d / "metrics.json").is_file():
            try:
                row.update({k: v for k, v in flatten_metrics(json.loads((d / "metrics.json").read_text())).items()
                            if k not in ("run", "error", "exit_code") + COPIES})
            except ValueError:
                row.update(status="failed", error="unreadable metrics.json")
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
            if interrupted:
                row.update(status="interrupted", error="the sweep was interrupted before this point finished")
            else:
                row.update(status="failed", error="the job left no metrics.json (killed, or it failed before writing)")
        if row.get("status") not in ("ok", "failed") and not row.get("error"):
            row["error"] = row.get("status_reason", "")
        if not row.get("objective") and (d / ".hydra").is_dir():
            objective = _job_setting(d, "objective")
            if objective:
                row["objective"] = str(objective)
        if row.get("objective") in OBJECTIVES:
            row.setdefault("objective_direction", OBJECTIVES[row["objective"]])
        row["_overrides"] = ovs
        row["_values"] = typed_overrides(given)      # what best_config.yaml writes (quoted '1' stays a string)
        row["_dir"] = d
        rows.append(row)
    keys: List[str] = []
    for r in rows:
        for k in r["_overrides"]:
            if k not in keys:
                keys.append(k)
    swept = [k for k in keys if len({r["_overrides"].get(k) for r in rows}) > 1]
    if not swept:
        swept = [k for k in keys if k not in CONTEXT_KEYS] or keys
    return rows, swept


# ----------------------------------------------------------------------------- values and labels
def number(v: Any) -> Optional[float]:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def short_key(key: str) -> str:
    return key.split(".")[-1]


def value_text(v: Any) -> str:
    """An override value for a label: sampled floats shortened (5.263881031938146 -> 5.264)."""
    text = str(v)
    if "." in text:
        f = number(text)
        if f is not None:
            return f"{f:.4g}"
    return text


def point_label(row, cats) -> str:
    return ", ".join(f"{short_key(k)}={value_text(row['_overrides'].get(k))}" for k in cats) or "all points"


def context_title(rows) -> str:
    """``trace | model on hardware``, from the point's results or else its saved config
    (the parts a point does not say are left out)."""
    r = next((r for r in rows if r.get("status") == "ok"), rows[0])
    d = r.get("_dir")
    choices = ((saved_file(d, "hydra.yaml").get("hydra") or {}).get("runtime") or {}).get("choices") or {} if d else {}
    job = (saved_file(d, "config.yaml").get("job") or {}) if d else {}
    trace = r.get("trace") if isinstance(r.get("trace"), str) else None
    if trace is None and isinstance(job, dict) and "trace" in job:
        trace = job.get("trace") or "bundled trace sample"
    model = r.get("model") if isinstance(r.get("model"), str) else None
    model = model or r["_overrides"].get("model") or choices.get("model")
    hw = r.get("hardware") if isinstance(r.get("hardware"), str) else None
    hw = hw or r["_overrides"].get("hardware") or choices.get("hardware")
    parts = []
    if trace:
        trace = Path(str(trace)).name if "/" in str(trace) else str(trace)
        scales = {number(x.get("time_scale")) for x in rows if x.get("status") not in FAILED_STATES}
        scale = number(r.get("time_scale")) if len(scales) == 1 else None     # a swept scale is on the x axis
        parts.append(trace + (f" (arrival times x{scale:g})" if scale is not None and scale != 1.0 else ""))
    if model or hw:
        parts.append(" on ".join(str(x) for x in (model, hw) if x))
    return "  |  ".join(parts) or "sweep"


#: metric -> (name on the chart, unit, factor from the metric's unit to the chart's)
METRIC_LABELS = {
    "ttft_p50_ms": ("P50 TTFT", "s", 1e-3), "ttft_p90_ms": ("P90 TTFT", "s", 1e-3),
    "ttft_p99_ms": ("P99 TTFT", "s", 1e-3), "ttft_mean_ms": ("mean TTFT", "s", 1e-3),
    "ttft_ms": ("TTFT", "s", 1e-3), "ttft_unloaded_p90_ms": ("P90 TTFT, unloaded", "s", 1e-3),
    "tpot_p50_ms": ("P50 TPOT", "ms", 1.0), "tpot_p90_ms": ("P90 TPOT", "ms", 1.0),
    "tpot_p99_ms": ("P99 TPOT", "ms", 1.0), "tpot_ms": ("TPOT", "ms", 1.0),
    "itl_p90_ms": ("P90 inter-token latency", "ms", 1.0), "e2e_p90_ms": ("P90 end-to-end", "s", 1e-3),
    "tokens_per_s": ("throughput", "tokens/s", 1.0), "tokens_per_s_per_gpu": ("throughput per GPU", "tokens/s/GPU", 1.0),
    "tokens_per_s_per_user": ("speed per user", "tokens/s/user", 1.0),
    "goodput_rps_per_gpu": ("SLA goodput per GPU", "requests/s/GPU", 1.0),
    "requests_per_s": ("requests served", "requests/s", 1.0),
    "token_hit_rate": ("token hit rate", "%", 100.0), "host_memory_gb": ("host memory", "GB", 1.0),
}


def metric_label(metric: str, rows) -> Tuple[str, str, float]:
    """(name, unit, factor) for a chart or a line: a latency under a second reads in ms."""
    name, unit, scale = METRIC_LABELS.get(metric, (metric, "", 1.0))
    if unit == "s":
        values = [number(r.get(metric)) for r in rows if r.get("status") not in FAILED_STATES + DEGRADED_STATES]
        values = [v for v in values if v is not None]
        if values and max(values) < 1000.0:
            return name, "ms", 1.0
    return name, unit, scale


# ----------------------------------------------------------------------------- the best point
def objective_of(rows) -> Tuple[Optional[str], str]:
    objective = next((r.get("objective") for r in rows if r.get("objective")), None)
    direction = next((r.get("objective_direction") for r in rows if r.get("objective_direction")),
                     OBJECTIVES.get(objective or "", MINIMIZE))
    return objective, direction


def direction_of(metric: str, rows) -> str:
    objective, direction = objective_of(rows)
    return direction if metric == objective else OBJECTIVES.get(metric, MINIMIZE)


def best_by(rows, metric: str, direction: str):
    ok = [r for r in rows if r.get("status") not in FAILED_STATES and number(r.get(metric)) is not None]
    if not ok:
        return None
    pick = min if direction == MINIMIZE else max
    return pick(ok, key=lambda r: number(r.get(metric)))


def pick_best(rows, objective: str, direction: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """The best point by ``objective`` and a note on how it was picked.

    Only ``ok`` points compete while any has a value; when none has, saturated or rejecting
    points are compared, and the note says so (their latency is backlog, not the setting's).
    Failed and infeasible points never win."""
    best = best_by([r for r in rows if r.get("status") not in FAILED_STATES + DEGRADED_STATES], objective, direction)
    if best is not None:
        return best, ""
    best = best_by([r for r in rows if r.get("status") in DEGRADED_STATES], objective, direction)
    if best is not None:
        return best, (f"no point is ok: the best is picked among {best['status']} points, whose {objective} "
                      "reflects the backlog or the rejected requests, not just the settings")
    why = sorted({str(r.get("error") or r.get("status_reason") or "") for r in rows if r.get("error")
                  or r.get("status_reason")})
    produced = any(number(r.get(objective)) is not None for r in rows)
    head = (f"every point with {objective} failed or broke a constraint" if produced
            else f"no point produced {objective}")
    return None, head + (f" ({why[0]})" if why else "")


def tied_points(rows, best, metric: str) -> int:
    """How many other eligible points have exactly the best point's value."""
    v = number(best.get(metric))
    return sum(1 for r in rows if r is not best and r.get("status") == best.get("status")
               and number(r.get(metric)) is not None and math.isclose(number(r.get(metric)), v, rel_tol=1e-9))
