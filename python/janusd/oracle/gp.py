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

State (to_state / from_state) is the kernel's log-hyperparameters (theta), the input
scaler and the training rows: refitting with the same theta and rows gives the same
predictions bit for bit, which is how persistence round-trips exactly.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

OPT_POINTS = 300


def _kernel(dims: int) -> Any:
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

    return (ConstantKernel(1.0, (1e-3, 1e3)) * Matern(np.ones(dims), (1e-2, 1e3), nu=2.5)
            + WhiteKernel(1e-2, (1e-6, 1.0)))


def _thin(n: int, k: int) -> np.ndarray:
    """k indices spread evenly over range(n) (all of them when n <= k)."""
    if n <= k:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))


class GPRegressor:
    """A fitted GP for one scalar target; build with fit() or from_state()."""

    def __init__(self, x: np.ndarray, y: np.ndarray, theta: np.ndarray, x_mean: np.ndarray, x_std: np.ndarray) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor

        self.x = np.ascontiguousarray(x, dtype=np.float64)
        self.y = np.ascontiguousarray(y, dtype=np.float64)
        self.theta = np.asarray(theta, dtype=np.float64)
        self.x_mean = np.asarray(x_mean, dtype=np.float64)
        self.x_std = np.asarray(x_std, dtype=np.float64)
        kernel = _kernel(self.x.shape[1]).clone_with_theta(self.theta)
        self._gp = GaussianProcessRegressor(kernel, optimizer=None, normalize_y=True, alpha=1e-8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._gp.fit((self.x - self.x_mean) / self.x_std, self.y)

    @classmethod
    def fit(cls, x: np.ndarray, y: np.ndarray, seed: int = 0, restarts: int = 0) -> GPRegressor:
        """Optimise hyperparameters (on a thinning of at most OPT_POINTS rows), then fit all rows."""
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
        gp = GaussianProcessRegressor(_kernel(x.shape[1]), normalize_y=True, alpha=1e-8,
                                      n_restarts_optimizer=restarts, random_state=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ConvergenceWarning at a bound is expected, not an error
            gp.fit((x[sub] - x_mean) / x_std, y[sub])
        return cls(x, y, gp.kernel_.theta, x_mean, x_std)

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std) per row of x."""
        z = (np.atleast_2d(np.asarray(x, dtype=np.float64)) - self.x_mean) / self.x_std
        mean, std = self._gp.predict(z, return_std=True)
        return np.asarray(mean, dtype=np.float64), np.asarray(std, dtype=np.float64)

    def to_state(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON-able header, arrays) that from_state turns back into this model."""
        return ({"kernel": str(self._gp.kernel_), "dims": int(self.x.shape[1]), "points": int(len(self.x))},
                {"x": self.x, "y": self.y, "theta": self.theta, "x_mean": self.x_mean, "x_std": self.x_std})

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray]) -> GPRegressor:
        x, y, theta = arrays["x"], arrays["y"], arrays["theta"]
        if x.ndim != 2 or y.shape != (len(x),) or theta.shape != _kernel(x.shape[1]).theta.shape:
            raise ValueError(f"inconsistent GP arrays: x {x.shape}, y {y.shape}, theta {theta.shape}")
        if arrays["x_mean"].shape != (x.shape[1],) or arrays["x_std"].shape != (x.shape[1],):
            raise ValueError("inconsistent GP arrays: scaler shape")
        return cls(x, y, theta, arrays["x_mean"], arrays["x_std"])
