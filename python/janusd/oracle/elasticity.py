"""Elasticity GP: per-token SLO attainment s(z, m) of a model served by m instances, and
the smallest m reaching a target.

Monotone in m by construction, whatever the training data. m instances can always serve
a load at least as well as m' < m of them (route nothing to the extra ones), so the
estimate at m is the best of the raw estimates at 1..m:
- mean(m) = max over m' <= m of the raw GP mean (clipped to [0, 1]): a running maximum,
  the smallest non-decreasing curve above the raw one, depending only on m' <= m (so a
  caller's `limit` never changes an answer); std(m) is the raw std at the m' that gives
  that maximum (the latest on ties);
- the safety test of min_instances uses the same rule on the lower bound, lb(m) = max
  over m' <= m of (raw mean - margin * raw std), also non-decreasing, so a binary search
  over m is exact: its answer is the smallest m whose raw lower bound reaches the target.
Raw predictions are rounded to 1e-12 first: a GP's prediction for one row differs in
the last bits with the size of the batch it is computed in (BLAS blocking), which must
not make the estimate at m + 1 a hair below the one at m.
Raw predictions come from any source with raw(load, ms) -> (mean, std): the GP here, or
the roofline prior (oracle/prior.py), so both obey the same rule.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from janusd.oracle.gp import GPRegressor
from janusd.oracle.inputs import elasticity_inputs, feature_matrix
from janusd.oracle.types import AttainmentEstimate, LoadFeatures, MinInstances


class RawAttainment(Protocol):
    def raw_attainment(self, load: LoadFeatures, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


class ElasticityModel:
    def __init__(self, gp: GPRegressor) -> None:
        self.gp = gp

    @classmethod
    def fit(cls, features: np.ndarray, instances: np.ndarray, attainment: np.ndarray, seed: int = 0) -> ElasticityModel:
        """features: (n, 7) the model's whole load; instances: (n,) m; attainment: (n,) in [0, 1]."""
        a = np.asarray(attainment, dtype=np.float64)
        if a.shape != (len(features),) or np.any((a < 0) | (a > 1)):
            raise ValueError("attainment must be (n,) values in [0, 1]")
        return cls(GPRegressor.fit(elasticity_inputs(features, instances), a, seed=seed))

    def predict_rows(self, features: np.ndarray, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw (not yet monotone) mean and std per row."""
        return self.gp.predict(elasticity_inputs(features, instances))

    def raw_attainment(self, load: LoadFeatures, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ms = np.asarray(instances, dtype=np.float64)
        return self.predict_rows(np.repeat(feature_matrix([load]), len(ms), axis=0), ms)


def monotone_curve(raw_mean: np.ndarray, raw_std: np.ndarray, margin: float = 0.0
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, std, lower bound) for m = 1..len(raw): running maxima as in the module doc."""
    raw = np.round(np.asarray(raw_mean, dtype=np.float64), 12)
    mu = np.clip(raw, 0.0, 1.0)
    sd = np.maximum(np.round(np.asarray(raw_std, dtype=np.float64), 12), 0.0)
    mean = np.maximum.accumulate(mu)
    # index of the (latest) raw value equal to the running max at each m
    idx = np.zeros(len(mu), dtype=np.int64)
    best = -np.inf
    for i, v in enumerate(mu):
        if v >= best:
            best, j = v, i
        idx[i] = j
    lb = np.maximum.accumulate(raw - margin * sd)
    return mean, sd[idx], lb


def attainment_at(source: RawAttainment, load: LoadFeatures, m: int, name: str) -> AttainmentEstimate:
    if m < 1:
        raise ValueError(f"instances must be >= 1, got {m}")
    mu, sd = source.raw_attainment(load, np.arange(1, m + 1))
    mean, std, _ = monotone_curve(mu, sd)
    return AttainmentEstimate(float(mean[-1]), float(std[-1]), name)


def first_reaching(lb: np.ndarray, target: float) -> int | None:
    """Binary search on a non-decreasing array: the smallest 1-based m with lb[m-1] >= target."""
    lo, hi = 0, len(lb)  # answer index in [lo, hi]; hi = len means none
    while lo < hi:
        mid = (lo + hi) // 2
        if lb[mid] >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo + 1 if lo < len(lb) else None


def min_instances(source: RawAttainment, load: LoadFeatures, target: float, margin: float, limit: int,
                  name: str) -> MinInstances:
    """The smallest m in 1..limit whose predicted attainment minus margin * std reaches
    `target` (module doc); m None with a reason when none does."""
    if not (0.0 <= target <= 1.0) or margin < 0 or limit < 1:
        raise ValueError(f"need 0 <= target <= 1, margin >= 0, limit >= 1 (got {target}, {margin}, {limit})")
    mu, sd = source.raw_attainment(load, np.arange(1, limit + 1))
    mean, std, lb = monotone_curve(mu, sd, margin)
    m = first_reaching(lb, target)
    if m is None:
        best = AttainmentEstimate(float(mean[-1]), float(std[-1]), name)
        return MinInstances(None, best, f"{limit} instances reach {lb[-1]:.3f} (mean - {margin} std), "
                                        f"below the target {target}")
    return MinInstances(m, AttainmentEstimate(float(mean[m - 1]), float(std[m - 1]), name),
                        f"{m} instances reach the target {target}")
