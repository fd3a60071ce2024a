"""``job=plan``: the memory plan for a target machine, without allocating anything.

``sglang-hydra job=plan model=llama3_8b hardware=h100_80gb`` prints what a server with this
record would get on that machine: bytes per token and page, the weights each GPU holds,
the device pool, the host tier and the decode retraction backup, each with the reason for
its size.  Nothing is allocated and, for a hardware preset, torch is not even imported,
so a sweep over machines and settings (``-m hardware=h100_80gb,h200_141gb
memory.hicache_ratio=1,2,4``) runs in about a second per point.

With ``deploy=pd`` it plans both sides (:func:`run_pd`): each side's memory plan (its KV pool on
its own TP), the layout (prefill and decode servers x TP against ``deploy.total_gpus``) and how
many requests of the longest prompt the prefill side accepts the decode pool holds.  A decode
pool that cannot hold one such request is an input problem (exit 2): SGLang's decode server
would never admit it, and the prefill side would hold it forever.
"""
from __future__ import annotations

import json

from ..config.errors import ConfigError, Problem
from .context import JobContext


def _metrics(plan) -> dict:
    d = plan.to_dict()
    keep = ("target", "device_tokens", "device_pages", "device_bytes", "host_tokens", "host_pages", "host_bytes",
            "host_ratio", "bytes_per_token", "bytes_per_page", "page_size", "weights_bytes", "mem_fraction_static",
            "retraction_backup")
    return {k: d.get(k) for k in keep}


def run(record, job: dict, ctx: JobContext) -> dict:
    from ..memory.errors import MemorySetupError
    from ..memory.plan import make_plan
    from .single_engine import data_parallel_problems

    if getattr(record, "servers", None) is not None:        # deploy=pd: a Deployment of both sides
        return run_pd(record, job, ctx)
    problems = data_parallel_problems(record, "plan")
    if problems:
        raise ConfigError(problems)
    try:
        plan = make_plan(record, hardware=ctx.hardware, check_io=False)
    except MemorySetupError as exc:
        raise ConfigError(exc.problems) from None
    except ValueError as exc:  # an unknown weight dtype and the like
        raise ConfigError([Problem("model", None, str(exc), "plan")]) from None
    metrics = _metrics(plan)
    if job.get("format") == "json":
        print(json.dumps(plan.to_dict(), indent=2, default=str))
    else:
        print(plan.render())
    if ctx.multirun:
        ctx.write_text("metrics.json", json.dumps(metrics, default=str))
    return metrics


