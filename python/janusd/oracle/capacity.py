"""Capacity GP: a model's per-instance demand (HBM, compute, bandwidth) as a function of
the load it carries, one GP per dimension (oracle/gp.py) on oracle/inputs.py's rows.

Targets are fractions of one device (RESOURCE_DIMS order). With a roofline prior (the
usual case) each GP learns the log of measured / prior demand, i.e. the prior is the
mean function and the GP its correction: compute and bandwidth are counted quantities
the prior already gets the shape of (linear in the token rates), so what is left to learn
is a slowly varying factor (delivered vs offered work, step overheads, batching), which
a handful of profile points pins down where a GP from scratch would need the whole
surface. Prediction: prior x exp(GP mean); std by the delta method (prior x exp(mean) x
GP std). Without a prior the GPs learn the demand itself (clipped at 0 on prediction).
Each GP has a linear mean (gp.py `trend`, as the Elasticity GP): the correction drifts
with the load (batching amortises a step's weight read and host time over more tokens as
the rate grows), so a held-out load beyond the training points follows that drift instead
of falling back to the prior's shape. On the three profiles of bench/RESULTS.md "oracle"
it cut the held-out compute / bandwidth P90s by ~25% (sum over the six, folds seeded 0-2).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from janusd.oracle.gp import GPRegressor
from janusd.oracle.inputs import capacity_inputs, feature_matrix
from janusd.oracle.types import RESOURCE_DIMS, LoadFeatures, ResourceEstimate

FLOOR = 1e-6  # demands below this (a fraction of a device) are taken as this in the log ratio


def prior_demand(prior: Any, features: np.ndarray) -> np.ndarray:
    """(n, 3) the prior's per-instance demand for rows of per-instance load features."""
    rows = [prior.capacity("", LoadFeatures(*f.tolist())).mean for f in np.atleast_2d(features)]
    return np.maximum(np.array(rows, dtype=np.float64).reshape(-1, len(RESOURCE_DIMS)), FLOOR)


class CapacityModel:
    def __init__(self, gps: list[GPRegressor], prior: Any | None = None) -> None:
        if len(gps) != len(RESOURCE_DIMS):
            raise ValueError(f"need {len(RESOURCE_DIMS)} GPs, got {len(gps)}")
        self.gps = gps
        self.prior = prior

    @staticmethod
    def targets(features: np.ndarray, measured: np.ndarray, prior: Any | None) -> np.ndarray:
        """What the GPs learn from measured demand: log(measured / prior), or the demand itself."""
        t = np.asarray(measured, dtype=np.float64)
        if prior is None:
            return t
        return np.log(np.maximum(t, FLOOR)) - np.log(prior_demand(prior, features))

    @classmethod
    def fit(cls, features: np.ndarray, measured: np.ndarray, prior: Any | None = None, seed: int = 0) -> CapacityModel:
        """features: (n, 7) LoadFeatures rows of the load one instance carried; measured:
        (n, 3) that instance's demand; prior: a RooflinePrior to learn the correction of."""
        t = np.asarray(measured, dtype=np.float64)
        if t.ndim != 2 or t.shape[1] != len(RESOURCE_DIMS) or len(t) != len(features):
            raise ValueError(f"measured must have shape ({len(features)}, {len(RESOURCE_DIMS)}), got {t.shape}")
        x = capacity_inputs(features)
        y = cls.targets(features, t, prior)
        return cls([GPRegressor.fit(x, y[:, k], seed=seed, trend=True) for k in range(len(RESOURCE_DIMS))], prior)

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std), each (n, 3)."""
        x = capacity_inputs(features)
        out = [gp.predict(x) for gp in self.gps]
        mean = np.stack([m for m, _ in out], axis=1)
        std = np.stack([s for _, s in out], axis=1)
        if self.prior is None:
            return np.maximum(mean, 0.0), std
        base = prior_demand(self.prior, features)
        scaled = base * np.exp(mean)
        return scaled, scaled * std

    def capacity(self, load: LoadFeatures) -> ResourceEstimate:
        mean, std = self.predict(feature_matrix([load]))
        return ResourceEstimate(tuple(float(v) for v in mean[0]), tuple(float(v) for v in std[0]), "gp")  # type: ignore[arg-type]
