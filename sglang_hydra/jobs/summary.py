"""Sweep summary: a table (summary.csv, failed.csv) and plots a person reads in ten seconds.

Each job writes ``metrics.json`` into its own output directory (and a failed job leaves
``error.json``), so the summary works with every launcher (basic, joblib, submitit, ray)
and sweeper (grid, Optuna): at the end of the sweep the callback reads them back.

``metrics.json`` is read by leaf name: the nested, versioned schema (``schema_version`` 2:
groups such as ``latency`` and ``throughput`` whose leaves are unique and carry their unit,
``ttft_p90_ms``, ``tokens_per_s_per_gpu``), the flat figures of ``job=estimate`` and the
flat metrics of older runs all give the same columns.  The point's settings come from its
overrides (``.hydra/overrides.yaml``) and have columns of their own: a setting never
overwrites a result (a result whose name is also a setting's is written as ``result.<name>``).

* ``summary.csv``: one row per point: ``run``, ``status``, every swept key, then the
  objective and the key results (units in the column names), then every other figure.
* ``failed.csv``: the points that failed, broke a constraint or were cut off by an
  interrupt, with the reason; always written (just its header when nothing failed).
* ``best_config.yaml``: the best point by ``job.objective``, in the ``--config`` format.
  A ``saturated`` point (the engine cannot keep up, so its latency is backlog that grows
  with the trace) or one that rejected requests is never the best while any point is ``ok``.
* ``summary.png``: one panel per key result against the swept numeric key, one line per
  categorical choice, best point starred, saturated points hollow, every axis from zero.
* ``pareto.png``: host memory against P90 TTFT when host memory varies, else tokens/s per
  user against tokens/s per GPU, with the Pareto front.
"""
from __future__ import annotations

import csv
import functools
import io
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.experimental.callback import Callback

from ..config.objectives import MINIMIZE, OBJECTIVES
from .context import atomic_write

#: results that come first in summary.csv, in this order (those no point has are left out)
LEAD_METRICS = ("objective", "objective_value",
                "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_unloaded_p90_ms", "ttft_ms",
                "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "tpot_ms", "itl_p90_ms", "e2e_p90_ms",
                "tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "goodput_rps_per_gpu",
                "requests_per_s", "requests_total", "requests_completed", "rejected_requests",
                "token_hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate",
                "device_hit_tokens", "host_hit_tokens", "storage_hit_tokens", "device_capacity_tokens",
                "host_memory_gb", "ttft_mean_ms", "host_memory_bytes", "engine_busy_share")
#: a point with results that must not be compared as if it were ok
DEGRADED_STATES = ("saturated", "rejected")
#: statuses of points that did not give a result (listed in failed.csv, marked in the plots);
#: ``no_objective`` points (no TTFT without hardware figures) still have their hit rates
FAILED_STATES = ("failed", "infeasible", "interrupted")
#: columns of failed.csv
FAILED_COLUMNS = ("run", "status", "exit_code", "error", "overrides")
#: overrides that describe the setting rather than a swept dimension
_CONTEXT_KEYS = ("model", "hardware", "job", "job.trace", "hydra/launcher", "hydra/sweeper")
#: row keys that are not results
_RESERVED = ("run", "status", "error", "exit_code", "status_reason")
#: metric groups that are not results (the point's settings as the job saw them)
_NOT_RESULTS = ("settings",)


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
            write_summary(sweep_dir, report=True)
        except Exception as exc:  # noqa: BLE001 - a broken plot must not hide the sweep's results
            print(f"sglang-hydra: could not write the sweep summary in {sweep_dir}: {exc}", file=sys.stderr)


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
    status = None
    try:
        metrics = json.loads((job_dir / "metrics.json").read_text())
        status = metrics.get("status")
    except (OSError, ValueError, AttributeError):
        metrics = None
    if ok and status != "saturated":
        return False
    # a saturated point's latency is backlog that grows with the trace: the study must not
    # compare it with an ok point's.  (A point that rejected requests keeps its value: its
    # figures cover the requests it served, and when every point rejects the same requests
    # failing them all would end the study with nothing.)
    reason = "the job returned no objective value"
    if metrics is not None:
        reason = f"{status}: {metrics.get('status_reason') or 'see its metrics.json'}"
    else:
        try:
            reason = json.loads((job_dir / "error.json").read_text()).get("error", reason)
        except (OSError, ValueError):
            pass
    job_return.status = JobStatus.FAILED
    job_return.return_value = RuntimeError(f"trial failed ({reason})")
    return True


