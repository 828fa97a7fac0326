"""The measurement's noise floor: how far one measurement of a load point lies from the
point's true value, estimated from repeats (pure).

Rows sharing a point_id are repeats of one load setting (profile.py measures each point
`repeats` times). No model can predict a row better than the setting's expected value
mu, and a row's distance to mu is the noise; with n repeats a_1..a_n of mean a_bar,
E[(a_i - a_bar)^2] = sigma^2 (n - 1) / n, so |a_i - a_bar| * sqrt(n / (n - 1)) estimates
|a_i - mu| without bias in the square (for n = 2 it is |a_1 - a_2| / sqrt 2). The floor
is reported on the oracle's own scales, so it reads next to its errors (fit.py):
attainment in absolute points, compute and bandwidth relative in percent over the rows
whose point was served (attainment >= fit.SERVED) and whose demand is at least
fit.REL_FLOOR of a device. None where no point has two rows.
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
