"""Resolve launch shapes with the reference engine (SGLang 0.5.23) and print the outcome.

Runs inside a separate virtual environment that has the reference wheel installed (see
``docs/differential.md``); it never imports sglang_hydra.  Input on stdin: a JSON list of
``{"argv": [...], "env": {...}, "mode": "resolve" | "parse"}``.  Output on stdout: one JSON
list with, per shape, either ``{"ok": true, "values": {field: value}}`` or
``{"ok": false, "error": "<type>: <message>"}``.  ``resolve`` (the default) runs the whole
resolution and reports every memory/disagg field; ``parse`` only parses the command line
(``prepare_server_args``) and reports every field of the record as the parser left it.

    ref-venv/bin/python scripts/reference_oracle.py < shapes.json > outcomes.json
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import warnings


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def main() -> int:
    shapes = json.load(sys.stdin)
    real_stdout = sys.stdout
    # The engine prints through logging and warnings; keep stdout for our JSON only.
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    from sglang.srt.arg_groups.arg_utils import namespace_of
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    fields = [f for f, ns in namespace_of(ServerArgs).items() if ns in ("memory", "disagg")]
    all_fields = list(namespace_of(ServerArgs))
    outcomes = []
    saved_env = dict(os.environ)
    for shape in shapes:
        os.environ.clear()
        os.environ.update(saved_env)
        os.environ.update(shape.get("env", {}))
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                args = prepare_server_args(list(shape["argv"]))
                if shape.get("mode") == "parse":
                    parsed = {f: _jsonable(getattr(args, f, None)) for f in all_fields}
                else:
                    args.resolve_once()
                    resolved = args.resolved_dict()
            if shape.get("mode") == "parse":
                outcomes.append({"ok": True, "values": parsed})
            else:
                outcomes.append({"ok": True, "values": {f: _jsonable(resolved.get(f)) for f in fields}})
        except SystemExit as exc:  # argparse rejected the command line
            outcomes.append({"ok": False, "error": f"SystemExit: {exc.code}"})
        except Exception as exc:  # noqa: BLE001 - every failure is an outcome to compare
            outcomes.append({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    os.environ.clear()
    os.environ.update(saved_env)
    json.dump(outcomes, real_stdout)
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