# ----------------------------------------------------------------------------- reading the points
def _flatten_by_leaf(data: Dict[str, Any]) -> Dict[str, Any]:
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
    data = {k: v for k, v in data.items() if k not in _NOT_RESULTS}
    if int(_num(data.get("schema_version")) or 1) >= 2:
        data, whole = _without_dict_leaves(data)
        try:     # the replay's own flattening, where it has one
            from ..workload.metrics import flatten_metrics as replay_flatten
        except ImportError:
            replay_flatten = _flatten_by_leaf
        try:
            flat = dict(replay_flatten(data))
        except ValueError:   # a leaf named twice: keep the first rather than lose the point
            flat = _flatten_by_leaf(data)
        flat.update(whole)
    else:
        flat = dict(data)
    return {k: v for k, v in flat.items() if "." not in str(k) and k not in _NOT_RESULTS}


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


@functools.lru_cache(maxsize=512)
def _yaml_file(path: str, mtime_ns: int) -> Any:
    from ..config.presets import yaml_load
    try:
        return yaml_load(Path(path)) or {}
    except Exception:  # noqa: BLE001 - a point's saved config is context, never fatal
        return {}


def _saved(job_dir: Path, name: str) -> Dict[str, Any]:
    """A point's saved Hydra file (``config.yaml``, ``hydra.yaml``), read once per change."""
    p = job_dir / ".hydra" / name
    try:
        data = _yaml_file(str(p), p.stat().st_mtime_ns)
    except OSError:
        return {}
    return data if isinstance(data, dict) else {}


def _job_setting(job_dir: Path, key: str) -> Any:
    job = _saved(job_dir, "config.yaml").get("job") or {}
    return job.get(key) if isinstance(job, dict) else None


def collect(sweep_dir: Path, *, interrupted: bool = False) -> Tuple[List[Dict[str, Any]], List[str]]:
    """One dict per job dir (its results, status and, under ``_overrides``, its settings) and
    the swept keys.  ``interrupted``: a point with neither metrics nor an error was cut off."""
    rows: List[Dict[str, Any]] = []
    for d in _job_dirs(sweep_dir):
        ovs = _split(_overrides_list(d))
        row: Dict[str, Any] = {"run": d.name}
        if (d / "metrics.json").is_file():
            try:
                row.update({k: v for k, v in flatten_metrics(json.loads((d / "metrics.json").read_text())).items()
                            if k not in ("run", "error", "exit_code")})
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
            if _num(row.get("objective_value")) is None and _num(row.get(row["objective"])) is not None:
                row["objective_value"] = _num(row.get(row["objective"]))
        row["_overrides"] = ovs
        row["_dir"] = d
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


def table_columns(rows, swept) -> Tuple[List[str], Dict[str, str]]:
    """summary.csv's columns and, for results named like a setting, their column names."""
    metric_keys: List[str] = [k for k in LEAD_METRICS if any(k in r for r in rows)]
    for r in rows:
        for k, v in r.items():
            if (k not in _RESERVED and not k.startswith("_") and k not in metric_keys
                    and not isinstance(v, (dict, list))):
                metric_keys.append(k)
    renamed = {k: f"result.{k}" for k in metric_keys if k in swept}
    cols = ["run", "status"] + list(swept) + [renamed.get(k, k) for k in metric_keys] + ["error"]
    return cols, renamed


def _table_rows(rows, swept, renamed) -> List[Dict[str, Any]]:
    out = []
    for r in rows:
        t = {k: v for k, v in r.items() if not k.startswith("_") and k not in swept}
        for k, new in renamed.items():
            if k in r:
                t[new] = r[k]
        for k in swept:
            t[k] = r["_overrides"].get(k, "")
        out.append(t)
    return out


