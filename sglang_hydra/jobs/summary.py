"""Sweep summary: the table (``summary.csv``, ``failed.csv``), the best point's settings
(``best_config.yaml``) and what the terminal says at the end of a sweep.

The points are read by :mod:`.sweep_points`, the charts drawn by :mod:`.summary_plots`; every
column is documented in ``docs/outputs.md``.

* ``summary.csv``: one row per point: ``run``, ``status``, every swept key (the setting as
  given), then the objective's name and the key results (units in the column names), then every
  other figure.  A quantity has one column: a result that only echoes a swept setting
  (``page_size`` when ``schedule.page_size`` is swept) is left out, and a result named exactly
  like a setting is written as ``result.<name>``.
* ``failed.csv``: the points that failed, broke a constraint or were cut off by an interrupt
  (started and not finished), with the reason; always written (just its header when nothing failed).
* ``best_config.yaml``: the best point by ``job.objective``, in the ``--config`` format.
  A ``saturated`` point (the engine cannot keep up, so its latency is backlog that grows
  with the trace) or one that rejected requests is never the best while any point is ``ok``.
"""
from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hydra.experimental.callback import Callback

from ..config.objectives import MINIMIZE
from ..utils.numbers import fmt_number
from .context import atomic_write
from .sweep_points import (FAILED_STATES, collect, flatten_metrics, metric_label, number,
                           objective_of, pick_best, tied_points, value_text)

__all__ = ["SweepSummary", "mark_failed_trial", "write_summary", "write_best_config", "table_columns",
           "report_lines", "not_modelled_warnings", "flatten_metrics", "pick_best"]

#: results that come first in summary.csv, in this order (those no point has are left out)
LEAD_METRICS = ("objective",
                "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "ttft_unloaded_p90_ms", "ttft_ms",
                "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "tpot_ms", "itl_p90_ms", "e2e_p90_ms",
                "tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "goodput_rps_per_gpu",
                "requests_per_s", "requests_total", "requests_completed", "rejected_requests",
                "token_hit_rate", "device_hit_rate", "host_hit_rate", "storage_hit_rate",
                "device_hit_tokens", "host_hit_tokens", "storage_hit_tokens", "device_capacity_tokens",
                "host_memory_gb", "ttft_mean_ms", "engine_busy_share")
#: columns of failed.csv
FAILED_COLUMNS = ("run", "status", "exit_code", "error", "overrides")
#: row keys that are not results
_RESERVED = ("run", "status", "error", "exit_code", "status_reason")


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


# ----------------------------------------------------------------------------- the table
#: result leaves (``deployment`` group, ``sla_*``) that echo a setting: leaf -> the settings it
#: echoes, as a full key (``deploy.workers``) or a field name any namespace may hold (``page_size``
#: for ``schedule.page_size``).  ``prefill_<leaf>`` / ``decode_<leaf>`` echo that side's setting
#: (``prefill.schedule.page_size``) or the shared one (``schedule.page_size``).
SETTING_ECHOES: Dict[str, Tuple[str, ...]] = {
    "page_size": ("page_size",), "eviction_policy": ("radix_eviction_policy",), "tp_size": ("tp_size",),
    "dp_size": ("dp_size",), "load_balance_method": ("load_balance_method",),
    "max_running_requests": ("max_running_requests",), "chunked_prefill_tokens": ("chunked_prefill_size",),
    "max_prefill_tokens": ("max_prefill_tokens",), "schedule_policy": ("schedule_policy",),
    "mixed_chunk": ("enable_mixed_chunk",), "transfer_backend": ("disaggregation_transfer_backend",),
    "servers": ("deploy.workers",), "prefill_servers": ("deploy.prefill_workers",),
    "decode_servers": ("deploy.decode_workers",), "router_policy": ("deploy.router_policy",),
    "time_scale": ("job.time_scale",), "seed": ("job.seed",), "arrival": ("job.arrival",),
    "cache_semantics": ("job.cache_semantics",), "cache_mode": ("job.mode",),
    "sla_ttft_ms": ("job.sla.ttft_ms",), "sla_tpot_ms": ("job.sla.tpot_ms",),
    "hardware_name": ("hardware",), "model_path": ("model.model_path",), "trace_name": ("job.trace",),
}
_SIDES = ("prefill", "decode")


