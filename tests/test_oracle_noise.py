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


def profile(rates: list[float], att: list[float], bw: list[float], model: str = "demo:x", m: int = 1) -> Points:
    """One row per load point: rate, prompt length 96, compute bw / 2."""
    n = len(rates)
    f = np.ones((n, 7))
    f[:, 0] = rates
    f[:, 3] = 96.0
    res = np.stack([np.full(n, 0.2), np.array(bw) / 2, np.array(bw)], axis=1)
    return Points({"model": model, "model_spec": {"layers": 4}}, f, np.full(n, m, np.int64), res,
                  np.array(att, float), np.arange(n, dtype=np.int64))


def test_across_runs_matches_settings_and_takes_each_runs_mean_as_a_repeat():
    from janusd.oracle.noise import across_runs

    a = profile([2.0, 6.0, 18.0, 30.0], [1.0, 1.0, 0.5, 1.0], [0.10, 0.20, 0.05, 0.3])
    b = profile([2.0, 6.005, 18.0, 54.0], [1.0, 0.9, 0.2, 1.0], [0.12, 0.20, 0.04, 0.3])  # 30 and 54 unmatched
    out = across_runs(a, b)
    assert out["runs_matched_points"] == 3
    att_devs = [0.0, 0.0, 10 / 2**0.5, 10 / 2**0.5, 30 / 2**0.5, 30 / 2**0.5]
    assert out["runs_attainment_abs_dev_p90_pts"] == pytest.approx(np.percentile(att_devs, 90))
    # bandwidth over the settings served in both means (2 and 6 req/s; 18's mean 0.35 is not)
    rel = [0.01 * 2**0.5 / 0.11 * 100] * 2 + [0.0, 0.0]
    assert out["runs_bw_rel_dev_p90_pct"] == pytest.approx(np.percentile(rel, 90))
    assert out["runs_compute_rel_dev_p90_pct"] == pytest.approx(np.percentile(rel, 90))
    # another instance count is another setting
    assert across_runs(a, profile([2.0], [1.0], [0.1], m=2))["runs_matched_points"] == 0


def test_across_runs_refuses_another_model():
    from janusd.oracle.noise import across_runs

    with pytest.raises(ValueError, match="same model"):
        across_runs(profile([2.0], [1.0], [0.1]), profile([2.0], [1.0], [0.1], model="demo:y"))
