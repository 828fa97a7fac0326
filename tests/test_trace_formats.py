"""Canonical trace format: round trips, JSONL, and bad rows reported with file and line."""

import gzip

import numpy as np
import pytest

from janusd.trace.formats import Trace, TraceError, read_trace, write_trace

HEADER = "arrival_s,app,model,input_tokens,output_tokens"


def _small(slo=True):
    return Trace.build(
        np.array([0.0, 0.5, 0.5, 2.25]), ["chat", "code", "chat", "rag,long"], ["m1", "m2", "m1", "m3"],
        np.array([10, 20, 30, 4000]), np.array([5, 6, 7, 8]),
        np.array([1000.0, np.nan, 1000.0, 3000.0]) if slo else None,
        np.array([100.0, np.nan, 100.0, 150.0]) if slo else None,
    )  # fmt: skip


@pytest.mark.parametrize("name", ["t.csv", "t.csv.gz", "t.jsonl", "t.jsonl.gz"])
def test_round_trip(tmp_path, name):
    t = _small()
    write_trace(t, tmp_path / name)
    back = read_trace(tmp_path / name)
    assert back.arrival_s.tolist() == t.arrival_s.tolist()
    assert back.app_names().tolist() == ["chat", "code", "chat", "rag,long"]
    assert back.model_names().tolist() == ["m1", "m2", "m1", "m3"]
    assert back.input_tokens.tolist() == [10, 20, 30, 4000]
    assert back.output_tokens.tolist() == [5, 6, 7, 8]
    np.testing.assert_array_equal(back.ttft_slo_ms, t.ttft_slo_ms)
    np.testing.assert_array_equal(back.tpot_slo_ms, t.tpot_slo_ms)


def test_csv_without_slo_columns_has_the_plain_header(tmp_path):
    write_trace(_small(slo=False), tmp_path / "t.csv")
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0] == HEADER
    assert lines[1] == "0.000000,chat,m1,10,5"
    assert np.isnan(read_trace(tmp_path / "t.csv").ttft_slo_ms).all()


def test_columns_in_any_order_and_empty_slo_cells(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("app,model,arrival_s,output_tokens,input_tokens,tpot_slo_ms\nx,m,1.5,3,9,\ny,m,2,4,8,50\n")
    t = read_trace(p)
    assert t.arrival_s.tolist() == [1.5, 2.0]
    assert t.input_tokens.tolist() == [9, 8]
    assert np.isnan(t.tpot_slo_ms[0]) and t.tpot_slo_ms[1] == 50.0


@pytest.mark.parametrize(
    "line, reason",
    [
        ("1.0,a,m,10", "expected 5 fields, got 4"),
        ("abc,a,m,10,5", "arrival_s must be a number"),
        ("-1,a,m,10,5", "arrival_s must be a finite number >= 0"),
        ("nan,a,m,10,5", "arrival_s must be a finite number >= 0"),
        ("1.0,a,m,ten,5", "input_tokens must be an integer"),
        ("1.0,a,m,10,0", "output_tokens must be >= 1"),
        ("1.0,a,m,0,5", "input_tokens must be >= 1"),
        ("1.0,,m,10,5", "app is empty"),
        ("0.5,a,m,10,5", "before the previous row"),
    ],
)
def test_bad_csv_row_names_file_and_line(tmp_path, line, reason):
    p = tmp_path / "bad.csv"
    p.write_text(f"{HEADER}\n0.5,a,m,1,1\n1.0,a,m,1,1\n{line}\n")
    with pytest.raises(TraceError) as e:
        read_trace(p)
    assert str(e.value).startswith(f"{p}:4: ")
    assert reason in str(e.value)


def test_bad_header(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("arrival,app,model,input_tokens,output_tokens\n")
    with pytest.raises(TraceError, match=r"bad.csv:1: bad header: missing \['arrival_s'\], unknown \['arrival'\]"):
        read_trace(p)


def test_bad_jsonl_rows(tmp_path):
    p = tmp_path / "bad.jsonl"
    good = '{"arrival_s": 0.5, "app": "a", "model": "m", "input_tokens": 3, "output_tokens": 2}'
    p.write_text(good + "\n\n" + '{"arrival_s": 1.0, "app": "a", "model": "m", "input_tokens": "x", "output_tokens": 2}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:3: Expected `int`, got `str` - at `\$.input_tokens`"):
        read_trace(p)
    p.write_text(good + "\n{oops\n")
    with pytest.raises(TraceError, match=r"bad.jsonl:2: not valid JSON"):
        read_trace(p)
    p.write_text(good + '\n{"arrival_s": 1, "app": "a", "model": "m", "input_tokens": 3, "output_tokens": 2, "x": 1}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2: Object contains unknown field `x`"):
        read_trace(p)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "nope.csv")
    (tmp_path / "x.csv.gz").write_bytes(b"not gzip")
    with pytest.raises(TraceError, match="broken gzip"):
        read_trace(tmp_path / "x.csv.gz")
    (tmp_path / "e.csv").write_text("")
    with pytest.raises(TraceError, match="e.csv:1: empty file"):
        read_trace(tmp_path / "e.csv")
    with gzip.open(tmp_path / "b.csv.gz", "wb") as f:
        f.write(b"\xff\xfe\x00")
    with pytest.raises(TraceError, match="not UTF-8"):
        read_trace(tmp_path / "b.csv.gz")


def test_build_validates_and_sorts():
    t = Trace.build(np.array([2.0, 1.0]), ["a", "b"], ["m", "m"], np.array([1, 2]), np.array([1, 1]), sort=True)
    assert t.arrival_s.tolist() == [1.0, 2.0] and t.app_names().tolist() == ["b", "a"]
    with pytest.raises(TraceError, match="row 1: arrival_s is smaller"):
        Trace.build(np.array([2.0, 1.0]), ["a", "b"], ["m", "m"], np.array([1, 2]), np.array([1, 1]))
    with pytest.raises(TraceError, match="row 0: output_tokens must be >= 1"):
        Trace.build(np.array([0.0]), ["a"], ["m"], np.array([1]), np.array([0]))


def _corrupt_gzip(rows: int = 2000) -> bytes:
    """A gzip file whose header is fine but whose deflate stream is damaged (zlib.error)."""
    data = bytearray(gzip.compress((HEADER + "\n" + "0.1,a,m,1,1\n" * rows).encode()))
    for i in range(30, 60):
        data[i] ^= 0xFF
    return bytes(data)


def test_corrupt_gzip_stream_is_a_trace_error(tmp_path):
    (tmp_path / "c.csv.gz").write_bytes(_corrupt_gzip())
    with pytest.raises(TraceError, match="c.csv.gz: broken gzip file"):
        read_trace(tmp_path / "c.csv.gz")


def test_csv_with_a_utf8_byte_order_mark_loads(tmp_path):
    # Spreadsheet exports start with U+FEFF; it is not part of the first column's name.
    (tmp_path / "bom.csv").write_bytes(b"\xef\xbb\xbf" + (HEADER + "\n0.5,chat,m,3,4\n").encode())
    t = read_trace(tmp_path / "bom.csv")
    assert t.arrival_s.tolist() == [0.5] and t.app_names().tolist() == ["chat"]


def test_duplicate_header_column_is_rejected(tmp_path):
    (tmp_path / "d.csv").write_text(HEADER + ",app\n0.5,chat,m,3,4,code\n")
    with pytest.raises(TraceError, match=r"d.csv:1: .*column 'app' appears twice"):
        read_trace(tmp_path / "d.csv")
