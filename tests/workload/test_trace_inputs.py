"""Trace inputs that cannot be replayed are TraceErrors naming the file, never empty results."""
import os

import pytest

from sglang_hydra.workload.trace import NAMED_TRACES, TraceError, default_trace_path, load_trace, trace_path

LINE = '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}\n'


def test_empty_and_blank_traces_are_errors(tmp_path):
    for text in ("", "\n  \n"):
        p = tmp_path / "empty.jsonl"
        p.write_text(text)
        with pytest.raises(TraceError, match="holds no requests") as ei:
            load_trace(p)
        assert ei.value.line == 0 and str(p) in str(ei.value)


def test_a_trace_of_only_bad_lines_skipped_is_an_error_too(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text("{nope\n[1]\n")
    with pytest.raises(TraceError, match=r"all 2 non-blank line\(s\) are malformed \(first at line 1"):
        load_trace(p, on_bad_line="skip")


def test_max_requests_zero_still_means_nothing_asked(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text(LINE)
    assert len(load_trace(p, max_requests=0)) == 0


def test_directory_missing_and_unreadable_paths(tmp_path):
    with pytest.raises(TraceError, match="is a directory, not a trace file"):
        load_trace(tmp_path)
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "nope.jsonl")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(TraceError, match="not UTF-8"):
        load_trace(binary)
    if os.geteuid() != 0:   # root can read any file
        locked = tmp_path / "locked.jsonl"
        locked.write_text(LINE)
        locked.chmod(0)
        with pytest.raises(TraceError, match="permission denied"):
            load_trace(locked)


def test_named_traces_resolve_to_the_packaged_files(tmp_path):
    assert trace_path(None) == default_trace_path() == trace_path("sample")
    full = trace_path("conversation")
    assert full.name == NAMED_TRACES["conversation"] and full.parent == default_trace_path().parent
    assert trace_path(str(tmp_path / "x.jsonl")) == tmp_path / "x.jsonl"
    assert len(load_trace("sample")) == 1000
