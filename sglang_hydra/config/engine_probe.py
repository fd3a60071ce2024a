"""Runs inside another interpreter that has SGLang installed; never imports sglang_hydra.

``python engine_probe.py`` reads one JSON request on stdin and writes one JSON answer on
stdout.  Request: ``{"argv": [...] or null, "schema": bool, "env": {...}}``.  Answer:
``{"installed": false, "error": ...}`` when SGLang cannot be imported, else
``{"installed": true, "version": ..., "verdict": {"ok": bool, "error": str} or null,
"schema": {...} or null}``: the verdict of SGLang's own parsing and resolution of ``argv``
(``prepare_server_args`` + ``resolve_once``) and, on request, the engine's command-line
facts (the same form as the bundled snapshot; ``scripts/extract_schema.py`` writes them).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import typing


def _type_text(tp) -> str:
    """A small, stable spelling of a field's type: bool, int, float, str, Optional[X], List[X], Dict, Any."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _type_text(typing.get_args(tp)[0])
    if tp in (bool, int, float, str):
        return tp.__name__
    if origin is typing.Literal:
        kinds = {type(v) for v in typing.get_args(tp)}
        return kinds.pop().__name__ if len(kinds) == 1 and kinds <= {str, int, float} else "str"
    if origin in (typing.Union,) or type(tp).__name__ == "UnionType":
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return f"Optional[{_type_text(rest[0])}]"
        return "Any"
    if origin in (list, typing.List, tuple, set):
        args = typing.get_args(tp)
        inner = _type_text(args[0]) if args else "str"
        return f"List[{inner if inner in ('int', 'float', 'str') else 'Any'}]"
    if origin in (dict, typing.Dict) or tp is dict:
        return "Dict"
    return "Any"


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return {"__repr__": repr(value)}


_PARSER_NAMES = {
    "int": "int", "float": "float", "str": "str", "loads": "json", "json_list_type": "json_list",
    "human_readable_int": "human_readable_int", "nullable_str": "nullable_str",
    "parse_cuda_graph_backend_arg": "cuda_graph_backend", "parse_cuda_graph_config_arg": "cuda_graph_config",
}


def _action_kind(action: argparse.Action) -> str:
    name = type(action).__name__
    return {
        "_StoreAction": "store", "_StoreTrueAction": "store_true", "_StoreFalseAction": "store_false",
        "_StoreConstAction": "store_const", "BooleanOptionalAction": "boolean_optional",
        "LoRAPathAction": "lora_paths", "DeprecatedStoreTrueAction": "deprecated_store_true",
        "DeprecatedStoreConstAction": "deprecated_store_const", "_AppendAction": "append",
    }.get(name, "custom:" + name)


