"""The sliding-window primitive (janusd.telemetry.windows): bucket rule, eviction, moments."""

import random
import statistics
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd.telemetry.windows import Moments, SlidingWindow, bucket_index, span_buckets


def test_span_buckets_is_ceil_forgiving_float_noise():
    assert span_buckets(60.0, 1.0) == 60
    assert span_buckets(0.7, 0.1) == 7  # 6.999999999999999 in floats
    assert span_buckets(0.3, 0.1) == 3  # 2.9999999999999996
    assert span_buckets(1.0, 0.3) == 4
    assert span_buckets(2.5, 2.5) == 1
    assert span_buckets(10.0, 4.0) == 3


def test_bucket_index_floors_including_negative_times():
    assert bucket_index(0.0, 1.0) == 0
    assert bucket_index(0.999, 1.0) == 0
    assert bucket_index(1.0, 1.0) == 1
    assert bucket_index(-0.5, 1.0) == -1


@pytest.mark.parametrize("w,b", [(0, 1), (-1, 1), (1, 0), (1, -0.1), (1, 2), (float("nan"), 1), (1, float("inf"))])
def test_bad_window_args(w, b):
    with pytest.raises(ValueError):
        SlidingWindow(w, b, 1)


def test_event_leaves_when_its_bucket_is_n_buckets_old():
    w = SlidingWindow(3.0, 1.0, 1)
    w.add(0.9, 0, 5)  # bucket 0
    assert w.totals(2.99)[0].total == 5  # buckets 0..2
    assert w.totals(3.0)[0].n == 0  # buckets 1..3: bucket 0 left
    assert len(w) == 0


def test_backwards_time_is_clamped_into_the_newest_bucket():
    w = SlidingWindow(2.0, 1.0, 1)
    w.add(0.5, 0, 1)
    w.add(5.5, 0, 2)  # evicts bucket 0
    w.add(0.5, 0, 4)  # late: lands in bucket 5, does not revive bucket 0
    assert len(w) == 1
    assert w.totals(5.6)[0].total == 6
    assert w.totals(1.0)[0].total == 6  # a backwards query is the latest query
    assert w.totals(7.0)[0].total == 0


def test_bucket_count_is_bounded_by_the_window():
    w = SlidingWindow(5.0, 0.5, 2)
    t = 0.0
    for i in range(5000):
        t += random.Random(i).uniform(0, 0.2)
        w.add(t, i % 2, 1.0)
        assert len(w) <= w.n_buckets <= 5.0 / 0.5 + 1


@given(st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=60), st.integers(1, 7))
def test_moments_merge_matches_exact_population_variance(xs, chunk):
    acc = Moments()
    for i in range(0, len(xs), chunk):
        part = Moments()
        for x in xs[i : i + chunk]:
            part.add(x)
        acc.merge(part)
    mean = Fraction(sum(xs), len(xs))
    var = sum((x - mean) ** 2 for x in xs) / len(xs)
    assert acc.n == len(xs) and acc.total == sum(xs)
    assert acc.var == pytest.approx(float(var), rel=1e-9, abs=1e-6)


def test_variance_is_stable_at_large_means():
    xs = [10**12 + i % 3 for i in range(999)]  # variance 2/3, mean 1e12 + 1
    m = Moments()
    for x in xs:
        m.add(x)
    assert m.var == pytest.approx(2 / 3, rel=1e-6)
    # the naive sum-of-squares formula in floats loses it entirely (why Welford/Chan)
    naive = sum(float(x) ** 2 for x in xs) / len(xs) - (sum(xs) / len(xs)) ** 2
    assert naive != pytest.approx(2 / 3, rel=0.1)
    assert Moments.from_sums(len(xs), sum(xs), sum(x * x for x in xs)).var == pytest.approx(2 / 3, rel=1e-12)
    assert statistics.pvariance(xs) == pytest.approx(2 / 3)
