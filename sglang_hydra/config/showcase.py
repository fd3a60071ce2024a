"""What the bare ``sglang-hydra`` runs: the what-if of a real model on a target GPU over the
bundled trace sample, so the first command a person types shows the product's answer.

conf/config.yaml's own defaults (model=tiny, hardware=local) stay what every command with
arguments starts from: they keep ``compose()`` equal to SGLang's ``ServerArgs()`` and size
for the machine at hand, but a tiny model on an uncalibrated machine cannot time a request.
"""
from __future__ import annotations

#: the overrides of the bare command
SHOWCASE = ("job=replay", "model=llama3_1_8b", "hardware=h100_80gb", "memory=hicache", "parallel.dp_size=8")


def showcase_note() -> str:
    """The line the bare command prints first (on stderr), so nobody mistakes it for the defaults."""
    return ("sglang-hydra: no arguments, so the what-if on its showcase settings: " + " ".join(SHOWCASE)
            + " over the bundled 1,000-request trace sample. Any argument runs exactly what you write, on "
            "conf/config.yaml's defaults (model=tiny, hardware=local); --help lists every setting.")


def showcase_help_lines() -> list:
    return ["With no arguments at all, sglang-hydra runs its showcase: " + " ".join(SHOWCASE),
            "over the bundled trace sample. Any argument runs exactly what you write, on the",
            "defaults below (model=tiny, hardware=local: this machine)."]