def extract() -> dict:
    import sglang
    from sglang.srt.arg_groups import arg_utils
    from sglang.srt.arg_groups.field_order import POSITIONAL_FIELD_ORDER
    from sglang.srt.server_args import ServerArgs

    namespaces = arg_utils.namespace_of(ServerArgs)
    resolvable = arg_utils.resolvable_fields(ServerArgs)
    fields = []
    import msgspec.structs
    struct_fields = {f.name: f for f in msgspec.structs.fields(ServerArgs)}
    no_cli = set()
    meta = {}
    for src in _input_namespaces():
        th = typing.get_type_hints(src, include_extras=True)
        for name, tp in th.items():
            if name not in struct_fields:
                continue
            a = None
            if typing.get_origin(tp) is typing.Annotated:
                for extra in typing.get_args(tp)[1:]:
                    if isinstance(extra, (arg_utils.Arg, str)):
                        a = extra if isinstance(extra, arg_utils.Arg) else arg_utils.Arg(help=extra)
                        break
            meta[name] = (tp, a)
            if a is None or a.no_cli:
                no_cli.add(name)
    for name, f in struct_fields.items():
        tp, a = meta.get(name, (typing.Any, None))
        has_factory = f.default_factory is not msgspec.NODEFAULT
        default = f.default_factory() if has_factory else (None if f.default is msgspec.NODEFAULT else f.default)
        entry = {
            "name": name,
            "namespace": namespaces.get(name),
            "type": _type_text(tp),
            "default": _jsonable(default),
            "required": (f.default is msgspec.NODEFAULT and not has_factory),
        }
        if has_factory:
            entry["factory"] = type(default).__name__
        if name in resolvable:
            entry["resolvable"] = True
        if name in no_cli:
            entry["no_cli"] = True
        fields.append(entry)

    parser = argparse.ArgumentParser(prog="sglang")
    ServerArgs.add_cli_args(parser)
    flags = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        kind = _action_kind(action)
        tfunc = action.type
        parser_name = None
        if tfunc is not None:
            parser_name = _PARSER_NAMES.get(getattr(tfunc, "__name__", ""), "custom:" + getattr(tfunc, "__name__", repr(tfunc)))
        entry = {"flags": list(action.option_strings), "dest": action.dest, "action": kind}
        if parser_name:
            entry["parser"] = parser_name
        if action.choices is not None:
            entry["choices"] = sorted(_jsonable(list(action.choices)), key=str) if isinstance(action.choices, set) \
                else _jsonable(list(action.choices))
        if action.nargs is not None and kind not in ("store_true", "store_false", "deprecated_store_true", "store_const"):
            entry["nargs"] = action.nargs
        if action.const is not None and kind not in ("store_true", "store_false"):
            entry["const"] = _jsonable(action.const)
        if getattr(action, "const_value", None) is not None:
            entry["const"] = _jsonable(action.const_value)
        entry["default"] = _jsonable(action.default)
        if action.required:
            entry["required"] = True
        flags.append(entry)
    facts = {}
    try:
        from sglang.srt.model_executor.cuda_graph_config import ALLOWED_KEYS_PER_PHASE, Phase
        facts["cuda_graph_config"] = {"phases": list(Phase.ALL),
                                      "keys": {k: sorted(v) for k, v in ALLOWED_KEYS_PER_PHASE.items()}}
    except ImportError:  # an engine without that parser
        pass
    return {
        "engine": "sglang",
        "parser_facts": facts,
        "version": sglang.__version__,
        "positional_order": list(POSITIONAL_FIELD_ORDER),
        "fields": fields,
        "flags": flags,
    }


def _input_namespaces():
    from sglang.srt import server_args as sa_mod
    srcs = getattr(sa_mod, "_INPUT_NAMESPACES", None)
    if srcs is None:
        from sglang.srt.arg_groups import fields as fmod
        srcs = getattr(fmod, "_INPUT_NAMESPACES")
    return list(srcs)


def verdict(argv):
    from sglang.srt.server_args import prepare_server_args
    try:
        # as sglang.launch_server does before parsing: plugins may add choices (our eviction policies)
        from sglang.srt.plugins import load_plugins
        with contextlib.redirect_stderr(io.StringIO()):
            load_plugins()
    except ImportError:
        pass
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            args = prepare_server_args(list(argv))
            args.resolve_once()
        return {"ok": True, "error": ""}
    except SystemExit as exc:  # argparse: the reason is on stderr
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return {"ok": False, "error": lines[-1] if lines else f"exit {exc.code}"}
    except Exception as exc:  # noqa: BLE001 - every failure is the engine's verdict
        text = f"{type(exc).__name__}: {exc}".rstrip(": ")
        if isinstance(exc, AssertionError) or not str(exc).strip():
            text += failing_frame(exc)
        return {"ok": False, "error": text}


def failing_frame(exc: BaseException) -> str:
    """Where the engine failed, for an error whose message says nothing (a bare ``assert``):
    `` at sglang/srt/x.py:12 in fn: assert a == b``, the innermost frame of the traceback."""
    import traceback
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    path = f.filename.replace(os.sep, "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    where = f" at {path}:{f.lineno} in {f.name}"
    return f"{where}: {f.line.strip()}" if f.line and f.line.strip() else where


def quiet_engine_output():
    """Keep stdout for the JSON answer: the engine prints while importing (sent to stderr here)
    and warns and logs (both silenced).  Returns the real stdout."""
    import logging
    import warnings

    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    return real_stdout


def main() -> int:
    request = json.load(sys.stdin)
    real_stdout = quiet_engine_output()
    os.environ.update(request.get("env") or {})
    try:
        import sglang
    except Exception as exc:  # noqa: BLE001 - absent or broken install: say which
        json.dump({"installed": False, "error": f"{type(exc).__name__}: {exc}"}, real_stdout)
        return 0
    answer = {"installed": True, "version": getattr(sglang, "__version__", "?"), "verdict": None, "schema": None}
    if request.get("schema"):
        answer["schema"] = extract()
    if request.get("argv") is not None:
        answer["verdict"] = verdict(request["argv"])
    json.dump(answer, real_stdout)
    real_stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
