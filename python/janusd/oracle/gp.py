"""One Gaussian-process regressor on standardised inputs and targets (scikit-learn).

Kernel: constant * anisotropic Matern(nu=2.5) + white noise: one length scale per input,
so a feature that does not matter gets a long scale instead of spoiling the fit; the
white term absorbs the measurement noise of a profile point (a replay is a sample).
Inputs are standardised here (mean 0, std 1 per column, kept with the model); targets by
sklearn's normalize_y.

Cost: the exact GP is O(n^3). Hyperparameters are optimised on at most OPT_POINTS rows
(an even thinning of the training set, deterministic), then the final model is fitted
on all rows with those hyperparameters fixed: one Cholesky of the full set. That keeps a
background refit of 2,000 points within seconds on a small CPU.

Prediction does not use sklearn: with the hyperparameters fixed, the model is K^-1 of
the training kernel matrix, computed here with numpy only (elementwise ufuncs, BLAS
matmuls and LAPACK inverse, all of which release the GIL). A daemon that loads a fit in
a thread therefore keeps serving: sklearn's own fit holds the GIL in scipy's Cholesky for
seconds at 2,000 points (measured: a 2.1 s stall of the event loop). Same kernel and
formulas as sklearn's GaussianProcessRegressor(normalize_y=True, alpha=1e-8).

State (to_state / from_state) is the kernel's log-hyperparameters (theta), the input
scaler and the training rows: refitting with the same theta and rows gives the same
predictions bit for bit, which is how persistence round-trips exactly.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

OPT_POINTS = 300
JITTER = 1e-8  # sklearn's default alpha: added to the training kernel's diagonal
_SQRT5 = 5.0**0.5


def _kernel(dims: int) -> Any:
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    return (ConstantKernel(1.0, (1e-3, 1e3)) * Matern(np.ones(dims), (1e-2, 1e3), nu=2.5)
            + WhiteKernel(1e-2, (1e-6, 1.0)))


def _thin(n: int, k: int) -> np.ndarray:
    """k indices spread evenly over range(n) (all of them when n <= k)."""
    if n <= k:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))


TREND_RIDGE = 1.0  # ridge penalty of the linear mean, on standardised inputs


def _ridge(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Weights w of y - mean(y) ~ (z - mean(z)) w with a ridge penalty (z standardised: mean ~0)."""
    zc = z - z.mean(axis=0)
    return np.linalg.solve(zc.T @ zc + TREND_RIDGE * np.eye(z.shape[1]), zc.T @ (y - y.mean()))


def _matern52(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Matern nu=5/2 correlation between rows of a and b (already divided by the length scales)."""
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    r = np.sqrt(np.maximum(d2, 0.0)) * _SQRT5
    return (1.0 + r + r * r / 3.0) * np.exp(-r)


class GPRegressor:
    """A fitted GP for one scalar target; build with fit() or from_state()."""

    def __init__(self, x: np.ndarray, y: np.ndarray, theta: np.ndarray, x_mean: np.ndarray, x_std: np.ndarray,
                 trend: bool = False) -> None:
        self.x = np.ascontiguousarray(x, dtype=np.float64)
        self.y = np.ascontiguousarray(y, dtype=np.float64)
        self.theta = np.asarray(theta, dtype=np.float64)
        self.x_mean = np.asarray(x_mean, dtype=np.float64)
        self.x_std = np.asarray(x_std, dtype=np.float64)
        if self.theta.shape != (self.x.shape[1] + 2,):
            raise ValueError(f"theta has shape {self.theta.shape}, expected ({self.x.shape[1] + 2},)")
        p = np.exp(self.theta)
        self._c, self._scale, self._white = float(p[0]), p[1:-1], float(p[-1])
        self.trend = trend
        self._w = _ridge((self.x - self.x_mean) / self.x_std, self.y) if trend else np.zeros(self.x.shape[1])
        resid = self.y - self._linear(self.x)
        self._y_mean = float(resid.mean())
        sd = float(resid.std())
        self._y_std = sd if sd > 0 else 1.0
        self._xs = ((self.x - self.x_mean) / self.x_std) / self._scale
        k = self._c * _matern52(self._xs, self._xs)
        k[np.diag_indices_from(k)] += self._white + JITTER
        self._k_inv = np.linalg.inv(k)
        self._alpha = self._k_inv @ ((resid - self._y_mean) / self._y_std)

    def _linear(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.x_mean) / self.x_std) @ self._w

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, seed: int = 0, restarts: int = 0, trend: bool = False) -> GPRegressor:
        """Optimise hyperparameters (on a thinning of at most OPT_POINTS rows), then fit all
        rows. trend: a linear mean (ridge regression on the standardised inputs, TREND_RIDGE)
        under the GP, which then models the residual: far from the data the prediction
        follows the trend instead of falling back to a constant."""
        from sklearn.gaussian_process import GaussianProcessRegressor

        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if x.ndim != 2 or y.shape != (len(x),) or len(x) < 2:
            raise ValueError(f"need x of shape (n>=2, d) and y of shape (n,), got {x.shape} and {y.shape}")
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            raise ValueError("training data holds a non-finite value")
        x_mean = x.mean(axis=0)
        x_std = x.std(axis=0)
        x_std[x_std < 1e-12] = 1.0
        sub = _thin(len(x), OPT_POINTS)
        z = (x - x_mean) / x_std
        target = y - z @ _ridge(z, y) if trend else y
        gp = GaussianProcessRegressor(_kernel(x.shape[1]), normalize_y=True, alpha=1e-8,
                                      n_restarts_optimizer=restarts, random_state=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning at a bound is expected, not an error
            gp.fit(z[sub], target[sub])
        return cls(x, y, gp.kernel_.theta, x_mean, x_std, trend)

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) per row of x; std includes the white-noise term, as sklearn's."""
        z = ((np.atleast_2d(np.asarray(x, dtype=np.float64)) - self.x_mean) / self.x_std) / self._scale
        ks = self._c * _matern52(z, self._xs)
        mean = ks @ self._alpha * self._y_std + self._y_mean + self._linear(np.atleast_2d(np.asarray(x, np.float64)))
        var = self._c + self._white - np.einsum("ij,ij->i", ks @ self._k_inv, ks)
        return mean, np.sqrt(np.maximum(var, 0.0)) * self._y_std

    def kernel_text(self) -> str:
        c, w = self._c, self._white
        return f"{c**0.5:.3g}**2 * Matern(length_scale={np.round(self._scale, 3).tolist()}, nu=2.5) + WhiteKernel({w:.3g})"

    def to_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON-able header, arrays) that from_state turns back into this model."""
        return ({"kernel": self.kernel_text(), "dims": int(self.x.shape[1]), "points": int(len(self.x)),
                 "trend": self.trend},
                {"x": self.x, "y": self.y, "theta": self.theta, "x_mean": self.x_mean, "x_std": self.x_std})

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray]) -> GPRegressor:
        x, y, theta = arrays["x"], arrays["y"], arrays["theta"]
        if x.ndim != 2 or y.shape != (len(x),) or theta.shape != _kernel(x.shape[1]).theta.shape:
            raise ValueError(f"inconsistent GP arrays: x {x.shape}, y {y.shape}, theta {theta.shape}")
        if arrays["x_mean"].shape != (x.shape[1],) or arrays["x_std"].shape != (x.shape[1],):
            raise ValueError("inconsistent GP arrays: scaler shape")
        return cls(x, y, theta, arrays["x_mean"], arrays["x_std"], bool(arrays.get("trend", False)))