# --------------------------------------------------------------------------- deploy=pd
def run_pd(deployment, job: dict, ctx: JobContext) -> dict:
    """Both sides of a PD deployment: each side's plan, the GPU layout and the decode pool's
    capacity in requests; ``plan.json`` (and ``metrics.json`` in a sweep) holds the figures."""
    from ..memory.errors import MemorySetupError
    from ..memory.plan import make_plan
    from .single_engine import data_parallel_problems

    sides = {}
    for server in deployment.servers:          # one record per side (servers of a side are alike)
        sides.setdefault(server.role, server.record)
    settings = deployment.settings
    counts = {"prefill": int(settings.prefill_workers), "decode": int(settings.decode_workers)}
    problems: list = []
    plans = {}
    for role, rec in sides.items():
        problems += [Problem(f"{role}.{p.key}", p.flag, p.message, p.source) for p in data_parallel_problems(rec, "plan")]
        try:
            plans[role] = make_plan(rec, hardware=ctx.hardware, check_io=False)
        except MemorySetupError as exc:
            problems += [Problem(f"{role}.{p.key}", p.flag, p.message, p.source) for p in exc.problems]
        except ValueError as exc:
            problems.append(Problem(f"{role}.model", None, str(exc), "plan"))
    if problems:
        raise ConfigError(problems)
    pools = {role: int(getattr(sides[role], "max_total_tokens", None) or plans[role].device_tokens) for role in sides}
    context = _context_limit(sides["prefill"])
    # the longest prompt the prefill server accepts (SGLang: min(context - 1, pool - 1)) plus its first token
    longest = min(context, pools["prefill"]) if context else pools["prefill"]
    dec = sides["decode"]
    if pools["decode"] < longest:
        explicit = getattr(dec, "max_total_tokens", None) is not None
        key = "decode.schedule.max_total_tokens" if explicit else "decode.schedule.mem_fraction_static"
        why = (f"decode.schedule.max_total_tokens {pools['decode']:,}" if explicit else
               f"the decode pool sized on {getattr(ctx.hardware, 'name', 'this machine')} at TP "
               f"{dec.tp_size}: {pools['decode']:,} tokens")
        raise ConfigError([Problem(key, None, f"{why} cannot hold one request: the prefill side accepts prompts up to "
                                   f"{longest - 1:,} tokens (min of model.context_length {context or 'unset'} and its "
                                   f"pool of {pools['prefill']:,}), and the decode server needs {longest:,} tokens for "
                                   f"it; give the decode side more KV memory (decode.parallel.tp_size, "
                                   f"decode.schedule.mem_fraction_static) or lower model.context_length", "plan")])
    gpus = {role: counts[role] * _server_gpus(sides[role]) for role in sides}
    total = settings.total_gpus or getattr(ctx.hardware, "gpus_per_node", None)
    summary = {
        "mode": "disagg", "gpus": gpus["prefill"] + gpus["decode"], "total_gpus": total,
        "longest_request_tokens": longest,
        "decode_requests_held": pools["decode"] // longest,
    }
    for role in ("prefill", "decode"):
        rec, plan = sides[role], plans[role]
        summary.update({f"{role}_workers": counts[role], f"{role}_tp": int(rec.tp_size), f"{role}_gpus": gpus[role],
                        f"{role}_kv_pool_tokens": pools[role]})
        summary.update({f"{role}_{k}": v for k, v in _metrics(plan).items() if k != "target"})
    summary["target"] = plans["prefill"].target
    doc = {"deployment": {k: summary[k] for k in ("mode", "gpus", "total_gpus", "longest_request_tokens",
                                                     "decode_requests_held")},
           "prefill": {"workers": counts["prefill"], "gpus": gpus["prefill"], "plan": plans["prefill"].to_dict()},
           "decode": {"workers": counts["decode"], "gpus": gpus["decode"], "plan": plans["decode"].to_dict()}}
    if job.get("format") == "json":
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(_pd_text(summary, plans, sides))
    if ctx.multirun or ctx.output_dir is not None:      # a sweep point or a run placed by hydra.run.dir
        ctx.write_text("plan.json", json.dumps(doc, indent=2, default=str))
    if ctx.multirun:
        ctx.write_text("metrics.json", json.dumps(summary, default=str))
    return summary


def _server_gpus(record) -> int:
    return max(1, int(record.tp_size)) * max(1, int(getattr(record, "pp_size", 1) or 1)) * \
        max(1, int(getattr(record, "dp_size", 1) or 1))


def _context_limit(record):
    v = getattr(record, "context_length", None) or getattr(record, "max_position_embeddings", None)
    return int(v) if v else None


def _pd_text(summary: dict, plans: dict, sides: dict) -> str:
    total = summary["total_gpus"]
    lines = [f"PD deployment plan on {summary['target']}: {summary['prefill_workers']} prefill x TP{summary['prefill_tp']}"
             f" + {summary['decode_workers']} decode x TP{summary['decode_tp']} = {summary['gpus']} GPUs"
             + (f" of {total}" if total else "")]
    for role in ("prefill", "decode"):
        lines.append(f"  {role}: {summary[f'{role}_workers']} server(s) x {summary[f'{role}_gpus'] // summary[f'{role}_workers']}"
                     f" GPU(s); KV pool {summary[f'{role}_kv_pool_tokens']:,} tokens per server"
                     f" ({summary[f'{role}_device_bytes'] / 2**30:.1f} GiB per GPU)")
    lines.append(f"  decode pool holds {summary['decode_requests_held']:,} request(s) of the longest the prefill side "
                 f"accepts at once ({summary['longest_request_tokens'] - 1:,}-token prompt + its first token)")
    for role in ("prefill", "decode"):
        lines.append(f"\n== {role} server (each of {summary[f'{role}_workers']}) ==")
        lines.append(plans[role].render())
    return "\n".join(lines)
