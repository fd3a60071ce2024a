"""How fast the pass-time model and job=estimate are (pure Python; no GPU).

    python scripts/bench_pass_model.py [--repeats 5]

Prints, as medians over the repeats:
* passes/s of ``PassModel.step_s`` on a mixed pass (Llama-3.1-8B, TP 2, H100) and on a MoE
  pass (DeepSeek-V3, TP 8, H200), against the budget of 100,000 passes/s;
* the model time of one ``job=estimate`` (estimate() after start-up: plan + pass model +
  the static batch with 512 decode steps), against the budget of 50 ms;
* for scale, the same loop calling an empty Python function (the baseline from this run).
"""
from __future__ import annotations

import argparse
import statistics
import time


def rate(fn, n: int) -> float:
    t0 = time.perf_counter()
    fn(n)
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200_000)
    args = ap.parse_args()

    from sglang_hydra.config.compose import compose
    from sglang_hydra.jobs.estimate import estimate
    from sglang_hydra.perf import PassModel

    rec, comp = compose(["model=llama3_1_8b", "hardware=h100_80gb", "parallel.tp_size=2"])
    dense = PassModel.from_record(rec, comp.hardware)
    rec_moe, comp_moe = compose(["model=deepseek_v3", "hardware=h200_141gb", "parallel.tp_size=8"])
    moe = PassModel.from_record(rec_moe, comp_moe.hardware)

    def loop_dense(n):
        s = dense.step_s
        for i in range(n):
            s(2048 + (i & 63), 3_000_000, 64, 200_000)

    def loop_moe(n):
        s = moe.step_s
        for i in range(n):
            s(2048 + (i & 63), 3_000_000, 64, 200_000)

    def empty(*_a):
        return 0.0

    def loop_empty(n):
        for i in range(n):
            empty(2048 + (i & 63), 3_000_000, 64, 200_000)

    job = dict(isl=4096, osl=512, batch_size=64, prefix=1024, format="json")

    def one_estimate():
        t0 = time.perf_counter()
        estimate(rec, comp.hardware, job)
        return time.perf_counter() - t0

    one_estimate()      # imports done once, as start-up does
    r_dense = statistics.median(rate(loop_dense, args.calls) for _ in range(args.repeats))
    r_moe = statistics.median(rate(loop_moe, args.calls) for _ in range(args.repeats))
    r_empty = statistics.median(rate(loop_empty, args.calls) for _ in range(args.repeats))
    est = statistics.median(one_estimate() for _ in range(args.repeats))
    print(f"PassModel.step_s dense (llama3_1_8b tp2 h100): {r_dense:12,.0f} passes/s "
          f"({r_dense / 100_000:.1f}x the 100,000 budget; {r_empty / r_dense:.1f}x an empty call)")
    print(f"PassModel.step_s MoE (deepseek_v3 tp8 h200):   {r_moe:12,.0f} passes/s "
          f"({r_moe / 100_000:.1f}x the 100,000 budget)")
    print(f"empty Python call (baseline):                  {r_empty:12,.0f} calls/s")
    print(f"job=estimate model time (bs 64, isl 4096, osl 512): {est * 1e3:.2f} ms "
          f"({est * 1e3 / 50:.2f}x the 50 ms budget)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
