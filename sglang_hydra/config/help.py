"""``--help``: every field with its Hydra key, legacy flag, default and purpose."""
from __future__ import annotations

import textwrap
from typing import List

from .coerce import allowed_choices
from .fields import NAMESPACES
from .record import fields_of_namespace
from .spec import flags_of, has_flag


def field_help_lines() -> List[str]:
    lines: List[str] = []
    for ns, cls in NAMESPACES.items():
        import sys
        mdoc = sys.modules[cls.__module__].__doc__ or ""
        doc = mdoc.strip().splitlines()[0] if mdoc.strip() else ""
        lines.append(f"== {ns} == {doc}")
        for fi in fields_of_namespace(ns):
            if fi.arg.no_cli:
                continue
            flags = "  [" + ", ".join(flags_of(fi.name, fi.arg)) + "]" if has_flag(fi.arg) else ""
            default = fi.default_value()
            lines.append(f"  {fi.key}={default!r}{flags}")
            text = fi.arg.help
            opts = allowed_choices(fi)
            if opts:
                text += f" Choices: {', '.join(map(str, opts))}."
            if not text:
                continue  # a reference field without a rule here: `sglang serve --help` explains it
            lines += textwrap.wrap(text, width=96, initial_indent="      ", subsequent_indent="      ")
        lines.append("")
    return lines


def help_config(full: bool = True):
    """Hydra's help page.  ``full=False`` leaves the field list out: Hydra parses the template
    for interpolations on every composition, and 900 lines of fields cost seconds there on
    runs that never print it (the CLI asks for the full page only with --help)."""
    from hydra.conf import HelpConf

    lines = field_help_lines() if full else ["(run sglang-hydra --help for the fields)"]
    body = "\n".join(lines).replace("$", "$$")
    template = (
        "${hydra.help.header}\n"
        "Settings are Hydra overrides (key=value, group=option) or the reference engine's\n"
        "flags; both may be mixed and the last occurrence of a setting wins.\n\n"
        "== Config groups ==\n$APP_CONFIG_GROUPS\n"
        "== Fields: key=default [legacy flags] ==\n"
        + body.replace("${", "$${") +
        "\n${hydra.help.footer}\n"
    )
    return HelpConf(
        app_name="sglang-hydra",
        header="sglang-hydra: compose SGLang memory/disaggregation settings and run jobs on them.",
        footer="Hydra's own flags: run 'sglang-hydra --hydra-help'. Examples in README.md.",
        template=template,
    )
