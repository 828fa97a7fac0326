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

Bandwidth has two mean forms (BW_FORMS); fit.py uses "step-rate" whenever there is a prior
(choosing per fit was tried and not kept, fit.py's module doc):
- "prior": as above, the prior's bandwidth with a trended GP correction;
- "step-rate": step_rate.py's saturating decode steps per second (counted, as the
  measurement counts them, over the m instances sharing the load), its one factor (the
  time a request waits per token over the device's step time) fitted on the training
  rows, and a GP *without* a trend on the log residual. The prior counts steps that grow
  almost linearly with the token rate; a profile's bend over (the prior 1.5-3x high at the
  highest served rates), and a linear trend in log-load carried a local slope to held-out
  rates where the bend had changed it. The saturating mean has the bend in its shape, and
  far from the data the GP falls back to it, not to a line. Its steps are timed by a
  step_rate.StepTime measured from the engine's counters when the training points carry
  them (fit.py), else by the device's step time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from janusd.oracle import step_rate
from janusd.oracle.gp import GPRegressor
from janusd.oracle.inputs import capacity_inputs, feature_matrix
from janusd.oracle.types import RESOURCE_DIMS, LoadFeatures, ResourceEstimate

FLOOR = 1e-6  # demands below this (a fraction of a device) are taken as this in the log ratio
BW_FORMS = ("prior", "step-rate")
_BW = RESOURCE_DIMS.index("bandwidth")


def prior_demand(prior: Any, features: np.ndarray) -> np.ndarray:
    """(n, 3) the prior's per-instance demand for rows of per-instance load features."""
    rows = [prior.capacity("", LoadFeatures(*f.tolist())).mean for f in np.atleast_2d(features)]
    return np.maximum(np.array(rows, dtype=np.float64).reshape(-1, len(RESOURCE_DIMS)), FLOOR)


def check_bw_form(bw_form: str, prior: Any | None) -> None:
    """ValueError unless bw_form is one of BW_FORMS usable with (or without) a prior."""
    if bw_form not in BW_FORMS:
        raise ValueError(f"unknown bandwidth mean form {bw_form!r} (known: {', '.join(BW_FORMS)})")
    if bw_form == "step-rate" and prior is None:
        raise ValueError("the 'step-rate' bandwidth mean needs a prior (its model and device)")


def base_demand(prior: Any, features: np.ndarray, bw_form: str = "prior", step_factor: float = 1.0,
                instances: np.ndarray | None = None, step_time: step_rate.StepTime | None = None) -> np.ndarray:
    """(n, 3) the mean the GPs correct: the prior's demand, its bandwidth replaced by
    step_rate.py's when bw_form is "step-rate" (which counts the steps of a load spread over
    `instances` per row, None: one, timed by `step_time`, None: the device's)."""
    base = prior_demand(prior, features)
    if bw_form == "step-rate":
        base[:, _BW] = step_rate.bandwidth(prior.model, prior.device, np.atleast_2d(features), step_factor, instances,
                                           step_time)
    return base


def gp_trends(bw_form: str) -> list[bool]:
    """Which GPs have a linear mean (module doc: not the bandwidth's over the step-rate mean)."""
    return [not (bw_form == "step-rate" and k == _BW) for k in range(len(RESOURCE_DIMS))]


class CapacityModel:
    def __init__(self, gps: list[GPRegressor], prior: Any | None = None, bw_form: str = "prior",
                 step_factor: float = 1.0, step_time: step_rate.StepTime | None = None) -> None:
        if len(gps) != len(RESOURCE_DIMS):
            raise ValueError(f"need {len(RESOURCE_DIMS)} GPs, got {len(gps)}")
        check_bw_form(bw_form, prior)
        if not (np.isfinite(step_factor) and step_factor > 0):
            raise ValueError(f"step_factor must be finite and > 0, got {step_factor!r}")
        self.gps = gps
        self.prior = prior
        self.bw_form = bw_form
        self.step_factor = float(step_factor)
        self.step_time = step_time

    @staticmethod
    def targets(features: np.ndarray, measured: np.ndarray, prior: Any | None, bw_form: str = "prior",
                step_factor: float = 1.0, instances: np.ndarray | None = None,
                step_time: step_rate.StepTime | None = None) -> np.ndarray:
        """What the GPs learn from measured demand: log(measured / base_demand), or the demand itself."""
        t = np.asarray(measured, dtype=np.float64)
        if prior is None:
            return t
        return np.log(np.maximum(t, FLOOR)) - np.log(base_demand(prior, features, bw_form, step_factor, instances,
                                                                 step_time))

    @classmethod
    def fit(cls, features: np.ndarray, measured: np.ndarray, prior: Any | None = None, seed: int = 0,
            bw_form: str = "prior", instances: np.ndarray | None = None,
            step_time: step_rate.StepTime | None = None) -> CapacityModel:
        """features: (n, 7) LoadFeatures rows of the load one instance carried; measured:
        (n, 3) that instance's demand; prior: a RooflinePrior to learn the correction of;
        bw_form: one of BW_FORMS (module doc); instances: (n,) how many instances shared
        each row's load (None: one), which the step-rate mean counts steps with; step_time:
        the engine's measured step time for that mean (None: the device's)."""
        t = np.asarray(measured, dtype=np.float64)
        if t.ndim != 2 or t.shape[1] != len(RESOURCE_DIMS) or len(t) != len(features):
            raise ValueError(f"measured must have shape ({len(features)}, {len(RESOURCE_DIMS)}), got {t.shape}")
        check_bw_form(bw_form, prior)
        factor = 1.0
        if bw_form == "step-rate" and prior is not None:  # check_bw_form: step-rate has a prior
            factor = step_rate.fit_factor(prior.model, prior.device, np.atleast_2d(features), t[:, _BW], instances,
                                          step_time)
        x = capacity_inputs(features)
        y = cls.targets(features, t, prior, bw_form, factor, instances, step_time)
        gps = [GPRegressor.fit(x, y[:, k], seed=seed, trend=tr) for k, tr in enumerate(gp_trends(bw_form))]
        return cls(gps, prior, bw_form, factor, step_time if bw_form == "step-rate" else None)

    def predict(self, features: np.ndarray, instances: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean, std), each (n, 3), of one instance per row of per-instance load, the load
        shared by `instances` (None: one)."""
        x = capacity_inputs(features)
        out = [gp.predict(x) for gp in self.gps]
        mean = np.stack([m for m, _ in out], axis=1)
        std = np.stack([s for _, s in out], axis=1)
        if self.prior is None:
            return np.maximum(mean, 0.0), std
        base = base_demand(self.prior, features, self.bw_form, self.step_factor, instances, self.step_time)
        scaled = base * np.exp(mean)
        return scaled, scaled * std

    def capacity(self, load: LoadFeatures) -> ResourceEstimate:
        """One instance's demand at a per-instance load, its steps counted as on one instance
        (instances=1). Spread over m > 1 instances, a light load takes up to m times the
        steps (requests that do not share a step); the Oracle's callers size instances by
        this figure and add their margin."""
        mean, std = self.predict(feature_matrix([load]))
        return ResourceEstimate(tuple(float(v) for v in mean[0]), tuple(float(v) for v in std[0]), "gp")  # type: ignore[arg-type]
