"""One way to write a number for a person: every report, table and chart uses it, so the same
quantity never reads "1.7e+03 GB" in one place and "1,700 GB" in another."""
from __future__ import annotations

import math


def fmt_number(v: float) -> str:
    """2,625 / 31.4 / 3.14 / 0.052: thousands separated, three significant figures below 100,
    never scientific notation for a figure a person reads (1e-5 and smaller excepted)."""
    if v is None:
        return "-"
    v = float(v)
    if not math.isfinite(v):
        return str(v)
    a = abs(v)
    if a >= 99.95:            # (what rounds to 100.0 reads 100)
        return f"{v:,.0f}"
    if a >= 9.995:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.3g}"
    if a == 0:
        return "0"
    return f"{v:.3g}" if a >= 1e-4 else f"{v:.2e}"


def fmt_gb(v: float) -> str:
    """Gigabytes (1e9 bytes) as :func:`fmt_number` writes them: ``852 GB``, ``1,700 GB``."""
    return f"{fmt_number(v)} GB"