def echoed_setting(leaf: str, swept: Sequence[str]) -> Optional[str]:
    """The swept key whose value the result ``leaf`` only repeats (None: the leaf is a result)."""
    side, base = None, leaf
    if leaf not in SETTING_ECHOES:
        side = next((s for s in _SIDES if leaf.startswith(s + "_") and leaf[len(s) + 1:] in SETTING_ECHOES), None)
        if side is None:
            return None
        base = leaf[len(side) + 1:]
    for key in swept:
        parts = key.split(".")
        if parts[0] in _SIDES:
            if side != parts[0]:
                continue
            parts = parts[1:]
        for target in SETTING_ECHOES[base]:
            if "." in target or target == "hardware":
                if ".".join(parts) == target:
                    return key
            elif len(parts) == 2 and parts[1] == target:
                return key
    return None


def table_columns(rows, swept) -> Tuple[List[str], Dict[str, str]]:
    """summary.csv's columns and, for results named like a setting, their column names.  A result
    that echoes a swept setting is left out: the swept column holds it (one quantity, one column)."""
    metric_keys: List[str] = [k for k in LEAD_METRICS if any(k in r for r in rows)]
    for r in rows:
        for k, v in r.items():
            if (k not in _RESERVED and not k.startswith("_") and k not in metric_keys
                    and not isinstance(v, (dict, list))):
                metric_keys.append(k)
    metric_keys = [k for k in metric_keys if echoed_setting(k, swept) is None]
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
    for r in failed:
        del r["overrides"]
    if not plots:
        return rows
    best, note = write_best_config(sweep_dir, rows)
    written = ["summary.csv", "failed.csv"] + (["best_config.yaml"] if best is not None else [])
    try:
        if _has_replay_figures(rows):
            from .summary_plots import plot_pareto, plot_summary
            plot_summary(sweep_dir, rows, swept)
            if (sweep_dir / "summary.png").exists():
                written.append("summary.png")
            if plot_pareto(sweep_dir, rows, swept) is not None:
                written.append("pareto.png")
        else:     # resolve/plan sweeps: the table is the answer; an empty chart is not
            (sweep_dir / "summary.png").unlink(missing_ok=True)
    except ImportError:  # matplotlib missing: the tables are still there
        pass
    if report:
        for line in report_lines(rows, swept, best, note):
            print(line)
        for line in not_modelled_warnings(rows, swept) + identical_rows_warnings(rows, swept):
            print(line, file=sys.stderr)
        print(f"wrote {', '.join(written)} in {sweep_dir}")
    return rows


def _has_replay_figures(rows) -> bool:
    """True when some point has a figure the plots show (hit rates, TTFT, throughput)."""
    return any(number(r.get(k)) is not None for r in rows
               for k in ("token_hit_rate", "ttft_p90_ms", "ttft_ms", "tokens_per_s_per_gpu"))


def _value(text: str) -> Any:
    import yaml
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


# ----------------------------------------------------------------------------- the best point
def write_best_config(sweep_dir: Path, rows) -> Tuple[Optional[Dict[str, Any]], str]:
    """``best_config.yaml``: the best point's settings, in the form ``--config FILE`` reads.

    Group choices (``model: llama3_8b``) and dotted settings (``memory.hicache_ratio: 4``)
    come from the point's overrides; ``job.*`` settings are listed as comments (they belong
    to the job, not to the server).  Returns (the best row or None, a note)."""
    objective, direction = objective_of(rows)
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
        values = best.get("_values") or {}
        settings[k] = values[k] if k in values else _value(v)
    ordered = dict(sorted(settings.items(), key=lambda kv: ("." in kv[0], kv[0])))
    head = [f"# Best of {len(rows)} points in {sweep_dir} by {objective} ({direction}): "
            f"{fmt_number(float(best.get(objective)))} (run {best['run']}, {best['status']})."]
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


