"""Fitting the two GPs from points, the held-out split and the error figures.

Shared by `janus oracle eval`, `janus profile` (which fits what it measured) and the
daemon's online refit, so the three report errors the same way. Pure.

- The Capacity GP learns per-instance demand from the load one instance carried: the
  point's rates divided by m (lengths unchanged), and only from points whose load was
  served (attainment >= SERVED): past the knee the device saturates, and what it then
  uses is its own limit, not what the load asks for (placement wants the demand). With
  fewer than MIN_SERVED such points, the MIN_SERVED best-served ones (served_mask). Its
  errors are reported over the points with attainment >= SERVED.
- The held-out split is by load point (point_id): whole replays are held out, never rows
  of one replay on both sides.
- The Elasticity GP's inputs (elasticity.py INPUT_SETS) are chosen per fit when there is
  a prior: each candidate is fitted on SELECT_FOLDS folds of whole load points (at most
  SELECT_ROWS rows, evenly thinned, so a 2,000-point online refit pays for a few small
  fits) and the one with the smaller mean held-out error wins ("full" on a tie, or with
  fewer than SELECT_MIN_POINTS load points).
- With a prior, the Capacity GP's bandwidth mean is capacity.py's "step-rate" form (its
  saturating steps per second). Choosing between it and "prior" per fit by 3 inner folds
  (as the Elasticity inputs) was tried and not kept: on 7-10 load points the choice
  flipped between folds and did no better than either form (bench/RESULTS.md "oracle").
  Its steps are timed by step_rate.fit_step_time on the training points' engine counters
  (all rows that have them, served or not), or by the device's step time without them.
- Errors: attainment as absolute error in percentage points; capacity as relative error
  in percent, |pred - measured| / measured, over rows whose measured demand is at least
  REL_FLOOR of a device (below that a relative error measures noise, not the model).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from janusd.oracle import step_rate
from janusd.oracle.capacity import CapacityModel
from janusd.oracle.dataset import Points
from janusd.oracle.elasticity import INPUT_SETS, ElasticityModel, monotone_curve
from janusd.oracle.types import RESOURCE_DIMS, LoadFeatures

REL_FLOOR = 1e-3
SERVED = 0.8
MIN_SERVED = 3
SELECT_FOLDS = 3
SELECT_ROWS = 200
SELECT_MIN_POINTS = 4


def served_mask(attainment: np.ndarray) -> np.ndarray:
    """The points the Capacity GP learns from (module doc)."""
    a = np.asarray(attainment)
    mask = a >= SERVED
    if mask.sum() < MIN_SERVED and len(a) >= MIN_SERVED:
        mask = a >= np.sort(a)[-MIN_SERVED]
    return mask
_RATES = [0, 1, 2]


def per_instance(features: np.ndarray, instances: np.ndarray) -> np.ndarray:
    f = np.array(features, dtype=np.float64, copy=True)
    f[:, _RATES] /= np.asarray(instances, dtype=np.float64)[:, None]
    return f


def choose_input_set(points: Points, prior: Any | None, seed: int = 0) -> tuple[str, dict[str, float]]:
    """The Elasticity GP's input set for these points (module doc) and each candidate's mean
    held-out absolute error in attainment points (empty when nothing was compared)."""
    if prior is None:
        return "full", {}
    sub = _thinned(points)
    ids = np.unique(sub.point_id)
    if len(ids) < SELECT_MIN_POINTS:
        return "full", {}
    rng = np.random.default_rng(seed)
    parts = np.array_split(rng.permutation(ids), SELECT_FOLDS)
    scores: dict[str, float] = {}
    for name in INPUT_SETS:
        err = []
        for part in parts:
            test = np.isin(sub.point_id, part)
            train, held = sub.take(~test), sub.take(test)
            if len(train) < 2:
                continue
            ela = ElasticityModel.fit(train.features, train.instances, train.attainment, seed=seed, prior=prior,
                                      input_set=name)
            err.append(np.abs(monotone_predictions(ela, held) - held.attainment))
        scores[name] = float(np.concatenate(err).mean() * 100.0) if err else float("inf")
    best = min(INPUT_SETS, key=lambda k: (scores[k], k != "full"))
    return best, scores


def _fit_capacity(points: Points, prior: Any | None, seed: int, bw_form: str) -> CapacityModel:
    served = served_mask(points.attainment)
    # the step time from every row with engine counters, served or not: the large batches
    # past the knee are what price a sequence in a step
    measured = step_rate.fit_step_time(points.features, points.engine) if bw_form == "step-rate" else None
    return CapacityModel.fit(per_instance(points.features[served], points.instances[served]), points.resources[served],
                             prior, seed=seed, bw_form=bw_form, instances=points.instances[served], step_time=measured)


def _thinned(points: Points) -> Points:
    """At most SELECT_ROWS rows, evenly thinned (the selections' training sets)."""
    if len(points) <= SELECT_ROWS:
        return points
    keep = np.zeros(len(points), dtype=bool)
    keep[np.unique(np.linspace(0, len(points) - 1, SELECT_ROWS).round().astype(np.int64))] = True
    return points.take(keep)


def fit_points(points: Points, seed: int = 0, prior: Any | None = None) -> tuple[CapacityModel, ElasticityModel]:
    """Both GPs on all of `points`; with a prior, the Capacity GP learns its correction
    (bandwidth over the step-rate mean) and the Elasticity GP's input set is
    chosen (choose_input_set)."""
    if len(points) < 3:
        raise ValueError(f"need at least 3 points to fit, got {len(points)}")
    cap = _fit_capacity(points, prior, seed, "prior" if prior is None else "step-rate")
    input_set, _ = choose_input_set(points, prior, seed)
    ela = ElasticityModel.fit(points.features, points.instances, points.attainment, seed=seed, prior=prior,
                              input_set=input_set)
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
        out[i] = monotone_curve(mu, sd)[0][-1]  # one answer per row: the batch needs no grid
    return out


def _p(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def errors(cap: Any, ela: Any, test: Points, prior: Any | None = None) -> dict[str, Any]:
    """The figures on `test` for a capacity source (CapacityModel or anything with
    capacity(model, load)) and a raw-attainment source, and the prior's when given."""
    per = per_instance(test.features, test.instances)
    prior_pred = None if prior is None else (monotone_predictions(prior, test), predict_capacity(prior, per))
    return errors_of(test, monotone_predictions(ela, test), predict_capacity(cap, per, test.instances), prior_pred)


def _rel_p90(pred: np.ndarray, meas: np.ndarray, served: np.ndarray) -> float | None:
    ok = (meas >= REL_FLOOR) & served
    return _p(np.abs(pred[ok] - meas[ok]) / meas[ok] * 100.0, 90)


_KEYS = {"hbm": "hbm", "compute": "compute", "bandwidth": "bw"}


def errors_of(test: Points, att_pred: np.ndarray, cap_pred: np.ndarray,
              prior_pred: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """The figures (module doc) from predictions in test's row order: attainment (n,),
    per-instance demand (n, 3); the prior's pair likewise."""
    att_err = np.abs(att_pred - test.attainment) * 100.0
    out: dict[str, Any] = {"attainment_abs_err_median_pts": _p(att_err, 50),
                           "attainment_abs_err_p90_pts": _p(att_err, 90)}
    served = test.attainment >= SERVED
    for k, dim in enumerate(RESOURCE_DIMS):
        out[f"{_KEYS[dim]}_rel_err_p90_pct"] = _rel_p90(cap_pred[:, k], test.resources[:, k], served)
    if prior_pred is not None:
        p_att, p_cap = prior_pred
        out["prior_attainment_abs_err_median_pts"] = _p(np.abs(p_att - test.attainment) * 100.0, 50)
        out["prior_attainment_abs_err_p90_pts"] = _p(np.abs(p_att - test.attainment) * 100.0, 90)
        for k, dim in enumerate(RESOURCE_DIMS):
            out[f"prior_{_KEYS[dim]}_rel_err_p90_pct"] = _rel_p90(p_cap[:, k], test.resources[:, k], served)
    return out


def predict_capacity(source: Any, features: np.ndarray, instances: np.ndarray | None = None) -> np.ndarray:
    """(n, 3) mean demand from a CapacityModel (batched, each row's load shared by `instances`)
    or anything with capacity(model, load)."""
    if isinstance(source, CapacityModel):
        return source.predict(features, instances)[0]
    return np.array([source.capacity("", LoadFeatures(*row.tolist())).mean for row in features]).reshape(-1, 3)