def write_summary(sweep_dir: Path, *, plots: bool = True, report: bool = False,
                  interrupted: bool = False) -> List[Dict[str, Any]]:
    """Write summary.csv, failed.csv and (``plots``) best_config.yaml, summary.png and
    pareto.png into ``sweep_dir``; ``report`` also prints what a person must know (failed,
    saturated and rejecting points, settings the simulation ignores, the best point)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return []
    rows, swept = collect(sweep_dir, interrupted=interrupted)
    if not rows:
        return rows
    cols, renamed = table_columns(rows, swept)
    atomic_write(sweep_dir / "summary.csv", _csv(_table_rows(rows, swept, renamed), cols))
    failed = [r for r in rows if r["status"] in FAILED_STATES]
    for r in failed:
        r["overrides"] = " ".join(f"{k}={v}" for k, v in r["_overrides"].items())
    atomic_write(sweep_dir / "failed.csv", _csv(failed, list(FAILED_COLUMNS)))
    if not plots:
        return rows
    best, note = write_best_config(sweep_dir, rows)
    written = ["summary.csv", "failed.csv"] + (["best_config.yaml"] if best is not None else [])
    try:
        if _has_replay_figures(rows):
            plot_summary(sweep_dir, rows, swept)
            if (sweep_dir / "summary.png").exists():
                written.append("summary.png")
            if plot_pareto(sweep_dir, rows, swept):
                written.append("pareto.png")
        else:     # resolve/plan sweeps: the table is the answer; an empty chart is not
            (sweep_dir / "summary.png").unlink(missing_ok=True)
    except ImportError:  # matplotlib missing: the tables are still there
        pass
    if report:
        for line in report_lines(rows, swept, best, note):
            print(line)
        for line in not_modelled_warnings(rows, swept):
            print(line, file=sys.stderr)
        print(f"wrote {', '.join(written)} in {sweep_dir}")
    return rows


def _has_replay_figures(rows) -> bool:
    """True when some point has a figure the plots show (hit rates, TTFT, throughput)."""
    return any(_num(r.get(k)) is not None for r in rows
               for k in ("token_hit_rate", "ttft_p90_ms", "ttft_ms", "tokens_per_s_per_gpu"))


def _value(text: str) -> Any:
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


# ----------------------------------------------------------------------------- the best point
def _objective_of(rows) -> Tuple[Optional[str], str]:
    objective = next((r.get("objective") for r in rows if r.get("objective")), None)
    direction = next((r.get("objective_direction") for r in rows if r.get("objective_direction")),
                     OBJECTIVES.get(objective or "", MINIMIZE))
    return objective, direction


def pick_best(rows, objective: str, direction: str) -> Tuple[Optional[Dict[str, Any]], str]:
    """The best point by ``objective`` and a note on how it was picked.

    Only ``ok`` points compete while any has a value; when none has, saturated or rejecting
    points are compared, and the note says so (their latency is backlog, not the setting's).
    Failed and infeasible points never win."""
    best = _best([r for r in rows if r.get("status") not in FAILED_STATES + DEGRADED_STATES], objective, direction)
    if best is not None:
        return best, ""
    best = _best([r for r in rows if r.get("status") in DEGRADED_STATES], objective, direction)
    if best is not None:
        return best, (f"no point is ok: the best is picked among {best['status']} points, whose {objective} "
                      "reflects the backlog or the rejected requests, not just the settings")
    why = sorted({str(r.get("error") or r.get("status_reason") or "") for r in rows if r.get("error")
                  or r.get("status_reason")})
    produced = any(_num(r.get(objective)) is not None for r in rows)
    head = (f"every point with {objective} failed or broke a constraint" if produced
            else f"no point produced {objective}")
    return None, head + (f" ({why[0]})" if why else "")


def write_best_config(sweep_dir: Path, rows) -> Tuple[Optional[Dict[str, Any]], str]:
    """``best_config.yaml``: the best point's settings, in the form ``--config FILE`` reads.

    Group choices (``model: llama3_8b``) and dotted settings (``memory.hicache_ratio: 4``)
    come from the point's overrides; ``job.*`` settings are listed as comments (they belong
    to the job, not to the server).  Returns (the best row or None, a note)."""
    objective, direction = _objective_of(rows)
    if not objective:
        return None, "the points name no objective"
    best, note = pick_best(rows, objective, direction)
    if best is None:
        return None, note
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
            f"{_fmt(float(best.get(objective)))} (run {best['run']}, {best['status']})."]
    if note:
        head.append(f"# Note: {note}.")
    head.append("# Use it with: sglang-hydra --config best_config.yaml [job=... overrides]")
    head += _policy_lines(settings.get("memory.radix_eviction_policy"))
    if job_lines:
        head.append("# The sweep also set these job settings:")
        head += job_lines
    text = "\n".join(head) + "\n" + (yaml.safe_dump(ordered, sort_keys=False) if ordered else "{}\n")
    atomic_write(sweep_dir / "best_config.yaml", text)
    return best, note


def _policy_lines(policy) -> List[str]:
    """What a server needs for the best point's eviction policy (issue 20): nothing for SGLang's
    own, sglang-hydra's engine plugin for ours, and a warning for a replay-only one."""
    if not isinstance(policy, str) or not policy:
        return []
    from ..cache.policies import SGLANG_BUILTIN_POLICIES, policy_needs_plugin, policy_runs_in_sglang
    from ..cache.sglang_plugin import PLUGIN_NAME
    if policy in SGLANG_BUILTIN_POLICIES:
        return []
    if policy_needs_plugin(policy):
        return [f"# Needs the plugin: memory.radix_eviction_policy={policy} runs in SGLang 0.5.23 only with "
                f"sglang-hydra's engine plugin ({PLUGIN_NAME}) installed beside it on every server: "
                "python -m pip install --no-deps sglang-hydra"]
    if not policy_runs_in_sglang(policy):
        return [f"# Replay-only: memory.radix_eviction_policy={policy} is not a policy SGLang can run, "
                "even with sglang-hydra's engine plugin; job=launch refuses it"]
    return []


