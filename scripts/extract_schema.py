#!/usr/bin/env python3
"""Write the command-line facts of an installed SGLang as a JSON schema snapshot.

Run it with the interpreter of a virtual environment that has SGLang installed (it loads
``sglang_hydra/config/engine_probe.py`` by path and never imports sglang_hydra):

    /path/to/ref-venv/bin/python scripts/extract_schema.py --out sglang_hydra/config/snapshots/sglang_0_5_23.json

The snapshot holds facts only: for every record field its namespace, type, default and
whether it is resolvable or has no flag; for every flag of the engine's parser its option
strings, destination, action kind, value parser, choices, nargs, const and default; the
record's positional order; and the few facts a value parser checks (cuda-graph phases and
keys).  No help text is copied.
"""
from __future__ import annotations

import argparse
import json
import runpy
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[1] / "sglang_hydra" / "config" / "engine_probe.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write here instead of stdout")
    ap.add_argument("--pretty", action="store_true", help="indent the JSON")
    args = ap.parse_args()
    probe = runpy.run_path(str(PROBE))
    real_stdout = probe["quiet_engine_output"]()
    data = probe["extract"]()
    text = json.dumps(data, indent=1 if args.pretty else None, separators=None if args.pretty else (",", ":")) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        real_stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
