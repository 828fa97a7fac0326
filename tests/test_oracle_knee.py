"""oracle/knee.py: points go where attainment changes."""

from __future__ import annotations

import math

import numpy as np

from janusd.oracle.knee import GROWTH, next_rate


def curve(rate: float, knee: float = 10.0) -> float:
    return 1.0 / (1.0 + (rate / knee) ** 8)


def walk(start: float, floor: float, cap: float, knee: float, limit: int) -> tuple[list[tuple[float, float]], bool]:
    """The series next_rate measures on `curve` (at most `limit` points); whether it ended."""
    measured: list[tuple[float, float]] = []
    for _ in range(limit):
        r = next_rate(measured, start=start, floor=floor, cap=cap)
        if r is None:
            return measured, True
        assert floor <= r <= cap
        assert all(abs(math.log(r / x)) > 1e-9 for x, _ in measured)  # never the same rate twice
        measured.append((r, curve(r, knee)))
    return measured, False


def test_points_bracket_then_crowd_the_knee():
    measured, _ = walk(1.0, 0.05, 1000.0, 10.0, 14)
    rates = np.array([r for r, _ in measured])
    near = np.sum(np.abs(np.log(rates / 10.0)) < math.log(1.6))
    assert near >= len(rates) // 2, sorted(measured)  # most points within 1.6x of the knee
    assert min(a for _, a in measured) < 0.3 and max(a for _, a in measured) > 0.9  # both flats seen


def test_a_first_point_past_the_knee_goes_down_and_a_flat_series_stops():
    assert next_rate([(9.0, 0.1)], 9.0, 0.5, 100.0) == 9.0 / GROWTH
    assert next_rate([(1.0, 1.0)], 1.0, 0.5, 0.9 * GROWTH) is None  # cannot grow, nothing changes
    assert next_rate([(1.0, 0.95), (1.1, 0.5)], 1.0, 1.0, 1.1) is None  # adjacent rates closer than the ratio


def test_the_served_range_is_filled_before_the_knee_is_refined():
    # knee bracketed by 9 -> 27 (ratio 3), served rates 1 -> 3 (ratio 3): fill the served gap first
    served_wide = [(1.0, 1.0), (3.0, 1.0), (9.0, 0.7), (27.0, 0.0)]
    assert math.isclose(next_rate(served_wide, 1.0, 0.5, 100.0), math.sqrt(3.0))
    # served gaps all within 2x: refine the knee (9 -> 27 changes most)
    filled = served_wide + [(math.sqrt(3.0), 1.0)]
    assert math.isclose(next_rate(filled, 1.0, 0.5, 100.0), math.sqrt(9 * 27))
    # a served point found inside the knee bracket opens a new served gap (3 -> 15.6): filled next
    knee_found = filled + [(15.6, 0.95)]
    assert math.isclose(next_rate(knee_found, 1.0, 0.5, 100.0), math.sqrt(3.0 * 15.6))
    # the bracket itself comes before any fill: a series still growing grows
    assert next_rate([(1.0, 1.0), (3.0, 1.0)], 1.0, 0.5, 100.0) == 3.0 * GROWTH


def test_every_rate_stays_in_bounds_and_a_series_ends():
    measured, ended = walk(2.0, 0.125, 200.0, 40.0, 60)
    assert ended, sorted(measured)
    served = sorted(r for r, a in measured if a >= 0.9)
    assert all(b / a <= 2.0 for a, b in zip(served, served[1:], strict=False)), served
