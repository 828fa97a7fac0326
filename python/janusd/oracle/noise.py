"""The measurement's noise floor: how far one measurement of a load point lies from the
point's true value, estimated from repeats (pure).

Rows sharing a point_id are repeats of one load setting (profiling/ measures each point
`repeats` times). No model can predict a row better than the setting's expected value
mu, and a row's distance to mu is the noise; with n repeats a_1..a_n of mean a_bar,
E[(a_i - a_bar)^2] = sigma^2 (n - 1) / n, so |a_i - a_bar| * sqrt(n / (n - 1)) estimates
|a_i - mu| without bias in the square (for n = 2 it is |a_1 - a_2| / sqrt 2). The floor
is reported on the oracle's own scales, so it reads next to its errors (fit.py):
attainment in absolute points, compute and bandwidth relative in percent over the rows
whose point was served (attainment >= fit.SERVED) and whose demand is at least
fit.REL_FLOOR of a device. None where no point has two rows.

Back-to-back repeats share the machine's state of the moment, so they understate the
noise between runs: on the 2-core VM one setting read 0.096, 0.124 and 0.145 of the
device's bandwidth in three profiles hours apart while its back-to-back repeats agreed within
8% (bench/RESULTS.md "Twice the budget"). across_runs puts a number on that: the same settings
in two profiles of one model, each profile's point mean a repeat of the other's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from janusd.oracle.dataset import Points
from janusd.oracle.fit import REL_FLOOR, SERVED


def _deviations(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|v - group mean| * sqrt(n / (n - 1)), group mean) per row of groups with n >= 2."""
    dev = np.full(len(values), np.nan)
    mean = np.full(len(values), np.nan)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) < 2:
            continue
        mu = values[idx].mean()
        dev[idx] = np.abs(values[idx] - mu) * np.sqrt(len(idx) / (len(idx) - 1))
        mean[idx] = mu
    return dev, mean


def _pct(x: np.ndarray, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if len(x) else None


def noise_floor(points: Points) -> dict[str, Any]:
    """The floor's figures (module doc) and how many load points were repeated."""
    ids = points.point_id
    _, counts = np.unique(ids, return_counts=True)
    att_dev, att_mean = _deviations(points.attainment * 100.0, ids)
    out: dict[str, Any] = {"repeated_points": int((counts >= 2).sum()),
                           "noise_attainment_abs_dev_median_pts": _pct(att_dev, 50),
                           "noise_attainment_abs_dev_p90_pts": _pct(att_dev, 90)}
    served = att_mean >= SERVED * 100.0  # NaN (a point measured once) compares False
    for k, key in ((1, "compute"), (2, "bw")):
        dev, mean = _deviations(points.resources[served, k], ids[served])
        ok = np.isfinite(dev) & (mean >= REL_FLOOR)
        out[f"noise_{key}_rel_dev_p90_pct"] = _pct(dev[ok] / mean[ok] * 100.0, 90)
    return out


RATE_TOL = 0.02  # relative: a stratified trace's measured rate is the offered one within this
LENGTH_TOL = 0.1  # relative, on the mean prompt length: the same mix


def _point_means(points: Points) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per load point: (instances, rate, mean prompt length), attainment, compute, bandwidth."""
    rows = [points.point_id == i for i in np.unique(points.point_id)]
    key = np.array([[points.instances[r][0], points.features[r, 0].mean(), points.features[r, 3].mean()]
                    for r in rows]).reshape(len(rows), 3)
    att = np.array([points.attainment[r].mean() for r in rows])
    res = np.array([points.resources[r].mean(0) for r in rows]).reshape(len(rows), 3)
    return key, att, res[:, 1], res[:, 2]


def across_runs(points: Points, other: Points) -> dict[str, Any]:
    """The floor (module doc) between two profiles of one model: their load points matched
    on instance count, rate (RATE_TOL) and mean prompt length (LENGTH_TOL), each side's
    point mean one repeat. ValueError when the two are not profiles of the same model."""
    for field in ("model", "model_spec"):
        if points.header.get(field) != other.header.get(field):
            raise ValueError(f"not profiles of the same model: {field} {points.header.get(field)!r} "
                             f"against {other.header.get(field)!r}")
    ka, aa, ca, ba = _point_means(points)
    kb, ab, cb, bb = _point_means(other)
    att, comp, bw, group = [], [], [], []
    for i, k in enumerate(ka):
        j = np.flatnonzero((kb[:, 0] == k[0]) & (np.abs(np.log(kb[:, 1] / k[1])) < RATE_TOL)
                           & (np.abs(np.log(kb[:, 2] / k[2])) < LENGTH_TOL))
        if len(j) == 0:
            continue
        j = j[np.argmin(np.abs(np.log(kb[j, 1] / k[1])))]
        att += [aa[i], ab[j]]
        comp += [ca[i], cb[j]]
        bw += [ba[i], bb[j]]
        group += [i, i]
    g = np.array(group, dtype=np.int64)
    att_dev, att_mean = _deviations(np.array(att) * 100.0, g)
    out: dict[str, Any] = {"runs_matched_points": len(g) // 2, "runs_attainment_abs_dev_p90_pts": _pct(att_dev, 90)}
    served = att_mean >= SERVED * 100.0
    for key, vals in (("compute", comp), ("bw", bw)):
        dev, mean = _deviations(np.array(vals)[served], g[served])
        ok = np.isfinite(dev) & (mean >= REL_FLOOR)
        out[f"runs_{key}_rel_dev_p90_pct"] = _pct(dev[ok] / mean[ok] * 100.0, 90)
    return out
