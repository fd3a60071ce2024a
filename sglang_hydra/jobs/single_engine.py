"""Jobs that model one engine refuse ``parallel.dp_size > 1`` instead of ignoring it.

Data parallelism runs ``dp_size`` replicas of the engine, each on its own ``tp`` GPUs, and
they share each node's host memory.  ``job=plan``, ``job=setup`` and ``job=estimate`` size
or time a single engine; until the deployment work models replicas, they say so and stop
(exit 2) rather than print one replica's numbers as if they were the server's.
(``--enable-dp-attention`` is different: it turns ``--dp`` into ``attn_dp_size`` inside one
engine, and ``dp_size`` stays 1.)
"""
from __future__ import annotations

from typing import List

from ..config.errors import Problem


def data_parallel_problems(record, job_name: str) -> List[Problem]:
    dp = int(getattr(record, "dp_size", 1) or 1)
    if dp <= 1:
        return []
    return [Problem("parallel.dp_size", "--dp", f"{dp}: job={job_name} models one engine and data parallelism "
                    f"({dp} replicas sharing each node's host memory) is not modelled yet; use parallel.dp_size=1 "
                    "and scale by the replicas yourself", job_name)]
