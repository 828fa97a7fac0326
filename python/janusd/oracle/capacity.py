"""Capacity GP: a model's per-instance demand (HBM, compute, bandwidth) as a function of
the load it carries, one GP per dimension (oracle/gp.py) on oracle/inputs.py's rows.

Targets are fractions of one device (RESOURCE_DIMS order). Predictions are clipped at 0
(a demand is never negative; the GP's mean can dip below near zero load).
"""

from __future__ import annotations

import numpy as np

from janusd.oracle.gp import GPRegressor
from janusd.oracle.inputs import capacity_inputs, feature_matrix
from janusd.oracle.types import RESOURCE_DIMS, LoadFeatures, ResourceEstimate


class CapacityModel:
    def __init__(self, gps: list[GPRegressor]) -> None:
        if len(gps) != len(RESOURCE_DIMS):
            raise ValueError(f"need {len(RESOURCE_DIMS)} GPs, got {len(gps)}")
        self.gps = gps

    @classmethod
    def fit(cls, features: np.ndarray, targets: np.ndarray, seed: int = 0) -> CapacityModel:
        """features: (n, 7) LoadFeatures rows of the load one instance carried; targets:
        (n, 3) measured demand of that instance."""
        t = np.asarray(targets, dtype=np.float64)
        if t.ndim != 2 or t.shape[1] != len(RESOURCE_DIMS) or len(t) != len(features):
            raise ValueError(f"targets must have shape ({len(features)}, {len(RESOURCE_DIMS)}), got {t.shape}")
        x = capacity_inputs(features)
        return cls([GPRegressor.fit(x, t[:, k], seed=seed) for k in range(len(RESOURCE_DIMS))])

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std), each (n, 3)."""
        x = capacity_inputs(features)
        out = [gp.predict(x) for gp in self.gps]
        mean = np.maximum(np.stack([m for m, _ in out], axis=1), 0.0)
        return mean, np.stack([s for _, s in out], axis=1)

    def capacity(self, load: LoadFeatures) -> ResourceEstimate:
        mean, std = self.predict(feature_matrix([load]))
        return ResourceEstimate(tuple(float(v) for v in mean[0]), tuple(float(v) for v in std[0]), "gp")  # type: ignore[arg-type]
