"""SLO accounting (janusd.trace.slo): hand-computed cases and a brute-force reference."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.trace import slo
from janusd.trace.slo import RequestAttainment, request_attainment


def test_all_tokens_on_time():
    assert request_attainment([0.5, 0.6, 0.7], 3, 1.0, 0.25) == RequestAttainment(3, 3, True, True, True)


def test_token_exactly_on_deadline_is_on_time():
    # deadlines 1.0, 1.25, 1.5 (exact in binary)
    assert request_attainment([1.0, 1.25, 1.5], 3, 1.0, 0.25) == RequestAttainment(3, 3, True, True, True)
    # ms -> s conversion rounding (0.1 + 2 * 0.1 etc.) still counts as on the deadline
    assert request_attainment([0.3, 0.4, 0.5], 3, 300 / 1000, 100 / 1000).on_time_tokens == 3
    # a microsecond late is late
    # (and its mean inter-token time 0.2500005 s exceeds 0.25 s)
    assert request_attainment([1.0, 1.25, 1.500001], 3, 1.0, 0.25) == RequestAttainment(2, 3, True, False, False)


def test_late_first_token_then_catch_up():
    # deadlines 1.0, 1.25, 1.5, 1.75 -> late, late, on, on
    r = request_attainment([1.3, 1.4, 1.45, 1.5], 4, 1.0, 0.25)
    assert r == RequestAttainment(2, 4, False, True, False)


def test_slow_decode_misses_tail_and_tpot():
    # deadlines 0.5, 0.75, 1.0, 1.25; mean inter-token time 0.4 > 0.25
    r = request_attainment([0.1, 0.5, 0.9, 1.3], 4, 0.5, 0.25)
    assert r == RequestAttainment(3, 4, True, False, False)


def test_failed_request_misses_every_token_even_delivered_ones():
    r = request_attainment([0.1, 0.2], 5, 1.0, 0.25, ok=False)
    assert r == RequestAttainment(0, 5, False, False, False)


def test_tokens_never_produced_count_as_missed():
    r = request_attainment([0.1, 0.2], 5, 1.0, 0.25)
    assert r == RequestAttainment(2, 5, True, False, False)


def test_zero_tokens_produced():
    assert request_attainment([], 3, 1.0, 0.25) == RequestAttainment(0, 3, False, False, False)
    assert request_attainment([], 3, 1.0, 0.25, ok=False) == RequestAttainment(0, 3, False, False, False)


def test_zero_tokens_expected_and_none_produced():
    assert request_attainment([], 0, 1.0, 0.25) == RequestAttainment(0, 0, True, True, True)
    assert request_attainment([], 0, 1.0, 0.25, ok=False) == RequestAttainment(0, 0, False, False, False)


def test_extra_tokens_beyond_expected_are_counted():
    assert request_attainment([0.1, 0.2, 5.0], 2, 1.0, 0.25) == RequestAttainment(2, 3, True, False, False)


def test_shape_errors_are_reported():
    with pytest.raises(ValueError, match="token_counts"):
        slo.evaluate(np.array([0.1]), np.array([2]), np.array([2]), np.array([True]), np.array([1.0]), np.array([0.1]))
    with pytest.raises(ValueError, match="ok has shape"):
        slo.evaluate(np.array([0.1]), np.array([1]), np.array([1]), np.array([True, True]), np.array([1.0]), np.array([0.1]))


def _reference(times, expected, ok, ttft, tpot):
    """Straight from the definition, one token at a time."""
    n = len(times)
    total = max(expected, n)
    on = sum(1 for i, t in enumerate(times) if ok and t <= ttft + i * tpot + 1e-9)
    ttft_met = ok and ((n >= 1 and times[0] <= ttft + 1e-9) or (n == 0 and expected == 0))
    tpot_met = ok and n >= expected and (n <= 1 or (times[-1] - times[0]) / (n - 1) <= tpot + 1e-9)
    return RequestAttainment(on, total, ttft_met, tpot_met, ok and n >= expected and on == total)


request = st.tuples(
    st.lists(st.floats(0.0, 5.0), max_size=12).map(sorted),
    st.integers(0, 12),
    st.booleans(),
    st.sampled_from([0.25, 0.5, 1.0, 2.0]),
    st.sampled_from([0.05, 0.1, 0.25]),
)


@given(st.lists(request, max_size=20))
def test_vectorised_matches_reference(reqs):
    times = np.array([t for r in reqs for t in r[0]], dtype=np.float64)
    o = slo.evaluate(
        times, np.array([len(r[0]) for r in reqs], dtype=np.int64), np.array([r[1] for r in reqs], dtype=np.int64),
        np.array([r[2] for r in reqs], dtype=bool), np.array([r[3] for r in reqs]), np.array([r[4] for r in reqs]),
    )  # fmt: skip
    for k, r in enumerate(reqs):
        got = RequestAttainment(int(o.on_time[k]), int(o.total[k]), bool(o.ttft_met[k]), bool(o.tpot_met[k]), bool(o.e2e_met[k]))
        assert got == _reference(*r)


def _outcomes():
    # app 0: request A perfect (2 tokens), request B failed (4 tokens)
    # app 1: request C 1 of 2 on time (second token late)
    times = np.array([0.1, 0.2, 0.1, 0.1, 9.0])
    counts = np.array([2, 1, 2])
    expected = np.array([2, 4, 2])
    ok = np.array([True, False, True])
    return slo.evaluate(times, counts, expected, ok, np.full(3, 1.0), np.full(3, 0.25))


def test_summarize_hand_computed():
    o = _outcomes()
    s = slo.summarize(o, np.array([0, 0, 1]), 2, duration_s=10.0)
    assert s["requests"] == 3 and s["ok_requests"] == 2
    assert s["tokens"] == 8 and s["tokens_on_time"] == 3
    assert s["token_attainment"] == pytest.approx(3 / 8)
    assert s["ttft_attainment"] == pytest.approx(2 / 3)  # A and C
    assert s["tpot_attainment"] == pytest.approx(1 / 3)  # C's mean gap 8.9 s
    assert s["e2e_attainment"] == pytest.approx(1 / 3)
    assert s["goodput_rps"] == pytest.approx(0.1)
    # app 0: 2 of 6 tokens, app 1: 1 of 2
    assert s["app_mean_token_attainment"] == pytest.approx((2 / 6 + 1 / 2) / 2)
    assert s["app_worst_token_attainment"] == pytest.approx(2 / 6)


def test_windows_hand_computed():
    o = _outcomes()
    w = slo.windows(o, np.array([0.0, 4.0, 12.0]), window_s=5.0, start_s=0.0, end_s=15.0)
    assert w["start_s"].tolist() == [0.0, 5.0, 10.0, 15.0]
    assert w["requests"].tolist() == [2, 0, 1, 0]
    assert w["load_rps"].tolist() == [0.4, 0.0, 0.2, 0.0]
    assert w["token_attainment"][0] == pytest.approx(2 / 6)
    assert math.isnan(w["token_attainment"][1])
    assert w["token_attainment"][2] == pytest.approx(0.5)
    assert w["e2e_attainment"][0] == pytest.approx(0.5)
    assert w["goodput_rps"].tolist() == [0.2, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        slo.windows(o, np.zeros(3), window_s=0)


@given(st.lists(request, min_size=1, max_size=30), st.lists(st.floats(0.0, 100.0), min_size=30, max_size=30),
       st.sampled_from([1.0, 7.5, 30.0]))  # fmt: skip
def test_windows_partition_the_requests(reqs, arrivals, window):
    arrival = np.sort(np.array(arrivals[: len(reqs)]))
    times = np.array([t for r in reqs for t in r[0]], dtype=np.float64)
    o = slo.evaluate(
        times, np.array([len(r[0]) for r in reqs]), np.array([r[1] for r in reqs]),
        np.array([r[2] for r in reqs], dtype=bool), np.array([r[3] for r in reqs]), np.array([r[4] for r in reqs]),
    )  # fmt: skip
    w = slo.windows(o, arrival, window, start_s=0.0)
    assert w["requests"].sum() == len(reqs)
    assert w["goodput_rps"].sum() * window == pytest.approx(o.e2e_met.sum())
    # token attainment per window, weighted by the window's tokens, gives the overall figure
    tok = np.array([o.total[(arrival // window).astype(int) == k].sum() for k in range(len(w["start_s"]))])
    if tok.sum() > 0:
        overall = np.nansum(np.where(tok > 0, w["token_attainment"], 0) * tok) / tok.sum()
        assert overall == pytest.approx(o.on_time.sum() / o.total.sum())


@settings(max_examples=200)
@given(
    st.lists(st.floats(0.0, 5.0, allow_nan=False), max_size=12).map(sorted),
    st.integers(0, 14), st.floats(0.01, 2.0), st.floats(0.001, 0.5), st.booleans(),
)
def test_request_attainment_agrees_with_the_vectorised_evaluate(times, expected, ttft, tpot, ok):
    import numpy as np

    from janusd.trace.slo import evaluate

    one = request_attainment(times, expected, ttft, tpot, ok)
    o = evaluate(np.array(times, dtype=np.float64), np.array([len(times)]), np.array([expected]), np.array([ok]),
                 np.array([ttft]), np.array([tpot]))
    assert one == (int(o.on_time[0]), int(o.total[0]), bool(o.ttft_met[0]), bool(o.tpot_met[0]),
                   bool(o.e2e_met[0]))


@settings(max_examples=200)
@given(
    st.lists(st.sampled_from([0.1, 0.5, 1.0, 1.25, 2.0, 3.0]), max_size=40).map(sorted),
    st.integers(0, 44), st.floats(0.01, 2.0), st.floats(0.0, 0.5), st.booleans(),
)
def test_request_attainment_with_tokens_delivered_together(times, expected, ttft, tpot, ok):
    # runs of equal times take the bisecting path; the rule is the same per token
    one = request_attainment(times, expected, ttft, tpot, ok)
    per_token = sum(t <= ttft + i * tpot + slo.EPS_S for i, t in enumerate(times)) if ok else 0
    assert one.on_time_tokens == per_token
