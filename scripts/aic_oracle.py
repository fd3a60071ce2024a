"""The aiconfigurator side of the pass-model differential: run with aiconfigurator's own Python.

Reads a JSON list of points on stdin, each ``{"model": HF id, "system": aic system name,
"isl", "osl", "batch_size", "tp", "prefix"}``, and writes one JSON list to stdout with, per
point, aiconfigurator 0.12.0's SGLang-backend static estimate: ``ttft_ms`` (``static_ctx``:
one prefill pass of the batch, no chunking) and ``tpot_ms`` (``static_gen``: the mean decode
step over ``osl`` steps).  A point aiconfigurator refuses gets ``"error"`` instead.

One process for all points, so its ~3 s start-up is paid once (~0.5 s a point after it).
Usage: ``$SGLANG_HYDRA_AIC_PYTHON scripts/aic_oracle.py < points.json > results.json``.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import sys
import warnings


def main() -> int:
    points = json.load(sys.stdin)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from aiconfigurator.cli.api import cli_estimate
    out = []
    for i, p in enumerate(points):
        if i and i % 20 == 0:
            print(f"aic_oracle: {i}/{len(points)} points", file=sys.stderr, flush=True)
        res = dict(p)
        try:
            for mode, key, attr in (("static_ctx", "ttft_ms", "ttft"), ("static_gen", "tpot_ms", "tpot")):
                if p.get("want") and key not in p["want"]:
                    continue
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    r = cli_estimate(model_path=p["model"], system_name=p["system"], backend_name="sglang",
                                     mode=mode, isl=int(p["isl"]), osl=int(p["osl"]),
                                     batch_size=int(p["batch_size"]), tp_size=int(p["tp"]),
                                     prefix=int(p.get("prefix", 0)))
                res[key] = float(getattr(r, attr))
        except Exception as exc:     # report it per point; the caller decides
            res["error"] = f"{type(exc).__name__}: {exc}"[:300]
        out.append(res)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
