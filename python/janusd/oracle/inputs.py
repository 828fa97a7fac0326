"""The GP input rows built from load features (and, for elasticity, the instance count).

Rates and lengths span orders of magnitude and act multiplicatively on latency, so they
enter as log1p; a variance enters as its standard deviation, log1p too. The Elasticity
GP sees the rates *per instance* (rate / m: what each instance is asked to carry) plus
log m, so that its data from m = 1 and m = 3 fall on one axis of per-instance load and
it can still learn what m itself changes.
"""

from __future__ import annotations

import numpy as np

from janusd.oracle.types import LoadFeatures

N_FEATURES = len(LoadFeatures.__struct_fields__)
_RATES = [0, 1, 2]  # request_rate, input_token_rate, output_token_rate
_VARS = [4, 6]  # input_len_var, output_len_var


def feature_matrix(loads: list[LoadFeatures]) -> np.ndarray:
    return np.array([f.vector() for f in loads], dtype=np.float64).reshape(len(loads), N_FEATURES)


def _transform(f: np.ndarray) -> np.ndarray:
    f = np.maximum(np.asarray(f, dtype=np.float64), 0.0).copy()
    f[:, _VARS] = np.sqrt(f[:, _VARS])
    return np.log1p(f)


def capacity_inputs(features: np.ndarray) -> np.ndarray:
    """Rows of the Capacity GP: transformed features of the load one instance carries."""
    return _transform(np.atleast_2d(features))


def elasticity_inputs(features: np.ndarray, instances: np.ndarray) -> np.ndarray:
    """Rows of the Elasticity GP: features with rates per instance, and log m."""
    f = np.atleast_2d(np.asarray(features, dtype=np.float64)).copy()
    m = np.asarray(instances, dtype=np.float64).reshape(-1)
    if np.any(m < 1):
        raise ValueError("instance counts must be >= 1")
    f = np.broadcast_to(f, (len(m), f.shape[1])).copy() if len(f) == 1 else f
    f[:, _RATES] /= m[:, None]
    return np.hstack([_transform(f), np.log(m)[:, None]])