def _settings_text(row, keys=None) -> str:
    """``key=value ...`` of a point: the given keys, or its server settings (not job.*, hydra*)."""
    items = [(k, v) for k, v in row["_overrides"].items()
             if (k in keys if keys is not None else not k.startswith(("job", "hydra")))]
    return " ".join(f"{k}={_val(v)}" for k, v in items) or "no overrides"


def report_lines(rows, swept, best, note: str) -> List[str]:
    """What the terminal says at the end of a sweep: how many points ended how, which are
    saturated or rejected requests, and the best point."""
    counts: Dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    order = ["ok", "saturated", "rejected", "no_objective", "infeasible", "failed", "interrupted"]
    parts = [f"{counts[s]} {s}" for s in order if s in counts] + \
        [f"{n} {s}" for s, n in counts.items() if s not in order]
    sweep_dir = rows[0]["_dir"].parent
    lines = [f"sweep summary: {len(rows)} points in {sweep_dir}: {', '.join(parts)}"
             + (" (see failed.csv)" if any(r['status'] in FAILED_STATES for r in rows) else "")]
    saturated = [r for r in rows if r["status"] == "saturated"]
    if saturated:
        lines.append(f"  saturated ({len(saturated)}): the engine cannot keep up with the arrivals, so latency "
                     "there is backlog that grows with the trace: "
                     + "; ".join(f"run {r['run']} [{_settings_text(r, swept)}]" for r in saturated[:6])
                     + (" ..." if len(saturated) > 6 else ""))
    rejecting = [r for r in rows if (_num(r.get("rejected_requests")) or 0) > 0 or r["status"] == "rejected"]
    for r in rejecting[:6]:
        total = _num(r.get("requests_total"))
        reasons = r.get("rejected_reasons")
        why = (" (" + ", ".join(f"{k}: {v}" for k, v in reasons.items()) + ")") if isinstance(reasons, dict) \
            and reasons else ""
        n = _num(r.get("rejected_requests"))
        count = f"{int(n):,}" if n is not None else "some"
        lines.append(f"  rejected requests: run {r['run']} [{_settings_text(r, swept)}]: {count}"
                     + (f" of {int(total):,}" if total else "") + why)
    if len(rejecting) > 6:
        lines.append(f"  rejected requests at {len(rejecting) - 6} more points (column rejected_requests)")
    objective, direction = _objective_of(rows)
    if best is not None:
        value = _num(best.get(objective))
        unit = _label_of(objective, rows)
        shown = f"{_fmt(value * unit[2])} {unit[1]}".strip() if value is not None else "?"
        ties = _ties(rows, best, objective)
        tied = f", tied with {ties} other point{'s' if ties > 1 else ''}" if ties else ""
        lines.append(f"  best point by {objective} ({'lower' if direction == MINIMIZE else 'higher'} is better): "
                     f"{shown} at {_settings_text(best, swept or None)} (run {best['run']}{tied}); its settings: "
                     f"{sweep_dir / 'best_config.yaml'}")
        if note:
            lines.append(f"  note: {note}")
    else:
        lines.append(f"  no best point: {note}")
    return lines


