"""Resolution: turn the values a user gave into the values the server runs with.

Rules live beside the namespace they concern (``rules/<namespace>.py``) and register
themselves with a step number that fixes their order (the reference engine's pipeline
order, so one rule sees what an earlier one decided).  A rule reads the live values, may
*declare* new values (each rewrite is logged with the rule, the field and both values),
and reports problems instead of raising, so one command gets all of its errors at once.
The user's input is never lost: the record keeps it as ``raw_input``.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Mapping, Optional

from .errors import ConfigError, Problem
from .record import ServerArgs, finalize
from .rulebook import RULES, Resolving, Rule, rule  # noqa: F401  (rule, Rule: re-exported)

log = logging.getLogger("sglang_hydra.config")


def _load_rules() -> None:
    from .rules import disagg, memory, misc, parallel  # noqa: F401  (registration side effects)


def resolve(values: Dict[str, Any], *, explicit: frozenset = frozenset(), env: Optional[Mapping[str, str]] = None,
            host: Optional[Dict[str, Any]] = None, prior: Optional[List[Problem]] = None) -> ServerArgs:
    """Run every rule in order; raise one ConfigError with all problems, else freeze the record."""
    _load_rules()
    st = Resolving(values, explicit, os.environ if env is None else env, host)
    if "radix_eviction_policy" in explicit:
        st.values["_radix_eviction_policy_explicitly_set"] = True
    for r in RULES:
        object.__setattr__(st, "current_rule", r.rule_id)
        r.fn(st)
    if st.problems or prior:
        raise ConfigError(_dedupe(list(prior or []) + st.problems))
    for level, text in st.notes:
        log.log(level, text)
    return finalize(st.values, raw=st.raw, explicit=explicit, log=tuple(st.log))


def _dedupe(problems: List[Problem]) -> List[Problem]:
    seen, out = set(), []
    for p in problems:
        k = (p.key, p.message)
        if k not in seen:
            seen.add(k)
            out.append(p)
    return out
