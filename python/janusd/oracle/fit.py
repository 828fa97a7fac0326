"""Fitting the two GPs from points, the held-out split and the error figures.

Shared by `janus oracle eval`, `janus profile` (which fits what it measured) and the
daemon's online refit, so the three report errors the same way. Pure.

- The Capacity GP learns per-instance demand from the load one instance carried: the
  point's rates divided by m (lengths unchanged).
- The held-out split is by load point (point_id): whole replays are held out, never rows
  of one replay on both sides.
- Errors: attainment as absolute error in percentage points; capacity as relative error
  in percent, |pred - measured| / measured, over rows whose measured demand is at least
  REL_FLOOR of a device (below that a relative error measures noise, not the model).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from janusd.oracle.capacity import CapacityModel
from janusd.oracle.dataset import Points
from janusd.oracle.elasticity import ElasticityModel, monotone_curve
from janusd.oracle.inputs import feature_matrix
from janusd.oracle.types import LoadFeatures, RESOURCE_DIMS

REL_FLOOR = 1e-3
_RATES = [0, 1, 2]


def per_instance(features: np.ndarray, instances: np.ndarray) -> np.ndarray:
    f = np.array(features, dtype=np.float64, copy=True)
    f[:, _RATES] /= np.asarray(instances, dtype=np.float64)[:, None]
    return f


def fit_points(points: Points, seed: int = 0) -> tuple[CapacityModel, ElasticityModel]:
    if len(points) < 3:
        raise ValueError(f"need at least 3 points to fit, got {len(points)}")
    cap = CapacityModel.fit(per_instance(points.features, points.instances), points.resources, seed=seed)
    ela = ElasticityModel.fit(points.features, points.instances, points.attainment, seed=seed)
    return cap, ela


def bound(points: Points, max_points: int) -> Points:
    """The newest max_points rows (rows are in arrival order: the oldest go first)."""
    if len(points) <= max_points:
        return points
    keep = np.zeros(len(points), dtype=bool)
    keep[-max_points:] = True
    return points.take(keep)


def split_by_point(point_id: np.ndarray, test_fraction: float = 0.3, seed: int = 0) -> np.ndarray:
    """Boolean test mask: a random `test_fraction` of the distinct load points (at least one,
    and at least two left for training when there are three or more)."""
    ids = np.unique(point_id)
    rng = np.random.default_rng(seed)
    k = int(round(test_fraction * len(ids)))
    k = min(max(k, 1), max(len(ids) - 2, 1)) if len(ids) > 1 else 0
    test_ids = rng.choice(ids, size=k, replace=False) if k else np.array([], dtype=ids.dtype)
    return np.isin(point_id, test_ids)


def monotone_predictions(source: Any, points: Points) -> np.ndarray:
    """Each row's attainment as the Oracle would answer it (monotone projection over m)."""
    out = np.empty(len(points))
    for i in range(len(points)):
        load = LoadFeatures(*points.features[i].tolist())
        m = int(points.instances[i])
        mu, sd = source.raw_attainment(load, np.arange(1, m + 1))
        out[i] = monotone_curve(mu, sd)[0][-1]
    return out


def _p(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def errors(cap: Any, ela: Any, test: Points, prior: Any | None = None) -> dict[str, Any]:
    """The figures on `test` for a capacity source (CapacityModel or anything with
    capacity(model, load)) and a raw-attainment source, and the prior's when given."""
    per = per_instance(test.features, test.instances)
    prior_pred = None if prior is None else (monotone_predictions(prior, test), predict_capacity(prior, per))
    return errors_of(test, monotone_predictions(ela, test), predict_capacity(cap, per), prior_pred)


def _rel_p90(pred: np.ndarray, meas: np.ndarray) -> float | None:
    ok = meas >= REL_FLOOR
    return _p(np.abs(pred[ok] - meas[ok]) / meas[ok] * 100.0, 90)


_KEYS = {"hbm": "hbm", "compute": "compute", "bandwidth": "bw"}


def errors_of(test: Points, att_pred: np.ndarray, cap_pred: np.ndarray,
              prior_pred: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """The figures (module doc) from predictions in test's row order: attainment (n,),
    per-instance demand (n, 3); the prior's pair likewise."""
    att_err = np.abs(att_pred - test.attainment) * 100.0
    out: dict[str, Any] = {"attainment_abs_err_median_pts": _p(att_err, 50),
                           "attainment_abs_err_p90_pts": _p(att_err, 90)}
    for k, dim in enumerate(RESOURCE_DIMS):
        out[f"{_KEYS[dim]}_rel_err_p90_pct"] = _rel_p90(cap_pred[:, k], test.resources[:, k])
    if prior_pred is not None:
        p_att, p_cap = prior_pred
        out["prior_attainment_abs_err_median_pts"] = _p(np.abs(p_att - test.attainment) * 100.0, 50)
        out["prior_attainment_abs_err_p90_pts"] = _p(np.abs(p_att - test.attainment) * 100.0, 90)
        for k, dim in enumerate(RESOURCE_DIMS):
            out[f"prior_{_KEYS[dim]}_rel_err_p90_pct"] = _rel_p90(p_cap[:, k], test.resources[:, k])
    return out


def predict_capacity(source: Any, features: np.ndarray) -> np.ndarray:
    """(n, 3) mean demand from a CapacityModel (batched) or anything with capacity(model, load)."""
    if isinstance(source, CapacityModel):
        return source.predict(features)[0]
    return np.array([source.capacity("", LoadFeatures(*row.tolist())).mean for row in features]).reshape(-1, 3)


def loads_of(points: Points) -> list[LoadFeatures]:
    return [LoadFeatures(*row.tolist()) for row in points.features]


__all__ = ["bound", "errors", "feature_matrix", "fit_points", "split_by_point"]
