"""Errors raised while planning or building KV memory.

Everything a user can fix by changing a setting is raised as :class:`MemorySetupError`,
which *is* a :class:`sglang_hydra.config.errors.ConfigError` when that module is present,
so the CLI reports it exactly like a configuration problem (named key and flag, exit 2).
The one switch point is :func:`setup_error`.  This module never imports torch.
"""
from __future__ import annotations


try:  # the config layer's error type, when present
    from sglang_hydra.config.errors import ConfigError as _Base, problem_for as _problem_for
except Exception:  # pragma: no cover - only while the config layer is absent
    _Base = None
    _problem_for = None


def _fallback_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


if _Base is not None:

    class MemorySetupError(_Base):  # type: ignore[misc,valid-type]
        """A memory setting that cannot be honoured; a ``ConfigError`` with one problem."""

        def __init__(self, field: str, message: str, source: str = "memory"):
            super().__init__([_problem_for(field, message, source)])
            self.field = field

else:  # pragma: no cover

    class _Problem:
        def __init__(self, key, flag, message, source=""):
            self.key, self.flag, self.message, self.source = key, flag, message, source

        def __str__(self):
            return f"{self.key} ({self.flag}): {self.message}"

    class MemorySetupError(ValueError):  # type: ignore[no-redef]
        """A memory setting that cannot be honoured (stand-alone variant)."""

        def __init__(self, field: str, message: str, source: str = "memory"):
            self.field = field
            self.problems = [_Problem(field, _fallback_flag(field), message, source)]
            super().__init__(str(self.problems[0]))

        key = property(lambda self: self.problems[0].key)
        flag = property(lambda self: self.problems[0].flag)
        message = property(lambda self: self.problems[0].message)


def setup_error(field: str, message: str, source: str = "memory") -> MemorySetupError:
    """Build (not raise) the error for record field ``field`` (flat name, e.g. 'hicache_size')."""
    return MemorySetupError(field, message, source)


class TransferIndexError(IndexError):
    """A page index outside the pool, or a repeated destination page; nothing was copied."""


class HostMemoryProbeError(RuntimeError):
    """The process memory cgroup could not be located or read."""


__all__ = ["MemorySetupError", "setup_error", "TransferIndexError", "HostMemoryProbeError"]