# ----------------------------------------------------------------------------- the report
def _settings_text(row, keys=None) -> str:
    """``key=value ...`` of a point: the given keys, or its server settings (not job.*, hydra*)."""
    items = [(k, v) for k, v in row["_overrides"].items()
             if (k in keys if keys is not None else not k.startswith(("job", "hydra")))]
    return " ".join(f"{k}={value_text(v)}" for k, v in items) or "no overrides"


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
    rejecting = [r for r in rows if (number(r.get("rejected_requests")) or 0) > 0 or r["status"] == "rejected"]
    for r in rejecting[:6]:
        total = number(r.get("requests_total"))
        reasons = r.get("rejected_reasons")
        why = (" (" + ", ".join(f"{k}: {v}" for k, v in reasons.items()) + ")") if isinstance(reasons, dict) \
            and reasons else ""
        n = number(r.get("rejected_requests"))
        count = f"{int(n):,}" if n is not None else "some"
        lines.append(f"  rejected requests: run {r['run']} [{_settings_text(r, swept)}]: {count}"
                     + (f" of {int(total):,}" if total else "") + why)
    if len(rejecting) > 6:
        lines.append(f"  rejected requests at {len(rejecting) - 6} more points (column rejected_requests)")
    objective, direction = objective_of(rows)
    if best is not None:
        value = number(best.get(objective))
        unit = metric_label(objective, rows)
        shown = f"{fmt_number(value * unit[2])} {unit[1]}".strip() if value is not None else "?"
        ties = tied_points(rows, best, objective)
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
    """One warning per swept key the simulation does not read at all (``not_modelled`` entries
    ``key``, ``key=value`` or ``key=value: not modelled, ...``; an entry with another reason, such
    as a page size below the trace's block, is a partial one: :func:`identical_rows_warnings`)."""
    listed = set()
    for r in rows:
        items = r.get("not_modelled")
        if isinstance(items, (list, tuple)):
            for x in items:
                head, _, why = str(x).partition(": ")
                if not why or why.startswith("not modelled"):
                    listed.add(head.split("=", 1)[0].strip())
    out = []
    for key in swept:
        field = key.split(".")[-1]
        hit = next((x for x in sorted(listed) if x in (key, field) or key.endswith("." + x)), None)
        if hit is None:
            continue
        values = sorted({value_text(r["_overrides"].get(key)) for r in rows if key in r["_overrides"]})
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


#: the results compared to tell whether a swept setting changed anything
COMPARED_RESULTS = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "tpot_p90_ms", "itl_p90_ms", "e2e_p90_ms",
                    "tokens_per_s_per_gpu", "tokens_per_s_per_user", "goodput_rps_per_gpu", "token_hit_rate",
                    "device_hit_rate", "host_hit_rate", "storage_hit_rate", "host_memory_gb", "rejected_requests",
                    "ttft_ms", "tpot_ms")


def identical_rows_warnings(rows, swept) -> List[str]:
    """One warning per swept key whose values gave identical results wherever the other swept
    keys agree (issue 27: ``schedule.page_size=1,64`` gave identical rows without a word), with
    the simulation's reason when ``not_modelled`` gives one.  Keys the simulation does not read at
    all are left to :func:`not_modelled_warnings`."""
    usable = [r for r in rows if r.get("status") not in FAILED_STATES
              and any(number(r.get(m)) is not None for m in COMPARED_RESULTS)]    # rows with figures only
    unread = {k for line in not_modelled_warnings(usable, swept) for k in swept if f" model {k} (" in line}
    reasons: Dict[str, str] = {}
    for r in usable:
        for item in r.get("not_modelled") or ():
            head, _, why = str(item).partition(": ")
            reasons.setdefault(head.split("=", 1)[0].strip(), why)
    out = []
    for key in swept:
        if key in unread:
            continue
        others = [k for k in swept if k != key]
        groups: Dict[Tuple, List[Dict[str, Any]]] = {}
        for r in usable:
            if key in r["_overrides"]:
                groups.setdefault(tuple(r["_overrides"].get(k) for k in others), []).append(r)
        compared = [g for g in groups.values() if len({r["_overrides"][key] for r in g}) > 1]
        if not compared or not all(_same_results(g[0], r) for g in compared for r in g[1:]):
            continue
        values = sorted({value_text(r["_overrides"][key]) for g in compared for r in g})
        why = reasons.get(key, "")
        out.append(f"sglang-hydra: warning: {key}={','.join(values)} gave the same results (latency, throughput, hit "
                   "rates and host memory within 0.1 %, every other swept setting equal)"
                   + (f"; {key} is {why}" if why else ""))
    return out


def _same_results(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    """Every compared result equal within 0.1 % (a pool rounded to whole pages moves host memory
    by less), or missing from both."""
    for m in COMPARED_RESULTS:
        x, y = number(a.get(m)), number(b.get(m))
        if (x is None) != (y is None) or (x is not None and not math.isclose(x, y, rel_tol=1e-3, abs_tol=1e-12)):
            return False
    return True

