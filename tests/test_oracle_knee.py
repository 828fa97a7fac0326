"""oracle/knee.py: points go where attainment changes."""

from __future__ import annotations

import math

import numpy as np

from janusd.oracle.knee import next_rate


def curve(rate: float, knee: float = 10.0) -> float:
    return 1.0 / (1.0 + (rate / knee) ** 8)


def test_points_bracket_then_crowd_the_knee():
    measured: list[tuple[float, float]] = []
    for _ in range(14):
        r = next_rate(measured, start=1.0, floor=0.05, cap=1000.0)
        if r is None:
            break
        measured.append((r, curve(r)))
    rates = np.array([r for r, _ in measured])
    near = np.sum(np.abs(np.log(rates / 10.0)) < math.log(1.6))
    assert near >= len(rates) // 2, sorted(measured)  # most points within 1.6x of the knee
    assert min(a for _, a in measured) < 0.3 and max(a for _, a in measured) > 0.9  # both flats seen


def test_a_first_point_past_the_knee_goes_down_and_a_flat_series_stops():
    assert next_rate([(9.0, 0.1)], 9.0, 0.5, 100.0) == 3.0
    assert next_rate([(1.0, 1.0)], 1.0, 0.5, 2.5) is None  # cannot grow, nothing changes
    assert next_rate([(1.0, 0.95), (1.1, 0.5)], 1.0, 1.0, 1.1) is None  # adjacent rates closer than the ratio
