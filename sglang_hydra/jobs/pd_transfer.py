"""KV transfer between a prefill and a decode side: ``job=pd`` (one side) and ``job=pd_pair`` (both
sides as separate processes, :mod:`.pd_pair_processes`).

Both write the full result, every request included, to a JSON file in the job's output
directory and print a short summary table. Work that failed is a failure: any failed request,
an error of either side, or a transferred request that should have been checked (checksum or
byte verification on) but was not, ends the job with exit status 1 after printing the count
and the first reasons. An inconsistent pair (e.g. checksums on one side only) is a
configuration error: exit status 2.
"""
from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import List, Sequence, Tuple

from ..config.errors import ConfigError, Problem, problem_for
from ..utils.envflags import EnvValueError
from .context import JobContext

EXIT_FAILED = 1
SHOWN_REASONS = 5


def _fail(what: str, count: int, reasons: Sequence[Tuple[int, str]], extra: Sequence[str] = ()) -> None:
    """Print why the job failed (stderr) and end it with exit status 1."""
    print(f"sglang-hydra: {what}: {count} request(s) failed", file=sys.stderr)
    for room, reason in list(reasons)[:SHOWN_REASONS]:
        print(f"  room {room}: {reason}", file=sys.stderr)
    for line in extra:
        print(f"  {line}", file=sys.stderr)
    raise SystemExit(EXIT_FAILED)


def _env_problem(e: EnvValueError) -> ConfigError:
    return ConfigError([Problem(e.name, None, f"{e.raw!r} is not {e.expected}", "environment")])


def _peer_problem(e) -> ConfigError:
    return ConfigError([problem_for(e.key, str(e), "the prefill peer")])


def run_side(record, job: dict, ctx: JobContext) -> dict:
    from ..disagg import workers
    from ..disagg.decode_side import PeerConfigError
    from .pd_pair_processes import render_rows, side_rows

    mode = record.disaggregation_mode
    try:
        if mode == "prefill":
            res = workers.run_prefill(record, requests=job.get("requests"), pages_per_request=job.get("pages_per_request"),
                                 bootstrap_port=record.disaggregation_bootstrap_port, timeout=job.get("timeout"),
                                 idle_timeout=job.get("idle_timeout"))
        elif mode == "decode":
            if not job.get("prefill"):
                raise ConfigError([Problem("job.prefill", None, "the decode side needs job.prefill=HOST:PORT of the "
                                           "prefill bootstrap server", "pd")])
            res = workers.run_decode(record, prefill_addr=job["prefill"], requests=job.get("requests") or 1,
                                pages_per_request=job.get("pages_per_request", 8), timeout=job.get("timeout"),
                                verify=bool(job.get("verify", True)))
        else:
            raise ConfigError([Problem("disagg.disaggregation_mode", "--disaggregation-mode",
                                       "job=pd needs disagg=prefill or disagg=decode", "pd")])
    except EnvValueError as e:
        raise _env_problem(e) from None
    except PeerConfigError as e:
        raise _peer_problem(e) from None
    out = res.to_dict()
    path = ctx.write_text(f"{mode}.json", json.dumps(out, indent=2, default=str))
    checksum_on = bool(record.disaggregation_enable_kv_checksum)
    verify_on = mode == "decode" and bool(job.get("verify", True)) and res.backend != "fake"
    print(render_rows(side_rows(res, checksum=checksum_on, verify=verify_on) + [("requests written to", str(path))]))
    metrics = {k: v for k, v in out.items() if isinstance(v, (int, float, str, bool))}
    metrics.update(succeeded=res.succeeded, failed=res.failed)
    if ctx.multirun:
        ctx.write_text("metrics.json", json.dumps(metrics))
    problems: List[str] = []
    if res.allocator_error:
        problems.append(f"allocator: {res.allocator_error}")
    if mode == "decode":   # checks that were on must have covered every transferred request
        wanted = [("checksum", checksum_on), ("verified", verify_on)]
        for attr, on in wanted:
            checked = res.check_counts(attr)[1]
            if on and checked < res.succeeded:
                problems.append(f"{res.succeeded - checked} transferred request(s) were not checked ({attr})")
    if res.failed or problems:
        _fail(f"job=pd ({mode})", res.failed, res.first_failures(SHOWN_REASONS), problems)
    return metrics


def run_pair(record, job: dict, ctx: JobContext) -> dict:
    from .pd_pair_processes import run_pair as harness_run_pair

    try:
        res = harness_run_pair(record, requests=job.get("requests", 200),
                               pages_per_request=job.get("pages_per_request", 8),
                               timeout=job.get("timeout", 120.0), verify=job.get("verify", True))
    except EnvValueError as e:
        raise _env_problem(e) from None
    data = asdict(res)
    path = ctx.write_text("pd_pair.json", json.dumps(data, indent=2, default=str))
    metrics = {k: v for k, v in data.items() if isinstance(v, (int, float, str, bool)) or v is None}
    metrics["unchecked"] = res.unchecked
    if job.get("format") == "json":
        print(json.dumps(dict(metrics, failures=res.failures[:SHOWN_REASONS], errors=res.errors,
                              requests_file=str(path)), indent=2, default=str))
    else:
        print(res.summary())
        print(f"requests written to {path}")
    if ctx.multirun:
        ctx.write_text("metrics.json", json.dumps(metrics))
    if not res.ok:
        extra = list(res.errors)
        if res.unchecked:
            extra.append(f"{res.unchecked} transferred request(s) were not checked although checksums or "
                         "verification are on")
        _fail("job=pd_pair", res.failed, res.failures, extra)
    return metrics
