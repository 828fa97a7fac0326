"""oracle/noise.py: the noise floor from repeated load points, against a brute-force count."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.oracle.dataset import Points
from janusd.oracle.noise import noise_floor


def pts(att: list[float], ids: list[int], compute: list[float] | None = None) -> Points:
    n = len(att)
    f = np.ones((n, 7))
    comp = np.array(compute if compute is not None else [0.1] * n)
    res = np.stack([np.full(n, 0.2), comp, 2 * comp], axis=1)
    return Points({}, f, np.ones(n, np.int64), res, np.array(att, float), np.array(ids, np.int64))


def test_pairs_give_half_the_gap_times_sqrt2_and_single_points_do_not_count():
    p = pts([1.0, 0.8, 0.5, 0.5, 0.3], [0, 0, 1, 1, 2], compute=[0.10, 0.12, 0.3, 0.1, 0.5])
    nf = noise_floor(p)
    assert nf["repeated_points"] == 2
    devs = [20 / 2**0.5] * 2 + [0.0, 0.0]  # |a1 - a2| / sqrt 2 per row of a pair, in points
    assert nf["noise_attainment_abs_dev_median_pts"] == pytest.approx(np.median(devs))
    assert nf["noise_attainment_abs_dev_p90_pts"] == pytest.approx(np.percentile(devs, 90))
    # capacity only where the point was served (mean attainment 0.9; point 1's 0.5 is not)
    rel = 0.02 / 2**0.5 / 0.11 * 100
    assert nf["noise_compute_rel_dev_p90_pct"] == pytest.approx(rel)
    assert nf["noise_bw_rel_dev_p90_pct"] == pytest.approx(rel)


def test_no_repeats_no_floor():
    nf = noise_floor(pts([1.0, 0.5, 0.2], [0, 1, 2]))
    assert nf == {"repeated_points": 0, "noise_attainment_abs_dev_median_pts": None,
                  "noise_attainment_abs_dev_p90_pts": None, "noise_compute_rel_dev_p90_pct": None,
                  "noise_bw_rel_dev_p90_pct": None}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(0, 1), min_size=1, max_size=4), min_size=1, max_size=6))
def test_floor_matches_a_brute_force_per_row_count(groups):
    att = [a for g in groups for a in g]
    ids = [i for i, g in enumerate(groups) for _ in g]
    brute = []
    for g in groups:
        if len(g) >= 2:
            mu = sum(g) / len(g)
            brute += [abs(a - mu) * 100 * (len(g) / (len(g) - 1)) ** 0.5 for a in g]
    nf = noise_floor(pts(att, ids))
    assert nf["repeated_points"] == sum(len(g) >= 2 for g in groups)
    if brute:
        assert nf["noise_attainment_abs_dev_p90_pts"] == pytest.approx(np.percentile(brute, 90), abs=1e-9)
    else:
        assert nf["noise_attainment_abs_dev_p90_pts"] is None
