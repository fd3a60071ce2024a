"""Mooncake JSONL reader: good input, every kind of malformed line, skip/fail."""
import json
import warnings

import pytest

from sglang_hydra.workload import TraceError, default_trace_path, iter_trace, load_trace
from sglang_hydra.workload.trace import parse_line, write_trace

GOOD = {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [1, 2]}


def write(tmp_path, lines):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return p


def good(**kw):
    d = dict(GOOD)
    d.update(kw)
    return json.dumps(d)


BAD_LINES = [
    ("{not json", "invalid JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "hash_ids"}), "missing field 'hash_ids'"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "input_length"}), "missing field"),
    (good(input_length=-5, hash_ids=[]), "negative 'input_length'"),
    (good(output_length=-1), "negative 'output_length'"),
    (good(input_length=1000, hash_ids=[1]), "ceil(1000/512) = 2"),
    (good(input_length=1024, hash_ids=[1, 2, 3]), "has 3 entries"),
    (good(hash_ids=[1, "x"]), "list of integers"),
    (good(input_length=1.5), "must be an integer"),
    (good(timestamp="soon"), "'timestamp' must be a number"),
]


@pytest.mark.parametrize("text,needle", BAD_LINES)
def test_fail_reports_line_number(tmp_path, text, needle):
    p = write(tmp_path, [good(), good(timestamp=1), text, good(timestamp=2)])
    with pytest.raises(TraceError) as info:
        load_trace(p, on_bad_line="fail")
    assert info.value.line == 3
    assert needle in str(info.value) and f"{p}:3" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_skip_counts_and_warns(tmp_path):
    lines = [good(), BAD_LINES[0][0], good(timestamp=1), "", BAD_LINES[6][0], good(timestamp=2)]
    p = write(tmp_path, lines)
    with pytest.warns(UserWarning, match="skipped 2 malformed line"):
        tr = load_trace(p, on_bad_line="skip")
    assert len(tr) == 3 and tr.skipped == 2
    assert [b[0] for b in tr.bad_lines] == [2, 5]
    assert [r.line for r in tr.requests] == [1, 3, 6]


def test_no_warning_when_clean_and_blank_lines_ignored(tmp_path):
    p = write(tmp_path, [good(), "   ", good(input_length=0, hash_ids=[])])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tr = load_trace(p)
    assert len(tr) == 2 and tr.requests[1].input_length == 0


def test_max_requests_and_bad_option(tmp_path):
    p = write(tmp_path, [good(timestamp=i) for i in range(5)])
    assert len(load_trace(p, max_requests=3)) == 3
    assert len(load_trace(p, max_requests=0)) == 0
    with pytest.raises(ValueError, match="on_bad_line"):
        list(iter_trace(p, on_bad_line="ignore"))


def test_roundtrip(tmp_path):
    tr = load_trace(default_trace_path(), max_requests=20)
    out = tmp_path / "rt.jsonl"
    write_trace(tr.requests, out)
    again = load_trace(out)
    assert [(r.timestamp, r.input_length, r.output_length, r.hash_ids) for r in again] == \
        [(r.timestamp, r.input_length, r.output_length, r.hash_ids) for r in tr]


def test_bundled_sample():
    tr = load_trace()
    assert len(tr) == 1000 and tr.skipped == 0
    assert tr.requests[0].hash_ids[:3] == (0, 1, 2)
    assert (default_trace_path().parent / "NOTICE").exists()


def test_parse_line_direct():
    r = parse_line(good(), 7)
    assert r.line == 7 and r.hash_ids == (1, 2) and r.num_blocks == 2
