"""``job=estimate``: one static batch on the target hardware, as a datasheet states it.

``sglang-hydra job=estimate model=llama3_1_8b hardware=h100_80gb parallel.tp_size=2
job.isl=4096 job.osl=512 job.batch_size=64 job.prefix=1024`` answers, without a GPU and in
milliseconds, what one engine (``tp`` GPUs) would do with ``batch_size`` requests that
arrive together: the batch's prefill (chunked as ``schedule.chunked_prefill_size`` says),
then ``osl`` decode steps in lock step.  The times come from the pass-time model
(:mod:`sglang_hydra.perf`), the memory from the same plan ``job=plan`` prints.

Output keys (``job.format=json`` prints exactly these; a sweep writes them to each point's
``metrics.json``, ``memory`` flattened to ``memory_<key>``, with ``status`` and the overrides
that define the point; a point whose batch does not fit the pool is kept with
``status: infeasible`` and its reason, where a single run exits 2):

* ``ttft_ms``: the whole batch's prefill (every request's first token comes with the last chunk);
* ``tpot_ms``: the mean decode step over the ``osl - 1`` steps after it, contexts growing;
* ``tokens_per_s``: output tokens of the batch over its whole time (prefill + decode);
* ``tokens_per_s_per_gpu``: that over the engine's ``tp`` GPUs;
* ``tokens_per_s_per_user``: one request's decode rate, ``1000 / tpot_ms``;
* ``memory``: ``weights_gb`` and ``kv_gb`` per GPU (KV of the batch at its longest),
  ``kv_pool_gb`` and ``kv_pool_tokens`` (the plan's device pool), ``max_batch_size`` (the
  requests of this shape the pool holds) and ``fits``.
"""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

from ..config.errors import ConfigError, Problem
from .context import JobContext

GB = 1e9
KEYS = ("ttft_ms", "tpot_ms", "tokens_per_s", "tokens_per_s_per_gpu", "tokens_per_s_per_user", "memory")


class BatchDoesNotFit(ConfigError):
    """The batch's KV exceeds the plan's pool: bad input for one run, an infeasible point in a sweep."""


def _settings(job: dict) -> List[Problem]:
    problems = []
    for key, low in (("isl", 1), ("osl", 1), ("batch_size", 1)):
        v = job.get(key)
        if not isinstance(v, int) or v < low:
            problems.append(Problem(f"job.{key}", None, f"must be an integer >= {low}, got {v!r}", "estimate"))
    prefix = job.get("prefix")
    isl = job.get("isl")
    if not isinstance(prefix, int) or prefix < 0:
        problems.append(Problem("job.prefix", None, f"must be an integer >= 0 (cached prompt tokens per request), "
                                f"got {prefix!r}", "estimate"))
    elif isinstance(isl, int) and isl >= 1 and prefix >= isl:
        problems.append(Problem("job.prefix", None, f"{prefix} must be below job.isl={isl}: the prompt's last "
                                "token is always computed", "estimate"))
    return problems


