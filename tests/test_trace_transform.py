"""sample / compress / remap keep what the paper's replay needs to keep (PAPER.md §9)."""

import argparse
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd import trace_cli
from janusd.trace.formats import Trace, read_trace, write_trace
from janusd.trace.stats import trace_stats
from janusd.trace.synth import SynthParams, synthesize
from janusd.trace.transform import compress, parse_duration, remap_models, sample


def _trace(gaps, apps):
    n = len(gaps)
    return Trace.build(
        np.cumsum(gaps), [f"a{x}" for x in apps[:n]], ["m"] * n, np.arange(1, n + 1), np.arange(n + 1, 1, -1)
    )


traces = st.integers(2, 60).flatmap(
    lambda n: st.tuples(
        st.lists(st.floats(0.0, 1000.0), min_size=n, max_size=n), st.lists(st.integers(0, 4), min_size=n, max_size=n)
    )
)


@given(traces, st.floats(1.0, 1000.0))
def test_compress_keeps_order_identity_lengths_and_relative_gaps(data, factor):
    t = _trace(*data)
    c = compress(t, factor=factor)
    assert c.arrival_s[0] == 0.0
    assert np.all(np.diff(c.arrival_s) >= 0)
    assert c.app_names().tolist() == t.app_names().tolist()
    assert c.input_tokens.tolist() == t.input_tokens.tolist() and c.output_tokens.tolist() == t.output_tokens.tolist()
    np.testing.assert_allclose(c.arrival_s * factor, t.arrival_s - t.arrival_s[0], rtol=1e-12, atol=1e-9)


@given(traces, st.floats(1.0, 5000.0))
def test_compress_to_duration_hits_the_target_span(data, target):
    t = _trace(*data)
    if t.duration_s == 0:
        with pytest.raises(ValueError, match="spans no time"):
            compress(t, to_duration_s=target)
        return
    if t.duration_s / target < np.finfo(float).tiny:  # found by hypothesis: a span of 5e-324 s
        with pytest.raises(ValueError, match="too little to stretch"):
            compress(t, to_duration_s=target)
        return
    c = compress(t, to_duration_s=target)
    assert c.duration_s == pytest.approx(target, rel=1e-12)
    # relative timing: each arrival keeps its fraction of the span
    np.testing.assert_allclose(c.arrival_s / c.duration_s, (t.arrival_s - t.arrival_s[0]) / t.duration_s, atol=1e-12)


@given(traces, st.floats(0.01, 1.0), st.integers(0, 2**32 - 1))
def test_sample_is_an_ordered_subset_of_the_right_size(data, fraction, seed):
    t = _trace(*data)
    s = sample(t, fraction, seed)
    assert len(s) == int(round(fraction * len(t)))
    # input_tokens is 1..n, i.e. the row number: rows are a strictly increasing subsequence
    assert np.all(np.diff(s.input_tokens) > 0)
    idx = s.input_tokens - 1
    assert s.arrival_s.tolist() == t.arrival_s[idx].tolist()
    assert s.app_names().tolist() == t.app_names()[idx].tolist()
    assert sample(t, fraction, seed).input_tokens.tolist() == s.input_tokens.tolist()


def test_bad_arguments():
    t = _trace([1.0, 2.0], [0, 1])
    for kw in ({}, {"factor": 2.0, "to_duration_s": 1.0}, {"factor": 0.0}, {"factor": float("inf")}, {"to_duration_s": -1.0}):
        with pytest.raises(ValueError):
            compress(t, **kw)
    for f in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="fraction"):
            sample(t, f)
    assert parse_duration("30m") == 1800.0 and parse_duration("2h") == 7200.0 and parse_duration("90") == 90.0
    with pytest.raises(ValueError, match="bad duration"):
        parse_duration("soon")


def test_remap_models_round_robin_by_popularity():
    t = _trace([1.0] * 6, [0, 0, 0, 1, 1, 2])
    r = remap_models(t, ["big", "small"])
    assert dict(zip(r.app_names().tolist(), r.model_names().tolist(), strict=True)) == {"a0": "big", "a1": "small", "a2": "big"}
    with pytest.raises(ValueError):
        remap_models(t, [])


def test_day_into_thirty_minutes_end_to_end(tmp_path, capsys):
    day = synthesize(SynthParams(seed=2, hours=24, rate=0.3))
    write_trace(day, tmp_path / "day.csv")

    def cli(*argv):
        p = argparse.ArgumentParser()
        trace_cli.add_arguments(p)
        return trace_cli.run(p.parse_args(list(argv)))

    assert cli("sample", str(tmp_path / "day.csv"), "--fraction", "0.5", "--seed", "1", "--out", str(tmp_path / "half.csv")) == 0
    assert cli("compress", str(tmp_path / "half.csv"), "--to-duration", "30m", "--out", str(tmp_path / "c.csv")) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    c = read_trace(tmp_path / "c.csv")
    assert out["requests"] == len(c) == round(len(day) * 0.5)
    assert c.duration_s == pytest.approx(1800.0, abs=2e-6)
    before, after = trace_stats(read_trace(tmp_path / "half.csv")), trace_stats(c)
    assert after["top12pct_request_share"] == before["top12pct_request_share"]
    assert after["top30pct_token_share"] == before["top30pct_token_share"]
    assert cli("compress", str(tmp_path / "c.csv"), "--factor", "0", "--out", str(tmp_path / "x.csv")) == 2


def test_clip_lengths():
    from janusd.trace.transform import clip_lengths

    t = _trace([1.0, 1.0, 1.0], [0, 1, 2])  # inputs 1..3, outputs 4..2
    c = clip_lengths(t, max_input=2, max_output=3)
    assert c.input_tokens.tolist() == [1, 2, 2] and c.output_tokens.tolist() == [3, 3, 2]
    assert c.arrival_s.tolist() == t.arrival_s.tolist()
    with pytest.raises(ValueError, match="max_output must be >= 1"):
        clip_lengths(t, max_output=0)
