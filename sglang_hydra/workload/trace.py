"""Reader for Mooncake-format JSONL request traces.

One JSON object per line with ``timestamp`` (ms), ``input_length``, ``output_length``
(tokens) and ``hash_ids`` (ids of the prompt's 512-token prefix blocks, so
``len(hash_ids) == ceil(input_length / 512)``).  Malformed lines are reported with their
1-based line number; ``on_bad_line="fail"`` raises :class:`TraceError` at the first one,
``on_bad_line="skip"`` drops them, records them in :attr:`Trace.bad_lines` and emits one
warning with the count.  Blank lines are ignored.
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple, Union

__all__ = [
    "BLOCK_SIZE",
    "Request",
    "Trace",
    "TraceError",
    "parse_line",
    "iter_trace",
    "load_trace",
    "default_trace_path",
    "trace_path",
    "NAMED_TRACES",
    "ON_BAD_LINE_CHOICES",
]

BLOCK_SIZE = 512
ON_BAD_LINE_CHOICES = ("skip", "fail")


@dataclass(frozen=True)
class Request:
    """One prompt: arrival time (ms), lengths (tokens) and its prefix-block ids.

    ``line`` is the 1-based source line (0 for generated requests); ``conversation`` is
    set by the synthetic generator (-1 when unknown); ``priority`` feeds the ``priority``
    eviction policy.
    """

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: Tuple[int, ...]
    line: int = 0
    conversation: int = -1
    priority: int = 0

    @property
    def num_blocks(self) -> int:
        return len(self.hash_ids)

    def to_json(self) -> str:
        """The Mooncake JSONL form of this request."""
        ts = int(self.timestamp) if float(self.timestamp).is_integer() else self.timestamp
        return json.dumps({"timestamp": ts, "input_length": self.input_length,
                           "output_length": self.output_length, "hash_ids": list(self.hash_ids)})


class TraceError(ValueError):
    """A trace that cannot be used.

    ``line`` is the 1-based number of a malformed line, or 0 when the problem is the file as
    a whole (missing, a directory, unreadable, empty); ``path`` may be None.
    """

    def __init__(self, reason: str, line: int, path: Optional[str] = None):
        self.reason = reason
        self.line = line
        self.path = path
        if line:
            where = f"{path}:{line}" if path else f"line {line}"
            text = f"{where}: malformed trace line: {reason}"
        else:
            text = f"{path}: {reason}" if path else reason
        super().__init__(text)


@dataclass
class Trace:
    """Requests read from one file, plus the lines that were skipped."""

    requests: List[Request]
    path: Optional[str] = None
    bad_lines: List[Tuple[int, str]] = field(default_factory=list)

    @property
    def skipped(self) -> int:
        return len(self.bad_lines)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self):
        return iter(self.requests)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_line(text: str, line: int, path: Optional[str] = None,
               block_size: int = BLOCK_SIZE) -> Request:
    """Parse and check one JSONL line; raises :class:`TraceError`."""
    try:
        obj = json.loads(text)
    except ValueError as exc:
        raise TraceError(f"invalid JSON ({exc.msg} at column {exc.colno})", line, path) from None
    if not isinstance(obj, dict):
        raise TraceError(f"expected a JSON object, got {type(obj).__name__}", line, path)
    for name in ("timestamp", "input_length", "output_length", "hash_ids"):
        if name not in obj:
            raise TraceError(f"missing field {name!r}", line, path)
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise TraceError(f"'timestamp' must be a number, got {ts!r}", line, path)
    if ts < 0:
        raise TraceError(f"negative 'timestamp' {ts}", line, path)
    for name in ("input_length", "output_length"):
        v = obj[name]
        if not _is_int(v):
            raise TraceError(f"{name!r} must be an integer, got {v!r}", line, path)
        if v < 0:
            raise TraceError(f"negative {name!r} {v}", line, path)
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or not all(_is_int(h) for h in ids):
        raise TraceError("'hash_ids' must be a list of integers", line, path)
    length = obj["input_length"]
    expected = -(-length // block_size)
    if len(ids) != expected:
        raise TraceError(
            f"'hash_ids' has {len(ids)} entries but input_length {length} needs "
            f"ceil({length}/{block_size}) = {expected}", line, path)
    return Request(ts, length, obj["output_length"], tuple(ids), line)


def iter_trace(path: Union[str, os.PathLike], *, on_bad_line: str = "fail",
               max_requests: Optional[int] = None, block_size: int = BLOCK_SIZE,
               bad_lines: Optional[list] = None) -> Iterator[Request]:
    """Yield requests from ``path`` in file order (see module docstring for errors)."""
    if on_bad_line not in ON_BAD_LINE_CHOICES:
        raise ValueError(f"on_bad_line must be one of {ON_BAD_LINE_CHOICES}, got {on_bad_line!r}")
    if max_requests is not None and max_requests <= 0:
        return
    path = trace_path(path)
    spath = str(path)
    count = 0
    with _open_trace(path) as fh:
        for lineno, text in _lines(fh, spath):
            if not text.strip():
                continue
            try:
                req = parse_line(text, lineno, spath, block_size)
            except TraceError as err:
                if on_bad_line == "fail":
                    raise
                if bad_lines is not None:
                    bad_lines.append((lineno, err.reason))
                continue
            yield req
            count += 1
            if max_requests is not None and count >= max_requests:
                return


def _open_trace(path):
    """Open a trace for reading; every reason it cannot be read becomes a :class:`TraceError`."""
    spath = str(path)
    named = ", ".join(NAMED_TRACES)
    try:
        return open(path, "r", encoding="utf-8")
    except IsADirectoryError:
        raise TraceError(f"is a directory, not a trace file; give a JSONL file or a named trace ({named})",
                         0, spath) from None
    except FileNotFoundError:
        raise TraceError(f"no such trace file; give an existing JSONL file or a named trace ({named})",
                         0, spath) from None
    except PermissionError:
        raise TraceError("cannot read the trace file: permission denied", 0, spath) from None
    except OSError as exc:
        raise TraceError(f"cannot read the trace file: {exc.strerror or exc}", 0, spath) from None


def _lines(fh, spath: str):
    """Numbered lines; a read or decoding failure names the file instead of raising raw."""
    lineno = 0
    try:
        for lineno, text in enumerate(fh, start=1):
            yield lineno, text
    except UnicodeDecodeError:
        raise TraceError("not UTF-8 text (is this a JSONL trace?)", lineno + 1, spath) from None
    except OSError as exc:
        raise TraceError(f"cannot read the trace file: {exc.strerror or exc}", 0, spath) from None


# Traces shipped in sglang_hydra/workload/data (see the README there for their origin).
NAMED_TRACES = {
    "sample": "conversation_sample.jsonl",         # the first 1,000 requests; the default
    "conversation": "conversation_trace.jsonl",    # the whole Mooncake conversation trace
}


def _bundled(filename: str) -> Path:
    return Path(str(resources.files("sglang_hydra.workload") / "data" / filename))


def default_trace_path() -> Path:
    """The bundled sample (first 1,000 requests of the Mooncake conversation trace)."""
    return _bundled(NAMED_TRACES["sample"])


def trace_path(trace: Union[str, os.PathLike, None]) -> Path:
    """Where a ``job.trace`` value points: None is the bundled sample, a name from
    :data:`NAMED_TRACES` is a bundled trace, anything else is a file path."""
    if trace is None:
        return default_trace_path()
    if isinstance(trace, str) and trace in NAMED_TRACES:
        return _bundled(NAMED_TRACES[trace])
    return Path(trace)


def load_trace(path: Union[str, os.PathLike, None] = None, *, on_bad_line: str = "fail",
               max_requests: Optional[int] = None, block_size: int = BLOCK_SIZE) -> Trace:
    """Read a whole trace (``None`` = the bundled sample; a name from :data:`NAMED_TRACES`
    = that bundled trace).

    With ``on_bad_line="skip"`` a single :class:`UserWarning` reports how many lines
    were skipped and the first of them.  A trace without a single usable request is a
    :class:`TraceError`: replaying nothing would print a meaningless 0 % hit rate.
    """
    path = trace_path(path)
    bad: List[Tuple[int, str]] = []
    reqs = list(iter_trace(path, on_bad_line=on_bad_line, max_requests=max_requests,
                           block_size=block_size, bad_lines=bad))
    if not reqs and (max_requests is None or max_requests > 0):
        if bad:
            raise TraceError(f"no usable request: all {len(bad)} non-blank line(s) are malformed "
                             f"(first at line {bad[0][0]}: {bad[0][1]})", 0, str(path))
        raise TraceError("the trace holds no requests (the file is empty or has only blank lines)", 0, str(path))
    if bad:
        line, reason = bad[0]
        warnings.warn(f"{path}: skipped {len(bad)} malformed line(s); first at line {line}: "
                      f"{reason}", stacklevel=2)
    return Trace(reqs, str(path), bad)


def write_trace(requests: Sequence[Request], path: Union[str, os.PathLike]) -> None:
    """Write requests as Mooncake JSONL."""
    with open(path, "w", encoding="utf-8") as fh:
        for r in requests:
            fh.write(r.to_json())
            fh.write("\n")


__all__.append("write_trace")