def estimate(record, hardware, job: dict) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """(the estimate as a dict of :data:`KEYS`, context for the table); raises ConfigError
    listing every problem of the settings at once."""
    from ..memory.errors import MemorySetupError
    from ..memory.plan import make_plan
    from ..perf import PassModel, PassModelError
    from ..perf.static_batch import static_batch
    from ..workload.assemble import default_chunk_tokens

    from .single_engine import data_parallel_problems

    problems = _settings(job) + data_parallel_problems(record, "estimate")
    model = None
    if hardware is None or getattr(hardware, "is_local", False) and not getattr(hardware, "bf16_tflops", None):
        problems.append(Problem("hardware", None, "job=estimate needs target hardware with its figures; choose a "
                                "preset, e.g. hardware=h100_80gb", "estimate"))
    else:
        try:
            model = PassModel.from_record(record, hardware)
        except PassModelError as exc:
            for part in exc.problems:
                key = part.split(" ", 1)[0].split("=", 1)[0]
                flag = {"parallel.tp_size": "--tp", "parallel.pp_size": "--pp"}.get(key)
                problems.append(Problem(key if "." in key else "model", flag, part, "estimate"))
    if problems:
        raise ConfigError(problems)
    isl, osl, batch, prefix = int(job["isl"]), int(job["osl"]), int(job["batch_size"]), int(job["prefix"])
    limit = int(getattr(record, "context_length", None) or getattr(record, "max_position_embeddings", 0) or 0)
    if limit and isl + osl > limit:
        key = "model.context_length" if getattr(record, "context_length", None) else "model.max_position_embeddings"
        raise ConfigError([Problem("job.isl", None, f"job.isl + job.osl = {isl + osl} exceeds the model's context "
                                   f"({key}={limit}); the server would reject these requests", "estimate")])
    try:
        plan = make_plan(record, hardware=hardware, check_io=False)
    except MemorySetupError as exc:
        raise ConfigError(exc.problems) from None
    except ValueError as exc:
        raise ConfigError([Problem("model", None, str(exc), "estimate")]) from None
    ps = max(1, int(plan.page_size or 1))
    per_seq_tokens = -(-(isl + osl) // ps) * ps            # whole pages
    pool = int(plan.device_tokens)
    max_batch = pool // per_seq_tokens
    if batch > max_batch:
        raise BatchDoesNotFit([Problem("job.batch_size", None, f"{batch} requests of {isl}+{osl} tokens need "
                                   f"{batch * per_seq_tokens:,} KV tokens but the plan's pool on "
                                   f"{plan.target} holds {pool:,}: {max_batch} such requests fit", "estimate")])
    chunk = default_chunk_tokens(record, SimpleNamespace(gpu_memory_gb=float(hardware.gpu_memory_gb or 80.0)))
    r = static_batch(model, isl=isl, osl=osl, batch_size=batch, prefix=prefix, chunk_tokens=chunk)
    total_s = r.request_s
    tokens = batch * osl
    tps = tokens / total_s if total_s > 0 else 0.0
    memory = {
        "weights_gb": model.weight_bytes_per_gpu / GB,
        "kv_gb": batch * per_seq_tokens * plan.bytes_per_token / GB,
        "kv_pool_gb": pool * plan.bytes_per_token / GB,
        "kv_pool_tokens": pool,
        "max_batch_size": max_batch,
        "fits": True,
    }
    return {"ttft_ms": r.ttft_s * 1e3, "tpot_ms": r.tpot_s * 1e3, "tokens_per_s": tps,
            "tokens_per_s_per_gpu": tps / model.tp, "tokens_per_s_per_user": 1.0 / r.tpot_s if r.tpot_s else 0.0,
            "memory": memory}, {"chunk_tokens": chunk, "prefill_passes": r.prefill_passes, "tp": model.tp,
                                "hardware": plan.target, "model": getattr(record, "model_path", "")}


def _table(out: Dict[str, Any], info: Dict[str, Any], job: dict) -> str:
    m = out["memory"]
    chunk = info["chunk_tokens"] or "off"
    lines = [
        f"static batch: {job['batch_size']} x (isl {job['isl']}, prefix {job['prefix']}, osl {job['osl']}) "
        f"of {info['model']} on {info['hardware']}, tp {info['tp']}",
        f"  ttft_ms                {out['ttft_ms']:12.2f}   ({info['prefill_passes']} prefill pass(es), chunk {chunk})",
        f"  tpot_ms                {out['tpot_ms']:12.2f}",
        f"  tokens_per_s           {out['tokens_per_s']:12.1f}",
        f"  tokens_per_s_per_gpu   {out['tokens_per_s_per_gpu']:12.1f}",
        f"  tokens_per_s_per_user  {out['tokens_per_s_per_user']:12.1f}",
        f"  memory per GPU: weights {m['weights_gb']:.2f} GB, KV of the batch {m['kv_gb']:.2f} GB of a "
        f"{m['kv_pool_gb']:.2f} GB pool ({m['kv_pool_tokens']:,} tokens): fits, up to {m['max_batch_size']} "
        "such requests",
    ]
    return "\n".join(lines)


def _overrides(ctx: JobContext) -> Dict[str, str]:
    out = {}
    for ov in ctx.overrides or ():
        k, _, v = str(ov).partition("=")
        out[k.lstrip("+~")] = v
    return out


def run(record, job: dict, ctx: JobContext) -> float:
    try:
        out, info = estimate(record, getattr(ctx, "hardware", None), job)
    except BatchDoesNotFit as exc:
        if not ctx.multirun:
            raise
        # in a sweep the point stays in the table, marked infeasible (as job=replay marks a budget)
        reason = exc.problems[0].message
        print(f"infeasible: {reason}", file=sys.stderr)
        flat = {k: None for k in KEYS if k != "memory"}
        flat.update(memory_fits=False, status="infeasible", status_reason=reason, **_overrides(ctx))
        ctx.write_text("metrics.json", json.dumps(flat))
        return float("nan")
    if job.get("format") == "json":
        print(json.dumps(out, indent=2))
    else:
        print(_table(out, info, job))
    if ctx.multirun:
        flat = {k: v for k, v in out.items() if k != "memory"}
        flat.update({f"memory_{k}": v for k, v in out["memory"].items()})
        flat["status"] = "ok"
        flat.update(_overrides(ctx))
        ctx.write_text("metrics.json", json.dumps(flat))
    return float(out["ttft_ms"])
