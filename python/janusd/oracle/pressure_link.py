"""A two-number logistic calibration of the roofline prior's pressure: attainment =
1 / (1 + exp(-slope * (knee - log rho))).

Why: on every profile in bench/oracle the prior *orders* the load points by difficulty
almost perfectly (a higher pressure never came with a clearly higher attainment), while
its absolute knee is off by 4x or more (it cannot see that the daemon, the replayer and
the workers share the host's cores). A curve of two numbers fitted to where the measured
knee lies therefore transfers from one length mix and instance count to another, where
a GP over nine inputs, trained on seven to ten load points with one or two of them at
the knee, extrapolates a held-out knee point to ~1.0 (bench/RESULTS.md "oracle").

Fit: maximum likelihood of the measured attainments as fractional Bernoulli outcomes
(the binomial deviance, what logistic regression minimises), not least squares on
clipped logits: an attainment of exactly 1.0 has no logit, and the clip made the many
served points outweigh the few at the knee. A ridge on log(slope) around SLOPE_PRIOR
keeps the slope finite when the points are separable (every served point below every
failed one in pressure, the usual case), where the likelihood alone would make the curve
a step. With no failed point at all the knee is not identified and the fit puts it just
past the hardest served load: the model then says "no knee seen" and the GP's residual
and std (elasticity.py) carry the rest.

Monotone: slope > 0 by construction (it is fitted as its log), and the prior's pressure
falls as m grows (prior.py), so the calibrated attainment never falls with m.
"""

from __future__ import annotations

import numpy as np

SLOPE_PRIOR = 6.0  # per unit of log pressure: a 2x pressure step crosses from ~0.9 to ~0.1
SLOPE_RIDGE = 0.05  # weight of (log slope - log SLOPE_PRIOR)^2 beside the mean deviance
_P_CLIP = 1e-6


class PressureLink:
    """knee (in log pressure) and slope; logit(log_rho) = slope * (knee - log_rho)."""

    def __init__(self, knee: float, slope: float) -> None:
        if not (np.isfinite(knee) and np.isfinite(slope) and slope > 0):
            raise ValueError(f"a pressure link needs a finite knee and a slope > 0, got {knee}, {slope}")
        self.knee = float(knee)
        self.slope = float(slope)

    def logit(self, log_rho: np.ndarray) -> np.ndarray:
        return self.slope * (self.knee - np.asarray(log_rho, dtype=np.float64))

    def attainment(self, log_rho: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.clip(self.logit(log_rho), -700.0, 700.0)))

    def to_state(self) -> dict[str, float]:
        return {"knee": self.knee, "slope": self.slope}

    @classmethod
    def from_state(cls, state: object) -> PressureLink:
        if not (isinstance(state, dict) and isinstance(state.get("knee"), int | float)
                and isinstance(state.get("slope"), int | float)):
            raise ValueError(f"a pressure link is {{'knee': number, 'slope': number}}, got {state!r}")
        return cls(float(state["knee"]), float(state["slope"]))

    @classmethod
    def fit(cls, log_rho: np.ndarray, attainment: np.ndarray) -> PressureLink:
        from scipy.optimize import minimize

        x = np.asarray(log_rho, dtype=np.float64).reshape(-1)
        a = np.asarray(attainment, dtype=np.float64).reshape(-1)
        if x.shape != a.shape or len(x) < 1 or not (np.isfinite(x).all() and np.isfinite(a).all()):
            raise ValueError(f"need matching finite log pressures and attainments, got {x.shape} and {a.shape}")
        log_prior = np.log(SLOPE_PRIOR)

        def loss(theta: np.ndarray) -> float:
            knee, log_slope = theta
            z = np.clip(np.exp(log_slope) * (knee - x), -50.0, 50.0)
            p = np.clip(1.0 / (1.0 + np.exp(-z)), _P_CLIP, 1.0 - _P_CLIP)
            deviance = -np.mean(a * np.log(p) + (1.0 - a) * np.log(1.0 - p))
            return float(deviance + SLOPE_RIDGE * (log_slope - log_prior) ** 2)

        # the deviance is not convex in (knee, log slope) jointly: start the simplex from
        # knees spread over (and a little past) the data, keep the best
        best = None
        for start in np.linspace(x.min() - 1.0, x.max() + 1.0, 9):
            r = minimize(loss, np.array([start, log_prior]), method="Nelder-Mead",
                         options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 4000})
            if best is None or r.fun < best.fun:
                best = r
        assert best is not None
        return cls(float(best.x[0]), float(np.exp(best.x[1])))