def not_modelled_warnings(rows, swept) -> List[str]:
    """One warning per swept key the simulation lists as not modelled (``not_modelled``)."""
    listed = set()
    for r in rows:
        items = r.get("not_modelled")
        if isinstance(items, (list, tuple)):     # "key", "key=value" or "key=value: why"
            listed |= {str(x).split(": ", 1)[0].split("=", 1)[0].strip() for x in items}
    out = []
    for key in swept:
        field = key.split(".")[-1]
        hit = next((x for x in sorted(listed) if x in (key, field) or key.endswith("." + x)), None)
        if hit is None:
            continue
        values = sorted({_val(r["_overrides"].get(key)) for r in rows if key in r["_overrides"]})
        shown = ", ".join(values[:6]) + (f" and {len(values) - 6} more" if len(values) > 6 else "")
        out.append(f"sglang-hydra: warning: the simulation does not model {key} (swept over {shown}): "
                   "its values give the same answer, and any difference between rows comes from the other swept settings")
    return out


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


def _tick(v: float, _pos=None) -> str:
    """An axis tick: 0, 2.5, 10, 1,500 (one style on a whole axis)."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:g}"


def _ties(rows, best, metric: str) -> int:
    """How many other eligible points have exactly the best point's value."""
    v = _num(best.get(metric))
    return sum(1 for r in rows if r is not best and r.get("status") == best.get("status")
               and _num(r.get(metric)) is not None and math.isclose(_num(r.get(metric)), v, rel_tol=1e-9))


def _ordered_labels(rows, cats) -> List[str]:
    out: List[str] = []
    for r in rows:
        lab = _label(r, cats)
        if lab not in out:
            out.append(lab)
    return out


def _context_title(rows) -> str:
    """``trace | model on hardware``, from the point's results or else its saved config
    (the parts a point does not say are left out)."""
    r = next((r for r in rows if r.get("status") == "ok"), rows[0])
    d = r.get("_dir")
    choices = ((_saved(d, "hydra.yaml").get("hydra") or {}).get("runtime") or {}).get("choices") or {} if d else {}
    job = (_saved(d, "config.yaml").get("job") or {}) if d else {}
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
        scales = {_num(x.get("time_scale")) for x in rows if x.get("status") not in FAILED_STATES}
        scale = _num(r.get("time_scale")) if len(scales) == 1 else None     # a swept scale is on the x axis
        parts.append(trace + (f" (arrival times x{scale:g})" if scale is not None and scale != 1.0 else ""))
    if model or hw:
        parts.append(" on ".join(str(x) for x in (model, hw) if x))
    return "  |  ".join(parts) or "sweep"


