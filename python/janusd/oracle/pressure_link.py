"""A logistic calibration of the roofline prior's pressure: attainment =
1 / (1 + exp(-slope * (knee - log rho - interference * log stall))), where stall is the
prior's prefill_stall (prefills pressing on the TPOT of the tokens beside them) and
interference is 0 unless the fit is asked to learn it.

Why: on every profile in bench/oracle up to 2026-12-03 the prior *orders* the load points
by difficulty almost perfectly (a higher pressure never came with a clearly higher
attainment), while its absolute knee is off by 4x or more (it cannot see that the daemon,
the replayer and the workers share the host's cores). A curve of two numbers fitted to
where the measured knee lies therefore transfers from one length mix and instance count
to another, where a GP over nine inputs, trained on seven to ten load points with one or
two of them at the knee, extrapolates a held-out knee point to ~1.0. On the profiles of
2026-12-06 (a faster VM) the order broke in one way: long prompts failed at a pressure
where short ones were served, the prefill's interference with decoding that the pressure
does not hold; the third number weighs prefill_stall in (bench/RESULTS.md "oracle").

Fit: maximum likelihood of the measured attainments as fractional Bernoulli outcomes
(the binomial deviance, what logistic regression minimises), not least squares on
clipped logits: an attainment of exactly 1.0 has no logit, and the clip made the many
served points outweigh the few at the knee. Ridges (RIDGE_ROWS) on log(slope) around SLOPE_PRIOR and
on log(interference) around 0 (a stall counting as much as the pressure) keep them
finite when the points are separable (every served point below every failed one, the
usual case), where the likelihood alone would make the curve a step. With no failed point
at all the knee is not identified and the fit puts it just past the hardest served
load: the model then says "no knee seen" and the GP's residual and std (elasticity.py)
carry the rest.

Monotone: slope > 0 and interference >= 0 by construction (fitted as logs), and the
pressure and the stall both fall as m grows (prior.py), so the calibrated attainment
never falls with m.
"""

from __future__ import annotations

import numpy as np

SLOPE_PRIOR = 6.0  # per unit of log pressure: a 2x pressure step crosses from ~0.9 to ~0.1
RIDGE_ROWS = 1.0  # the ridges weigh as much as this many rows' deviance: firm on a profile's ~15
# rows (1/15 per unit of squared log deviation beside the mean deviance), negligible on thousands
_P_CLIP = 1e-6


class PressureLink:
    """logit(x) = slope * (knee - x[:, 0] - interference * x[:, 1]); x's columns: log
    pressure and, when interference is learnt, log prefill stall."""

    def __init__(self, knee: float, slope: float, interference: float = 0.0) -> None:
        if not (np.isfinite(knee) and np.isfinite(slope) and slope > 0
                and np.isfinite(interference) and interference >= 0):
            raise ValueError(f"a pressure link needs a finite knee, a slope > 0 and an interference >= 0, "
                             f"got {knee}, {slope}, {interference}")
        self.knee = float(knee)
        self.slope = float(slope)
        self.interference = float(interference)

    def logit(self, x: np.ndarray) -> np.ndarray:
        """x: (n,) log pressures or (n, k) rows as fit takes them."""
        x = np.asarray(x, dtype=np.float64)
        x = x.reshape(-1, 1) if x.ndim < 2 else x
        eff = x[:, 0] + (self.interference * x[:, 1] if self.interference else 0.0)
        return self.slope * (self.knee - eff)

    def attainment(self, x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-np.clip(self.logit(x), -700.0, 700.0)))

    def to_state(self) -> dict[str, float]:
        return {"knee": self.knee, "slope": self.slope, "interference": self.interference}

    @classmethod
    def from_state(cls, state: object) -> PressureLink:
        d = state if isinstance(state, dict) else {}
        values = [d.get("knee"), d.get("slope"), d.get("interference", 0.0)]
        if not all(isinstance(v, int | float) for v in values):
            raise ValueError(f"a pressure link is {{'knee': number, 'slope': number, 'interference': number}}, "
                             f"got {state!r}")
        return cls(*(float(v) for v in values))  # type: ignore[arg-type]

    @classmethod
    def fit(cls, x: np.ndarray, attainment: np.ndarray, interference: bool = False) -> PressureLink:
        """x: (n,) log pressures, or (n, 2) log pressure and log stall when `interference`."""
        from scipy.optimize import minimize

        x = np.asarray(x, dtype=np.float64)
        x = x.reshape(-1, 1) if x.ndim == 1 else x
        a = np.asarray(attainment, dtype=np.float64).reshape(-1)
        if (x.shape[0] != a.shape[0] or x.shape[1] < (2 if interference else 1) or len(a) < 1
                or not (np.isfinite(x).all() and np.isfinite(a).all())):
            raise ValueError(f"need matching finite log pressures and attainments, got {x.shape} and {a.shape}")
        x0 = x[:, 0]
        x1 = x[:, 1] if interference else np.zeros_like(x0)
        log_prior = np.log(SLOPE_PRIOR)
        ridge = RIDGE_ROWS / len(a)

        def loss(theta: np.ndarray) -> float:
            knee, log_slope = theta[0], theta[1]
            log_w = theta[2] if interference else 0.0
            w = np.exp(log_w) if interference else 0.0
            z = np.clip(np.exp(log_slope) * (knee - x0 - w * x1), -50.0, 50.0)
            p = np.clip(1.0 / (1.0 + np.exp(-z)), _P_CLIP, 1.0 - _P_CLIP)
            deviance = -np.mean(a * np.log(p) + (1.0 - a) * np.log(1.0 - p))
            return float(deviance + ridge * ((log_slope - log_prior) ** 2 + log_w**2))

        # the deviance is not convex in these parameters: start the simplex from knees spread
        # over (and a little past) the data's effective pressures, keep the best
        eff = x0 + x1
        best = None
        for start in np.linspace(eff.min() - 1.0, eff.max() + 1.0, 9):
            theta0 = np.array([start, log_prior, 0.0] if interference else [start, log_prior])
            r = minimize(loss, theta0, method="Nelder-Mead",
                         options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 6000})
            if best is None or r.fun < best.fun:
                best = r
        assert best is not None
        return cls(float(best.x[0]), float(np.exp(best.x[1])), float(np.exp(best.x[2])) if interference else 0.0)
