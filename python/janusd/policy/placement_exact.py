"""The exact optimum of three-dimensional bin packing, by scipy's HiGHS MILP.

The reference placement.pack is measured against (tests, `janus bench placement`): the
fewest devices that hold a set of vectors, each device at most 1.0 per dimension.
Exponential in the worst case; meant for the small instances of a test or a benchmark
snapshot, not for the daemon.

Model: x[i, j] = 1 when vector i goes to device j, y[j] = 1 when device j is used;
minimise sum(y) subject to each vector on exactly one device, per device and dimension
sum_i v[i, d] x[i, j] <= y[j], and y[j] >= y[j + 1] with vector i only on devices j <= i
(symmetry breaking: the solver does not revisit the same packing under renamed devices).
The number of devices is bounded above by a heuristic packing when one is given.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from janusd.policy.bins import FIT_EPS


class ExactSolverError(RuntimeError):
    """HiGHS gave no optimal answer (time limit, numerical trouble); names its status."""


def lower_bound(vectors: Sequence[Sequence[float]] | np.ndarray) -> int:
    """ceil of the largest per-dimension sum: no packing uses fewer devices."""
    v = np.asarray(vectors, dtype=float).reshape(-1, 3)
    if len(v) == 0:
        return 0
    total = v.sum(axis=0)
    return int(np.ceil(total.max() - FIT_EPS))


def min_bins(vectors: Sequence[Sequence[float]] | np.ndarray, upper: int | None = None, time_limit_s: float = 60.0) -> int:
    """The fewest devices that hold every vector (each must fit one device alone)."""
    v = np.asarray(vectors, dtype=float).reshape(-1, 3)
    n = len(v)
    if n == 0:
        return 0
    if (v > 1.0 + FIT_EPS).any():
        raise ValueError("a vector exceeds one device: no packing exists")
    m = n if upper is None else min(n, upper)
    lb = lower_bound(v)
    if m <= lb:
        return m
    nx = n * m  # x[i, j] at i * m + j, then y[j] at nx + j
    cost = np.concatenate([np.zeros(nx), np.ones(m)])
    upper_x = np.zeros((n, m))
    for i in range(n):
        upper_x[i, : min(i + 1, m)] = 1.0  # vector i only on devices j <= i
    ub = np.concatenate([upper_x.ravel(), np.ones(m)])
    rows = n + 3 * m + (m - 1)
    a = lil_matrix((rows, nx + m))
    lo = np.empty(rows)
    hi = np.empty(rows)
    r = 0
    for i in range(n):  # each vector exactly once
        a[r, i * m : (i + 1) * m] = 1.0
        lo[r], hi[r] = 1.0, 1.0
        r += 1
    for j in range(m):  # capacity per dimension, only when the device is used
        for d in range(3):
            for i in range(n):
                if v[i, d] != 0.0:
                    a[r, i * m + j] = v[i, d]
            a[r, nx + j] = -1.0
            lo[r], hi[r] = -np.inf, FIT_EPS
            r += 1
    for j in range(m - 1):  # used devices first
        a[r, nx + j] = 1.0
        a[r, nx + j + 1] = -1.0
        lo[r], hi[r] = 0.0, np.inf
        r += 1
    res = milp(cost, constraints=LinearConstraint(a.tocsr(), lo, hi), integrality=np.ones(nx + m),
               bounds=Bounds(np.zeros(nx + m), ub), options={"time_limit": time_limit_s})
    if res.status != 0 or res.x is None:
        raise ExactSolverError(f"HiGHS did not prove an optimum: status {res.status} ({res.message})")
    return int(round(res.fun))