#: metric -> (name on the chart, unit, factor from the metric's unit to the chart's)
_METRIC_LABEL = {
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


def _label_of(metric: str, rows) -> Tuple[str, str, float]:
    """(name, unit, factor) for a chart or a line: a latency under a second reads in ms."""
    name, unit, scale = _METRIC_LABEL.get(metric, (metric, "", 1.0))
    if unit == "s":
        values = [_num(r.get(metric)) for r in rows if r.get("status") not in FAILED_STATES + DEGRADED_STATES]
        values = [v for v in values if v is not None]
        if values and max(values) < 1000.0:
            return name, "ms", 1.0
    return name, unit, scale


def _direction_of(metric: str, rows) -> str:
    objective, direction = _objective_of(rows)
    return direction if metric == objective else OBJECTIVES.get(metric, MINIMIZE)


def _best(rows, metric: str, direction: str):
    ok = [r for r in rows if r.get("status") not in FAILED_STATES and _num(r.get(metric)) is not None]
    if not ok:
        return None
    pick = min if direction == MINIMIZE else max
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


def _panels(rows) -> List[str]:
    """The key results to draw: the objective, latency, throughput, hit rate (those present)."""
    def has(k):
        return any(_num(r.get(k)) is not None for r in rows if r.get("status") not in FAILED_STATES)
    objective, _ = _objective_of(rows)
    panels = [objective] if objective in _METRIC_LABEL and has(objective) else []
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
    good = [_num(r.get(metric)) for r in rows if r.get("status") not in FAILED_STATES + DEGRADED_STATES]
    bad = [_num(r.get(metric)) for r in rows if r.get("status") in DEGRADED_STATES]
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
    objective, _ = _objective_of(rows)
    panels = _panels(rows)
    if not panels:      # no point has a figure to draw (all failed or infeasible): the tables say why
        (sweep_dir / "summary.png").unlink(missing_ok=True)
        return
    groups = _series(rows, x_key, cats)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.0), squeeze=False)
    failed = [r for r in rows if r.get("status") in FAILED_STATES]
    saturated = [r for r in rows if r.get("status") == "saturated"]
    rejecting = [r for r in rows if (_num(r.get("rejected_requests")) or 0) > 0 or r.get("status") == "rejected"]
    headline = ""
    for ax, metric in zip(axes[0], panels):
        name, unit, scale = _label_of(metric, rows)
        top = _clip_top(rows, metric, scale)
        for gi, (label, pts) in enumerate(groups.items()):
            c = colors[gi % len(colors)]
            ok = [(x, _num(r.get(metric)), r) for x, r in pts
                  if r.get("status") not in FAILED_STATES and _num(r.get(metric)) is not None]
            style = "-" if len(ok) <= 12 else ""
            if ok:
                ax.plot([x for x, _, _ in ok], [y * scale for _, y, _ in ok], style, color=c, label=label, lw=1.5)
                marks: Dict[Tuple[str, bool], List[Tuple[float, float]]] = {}
                for x, y, r in ok:    # ok points filled; saturated or rejecting points hollow
                    degraded = r.get("status") in DEGRADED_STATES or (_num(r.get("rejected_requests")) or 0) > 0
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
                        notes.append("saturated" + (f": {_fmt(y * scale)} {unit} (off the scale)" if off else ""))
                    if (_num(r.get("rejected_requests")) or 0) > 0:
                        notes.append(f"{int(_num(r.get('rejected_requests'))):,} rejected")
                    if notes:
                        ax.annotate(", ".join(notes), (x, min(y * scale, top * 0.97) if off else y * scale),
                                    textcoords="offset points", xytext=(5, -10 if off else 5), fontsize=7,
                                    color="0.3")
            if metric == "token_hit_rate":
                dev = [(x, _num(r.get("device_hit_rate"))) for x, r in pts
                       if r.get("status") not in FAILED_STATES and _num(r.get("device_hit_rate")) is not None]
                if dev and any(_num(r.get("host_hit_rate")) or _num(r.get("storage_hit_rate")) for _, r in pts):
                    ax.plot([x for x, _ in dev], [y * scale for _, y in dev], "--", color=c, alpha=0.8, lw=1.2)
            for x, r in [(x, r) for x, r in pts if r.get("status") in FAILED_STATES]:
                y = _num(r.get(metric))
                if y is not None:      # infeasible: its value is known, mark it
                    ax.plot([x], [y * scale], "x", color="red", ms=10, mew=2)
                elif x_key:
                    ax.axvline(x, color="red", alpha=0.2, lw=6)
        if metric != "token_hit_rate" or objective == "token_hit_rate":
            best, _note = pick_best(rows, metric, _direction_of(metric, rows))
            if best is not None:
                bx = _num(best["_overrides"].get(x_key)) if x_key else float(rows.index(best))
                by = _num(best.get(metric)) * scale
                ax.plot([bx], [by], marker="*", ms=18, color="gold", mec="black", zorder=5, ls="none",
                        label=f"best: {_fmt(by)} {unit}")
                if metric == panels[0]:
                    ties = _ties(rows, best, metric)
                    if ties and ties + 1 == len([r for r in rows if r.get("status") == best.get("status")]):
                        headline = (f"every point gives the same {name} ({_fmt(by)} {unit}): the swept settings "
                                    "make no difference to it here")
                    else:
                        headline = f"best {name}: {_fmt(by)} {unit} at {_label(best, swept)}"
                        if ties:
                            headline += f" (tied with {ties} other point{'s' if ties > 1 else ''})"
                    if best.get("status") != "ok":
                        headline += f" ({best['status']}: no point is ok)"
        better = "lower" if _direction_of(metric, rows) == MINIMIZE else "higher"
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
                    ax.set_xticks(xs, [f"{_val(x)}\n{host[x]:,.0f} GB host" for x in xs], fontsize=8)
                    ax.set_xlabel(f"{x_key} (host memory below each value)")
                else:
                    ax.set_xticks(xs, [_val(x) for x in xs], fontsize=9)
        else:
            ax.set_xticks(range(len(rows)), [_label(r, swept)[:40] for r in rows], rotation=30, ha="right",
                          fontsize=8)
            ax.set_xlim(-0.5, len(rows) - 0.5)       # categories: no point sits on the frame
        ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_tick))
        if metric == "token_hit_rate":
            if any(_num(r.get("host_hit_rate")) or _num(r.get("storage_hit_rate")) for r in rows):
                ax.plot([], [], "k-", label="all tiers")
                ax.plot([], [], "k--", label="device only")
        if saturated or rejecting:
            ax.plot([], [], "o", color="0.4", mfc="white", mew=1.5, label="hollow: saturated / rejected requests")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    title = _context_title(rows) + f"  |  {len(rows)} points"
    if failed:
        title += f", {len(failed)} failed or infeasible (red: x = over budget, band = failed; see failed.csv)"
    if saturated:
        title += (f"\n{len(saturated)} saturated (hollow): the engine cannot keep up there, so their latency is "
                  "backlog that grows with the trace")
    if rejecting:
        total = sum(int(_num(r.get("rejected_requests")) or 0) for r in rejecting)
        title += (f"\n{len(rejecting)} point{'s' if len(rejecting) > 1 else ''} rejected requests ({total:,} in all; "
                  "column rejected_requests)")
    if headline:
        title += "\n" + headline
    loads = [_num(r.get("offered_load")) for r in rows if r.get("status") not in FAILED_STATES]
    loads = [x for x in loads if x is not None]
    if loads and max(loads) > 1.0:
        scale = math.ceil(max(loads) * 1.25 * 10) / 10 * (_num(rows[0].get("time_scale")) or 1.0)
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
    host = {round(_num(r.get("host_memory_gb")), 6) for r in usable if _num(r.get("host_memory_gb")) is not None}
    if len(host) > 1 and any(_num(r.get("ttft_p90_ms")) is not None for r in usable):
        return "host_memory_gb", "ttft_p90_ms"
    if any(_num(r.get("tokens_per_s_per_gpu")) is not None and _num(r.get("tokens_per_s_per_user")) is not None
           for r in usable):
        return "tokens_per_s_per_gpu", "tokens_per_s_per_user"
    if host and any(_num(r.get("ttft_p90_ms")) is not None for r in usable):
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
    xname, xunit, xs = _METRIC_LABEL[xm]
    yname, yunit, ys = _METRIC_LABEL[ym]
    dirs = (OBJECTIVES.get(xm, MINIMIZE), OBJECTIVES.get(ym, MINIMIZE))
    pts = [r for r in rows if r.get("status") in ("ok", "infeasible", "no_objective") + DEGRADED_STATES
           and _num(r.get(xm)) is not None and _num(r.get(ym)) is not None]
    x_key, cats = _axes_of(rows, swept)
    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = _ordered_labels(rows, cats)
    kinds: Dict[Tuple[str, str], List[Tuple[float, float]]] = {}
    for r in pts:     # one artist per label and kind keeps drawing fast
        kind = "infeasible" if r["status"] == "infeasible" else ("hollow" if r["status"] in DEGRADED_STATES else "ok")
        kinds.setdefault((_label(r, cats), kind), []).append((_num(r[xm]) * xs, _num(r[ym]) * ys))
    for (lab, kind), xy in kinds.items():
        c = colors[labels.index(lab) % len(colors)]
        if kind == "infeasible":
            ax.plot([p[0] for p in xy], [p[1] for p in xy], "x", ls="none", color="red", ms=9)
        else:
            ax.plot([p[0] for p in xy], [p[1] for p in xy], "o", ls="none", color=c,
                    mfc="white" if kind == "hollow" else c, mew=1.5)
    shown = {_label(r, cats) for r in pts if r["status"] != "infeasible"}
    for lab in labels:
        if lab in shown:
            ax.plot([], [], "o", color=colors[labels.index(lab) % len(colors)], label=lab)
    feasible = [r for r in pts if r["status"] not in ("infeasible",) + DEGRADED_STATES]
    idx = pareto_front([(_num(r[xm]), _num(r[ym])) for r in feasible], dirs)
    front = sorted((feasible[i] for i in idx), key=lambda r: _num(r[xm]))
    if front:
        where = "post" if dirs == (MINIMIZE, MINIMIZE) else "pre"
        ax.step([_num(r[xm]) * xs for r in front], [_num(r[ym]) * ys for r in front], "k--", where=where, lw=1,
                label="Pareto front (no point is better on both)")
        for i, r in enumerate(front):     # labels alternate above and below the line
            txt = ", ".join(_val(r["_overrides"].get(k)) for k in swept)
            ax.annotate(txt, (_num(r[xm]) * xs, _num(r[ym]) * ys), textcoords="offset points",
                        xytext=(6, 4 if i % 2 == 0 else -12), fontsize=8)
    budget = next((_num(r["_overrides"].get("job.max_host_memory_gb")) for r in rows
                   if _num(r["_overrides"].get("job.max_host_memory_gb")) is not None), None)
    if budget is not None and xm == "host_memory_gb":
        ax.axvline(budget, color="red", ls=":", lw=1, label=f"host-memory budget ({_fmt(budget)} GB)")
    if any(r["status"] == "infeasible" for r in pts):
        ax.plot([], [], "x", color="red", label="over the host-memory budget")
    if any(r["status"] in DEGRADED_STATES for r in pts):
        ax.plot([], [], "o", color="0.4", mfc="white", mew=1.5, label="saturated / rejected requests (off the front)")
    if front and swept:
        ax.plot([], [], " ", label="labels: " + ", ".join(_short(k) for k in swept))
    ax.set_xlabel(f"{xname} ({xunit})")
    ax.set_ylabel(f"{yname} ({yunit})")
    # room above and to the right of the highest points for their labels and the legend
    ax.set_xlim(left=0, right=ax.dataLim.x1 * 1.15 if ax.dataLim.x1 > 0 else None)
    ax.set_ylim(bottom=0, top=ax.dataLim.y1 * 1.3 if ax.dataLim.y1 > 0 else None)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(_tick))
    what = "memory vs latency" if xm == "host_memory_gb" else "throughput per GPU vs speed per user"
    ax.set_title(_wrap(f"{what}  |  {_context_title(rows)}", fig), fontsize=10)
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
