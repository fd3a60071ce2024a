"""``--help`` describes every job.* key of every registered job (read from the settings
classes themselves, so a new key is covered when it is written), and rule explanations are
printed whole."""
import dataclasses
import inspect
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional

import pytest

import sglang_hydra.jobs.specs  # noqa: F401  (registers the built-in jobs)
from sglang_hydra.config.help import field_comments, job_field_lines
from sglang_hydra.config.registry import job_schemas


def _keys(cls, prefix=""):
    """Every job.* key of a settings class, nested dataclasses as dotted keys."""
    for f in dataclasses.fields(cls):
        if f.name == "name" and not prefix:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from _keys(type(default), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}"


@pytest.fixture(scope="module")
def help_text(tmp_path_factory):
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "--help"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path_factory.mktemp("help"), env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    return r.stdout


def _job_section(text, job):
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"job={job}: "))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].strip())
    return lines[start:end]


def test_every_key_of_every_registered_job_is_described_in_help(help_text):
    schemas = job_schemas()
    assert {"replay", "resolve", "launch", "plan"} <= set(schemas)
    for job, schema in schemas.items():
        section = _job_section(help_text, job)
        assert section[0].split(": ", 1)[1].strip(), f"job={job} has no description (class docstring)"
        for key in _keys(schema.config_cls):
            i = next((i for i, ln in enumerate(section) if ln.startswith(f"  job.{key}=")), None)
            assert i is not None, f"job={job}: job.{key} is not in --help"
            desc = section[i + 1] if i + 1 < len(section) else ""
            assert desc.startswith("      ") and len(desc.strip()) > 10, \
                f"job={job}: job.{key} has no description; write a comment on its field in the settings class"


def test_objective_help_names_every_objective(help_text):
    from sglang_hydra.config.objectives import OBJECTIVES
    section = " ".join(_job_section(help_text, "replay"))
    for name in OBJECTIVES:
        assert name in section
    assert "prefill_throughput" not in section and "block_hit_rate" not in section


@dataclass
class _Sla:
    """What a request must meet."""
    ttft_ms: Optional[float] = None      # time to the first token, at most
    # time per output token, at most
    tpot_ms: Optional[float] = None


@dataclass
class _NewJob:
    """A job another module adds."""
    name: str = "new_job"
    rate: float = 1.5                    # requests per second, "#" inside a comment is fine
    shape: str = (
        "agg")                           # agg | disagg
    sla: _Sla = field(default_factory=_Sla)


def test_help_comes_from_field_comments_and_nested_settings():
    assert field_comments(_NewJob) == {"rate": 'requests per second, "#" inside a comment is fine',
                                       "shape": "agg | disagg"}
    lines = job_field_lines("new_job", _NewJob, {"shape": ("agg", "disagg")})
    text = "\n".join(lines)
    assert "  job.rate=1.5\n      Requests per second" in text
    assert "  job.shape='agg'\n      agg | disagg. Choices: agg, disagg." in text
    assert "  job.sla.*: What a request must meet" in text
    assert "  job.sla.ttft_ms=None\n      Time to the first token, at most." in text
    assert "  job.sla.tpot_ms=None\n      Time per output token, at most." in text


# ----------------------------------------------------------------------------- rule explanations
def test_every_rule_explanation_is_the_whole_first_paragraph():
    from sglang_hydra.config import resolve  # noqa: F401  (registers the rules)
    from sglang_hydra.config.errors import SOURCE_TITLES
    from sglang_hydra.config.rulebook import RULE_TITLES, RULES
    from sglang_hydra.config.rules import disagg, memory, misc, parallel  # noqa: F401
    assert RULES
    for r in RULES:
        title = SOURCE_TITLES[r.rule_id]
        if r.rule_id in RULE_TITLES:
            assert title == RULE_TITLES[r.rule_id]
            continue
        paragraph = " ".join(inspect.cleandoc(r.fn.__doc__ or "").split("\n\n")[0].split())
        assert title == paragraph.rstrip("."), r.rule_id
        assert not title.endswith((",", ";", ":")) and title.count("(") == title.count(")"), (r.rule_id, title)


def test_the_m_sz_explanation_is_printed_whole(tmp_path):
    r = subprocess.run([sys.executable, "-m", "sglang_hydra", "job=resolve", "memory.hicache_ratio=0"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert ("[M-SZ: Pool sizes that no machine could honour fail here, when the record is resolved, rather than "
            "later when memory is allocated (the reference accepts them silently)]") in r.stderr
