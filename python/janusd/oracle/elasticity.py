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
Raw predictions are always computed over the same batch of instance counts, 1..grid(m)
(GRID_MIN, or the next power of two above it): a GP's prediction for one row differs in
the last bits with the size of the batch it is computed in (BLAS blocking), which must
not make the estimate at m + 1 a hair below the one at m.
Raw predictions come from any source with raw(load, ms) -> (mean, std): the GP here, or
the roofline prior (oracle/prior.py), so both obey the same rule.

Inputs (INPUT_SETS), chosen per fit by fit.py (held-out error over whole load points):
- "full": inputs.py's per-instance load features and log m, plus the log of the prior's
  pressure when there is a prior;
- "pressure": the log of the prior's pressure alone (it already holds m: the rates over m
  instances), i.e. a calibration of the prior's one-number summary. With tens of points a
  9-input surface overfits where a 1-input curve does not: on the quiet 17:35 profiles of
  bench/RESULTS.md "oracle" it cut the held-out attainment P90 from 21-32 to 11-19 points;
  on the loaded afternoon's, where other processes' load moved the knee and the prior saw
  none of it, "full" was better. The data decides.
- "calibrated": the same one input, but the GP's mean is pressure_link.py's logistic
  curve of log pressure fitted by maximum likelihood (two numbers: where the measured
  knee lies, how steep), and the GP models only what that curve leaves (in logit, zero
  mean, no trend): far from the data the curve, not a straight line through clipped
  logits, is what the model says (module doc there for why).
- "interference": "calibrated" with a second column, the log of the prior's prefill stall
  (prior.py prefill_stall: long prompts pressing on the TPOT of the tokens beside them),
  its weight in the link fitted too (pressure_link.py).

The roofline prior's raw curve is non-decreasing in m already (prior.py: every term of
its pressure falls as m grows; std 0) and each count is computed alone (no batch
effect), so its running maxima equal its raw values and min_instances finds the same m
by a galloping search over single counts (1, 2, 4, ... then bisection: ~2 log2(m*)
evaluations instead of grid(limit); the controller asks m* of every elastic app at
every fast tick, and 64 pressures per ask were most of a simulated day's time).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from janusd.oracle.gp import GPRegressor
from janusd.oracle.inputs import elasticity_inputs, feature_matrix
from janusd.oracle.pressure_link import PressureLink
from janusd.oracle.types import AttainmentEstimate, LoadFeatures, MinInstances


LOGIT_EPS = 0.01
GRID_MIN = 64
INPUT_SETS = ("full", "pressure", "calibrated", "interference")
LINKED = ("calibrated", "interference")  # the input sets whose GP sits on a pressure link
_LOGIT_MAX = float(np.log(1.0 / LOGIT_EPS - 1.0))  # to_logit's range is +-_LOGIT_MAX


def grid(m: int) -> int:
    """How many instance counts a raw batch covers for an answer about m (module doc)."""
    return max(GRID_MIN, 1 << (max(1, m) - 1).bit_length())

def to_logit(a: np.ndarray) -> np.ndarray:
    """The GP's target: logit of attainment clipped to [LOGIT_EPS, 1 - LOGIT_EPS] (an
    attainment of exactly 1 or 0 has no logit; the clip keeps the scale finite)."""
    p = np.clip(np.asarray(a, dtype=np.float64), LOGIT_EPS, 1.0 - LOGIT_EPS)
    return np.log(p / (1.0 - p))


def predictive_attainment(mu: np.ndarray, sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of attainment for a logit that is normal (mu, sd): the mean is
    E[logistic(f)], by the probit approximation logistic(mu / sqrt(1 + pi sd^2 / 8)), not
    logistic(mu). Why: near a knee the GP's logit is uncertain (a held-out partial point,
    a replay's noise there, which the white term holds), and logistic(mu) is then 0 or 1
    by a hair where the expected attainment lies in between. On the twelve profiles of
    bench/RESULTS.md "oracle" (2026-12-06) it lowered the held-out attainment P90 on 28
    of 36 (file, seed) pairs and raised it on 2 (sum 1108 -> 1065 points). Far from the
    knee (|mu| >> sd) the two agree. The std: the delta method at that mean."""
    z = np.asarray(mu, dtype=np.float64) / np.sqrt(1.0 + np.pi * np.square(sd) / 8.0)
    p = 1.0 / (1.0 + np.exp(-np.clip(z, -700.0, 700.0)))
    return p, p * (1.0 - p) * np.asarray(sd, dtype=np.float64)


class RawAttainment(Protocol):
    """A source of raw attainment per instance count. One that sets `monotone_in_m = True`
    (its raw mean - margin * std never falls as m grows, std free of batch effects)
    is searched count by count instead of over the grid: the roofline prior does."""

    def raw_attainment(self, load: LoadFeatures, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...


def pressure_column(prior: Any, features: np.ndarray, instances: np.ndarray) -> np.ndarray:
    """(n, 1) log of the prior's pressure (prior.py) of each row: the prior's one-number
    summary of how hard m instances are pushed by the load, an input that lets a few
    points of one length mix speak for another."""
    rho = [prior.pressure(LoadFeatures(*f.tolist()), int(m)) for f, m in zip(features, instances, strict=True)]
    return np.log(np.maximum(np.array(rho, dtype=np.float64), 1e-9))[:, None]


def stall_column(prior: Any, features: np.ndarray, instances: np.ndarray) -> np.ndarray:
    """(n, 1) log of the prior's prefill stall of each row (prior.py prefill_stall)."""
    s = [prior.prefill_stall(LoadFeatures(*f.tolist()), int(m)) for f, m in zip(features, instances, strict=True)]
    return np.log(np.maximum(np.array(s, dtype=np.float64), 1e-9))[:, None]


def check_input_set(input_set: str, prior: Any | None) -> None:
    """ValueError unless input_set is one of INPUT_SETS usable with (or without) a prior."""
    if input_set not in INPUT_SETS:
        raise ValueError(f"unknown elasticity input set {input_set!r} (known: {', '.join(INPUT_SETS)})")
    if input_set != "full" and prior is None:
        raise ValueError(f"the {input_set!r} input set needs a prior")


class ElasticityModel:
    """The attainment GP on one of INPUT_SETS (module doc)."""

    def __init__(self, gp: GPRegressor, prior: Any | None = None, input_set: str = "full",
                 link: PressureLink | None = None) -> None:
        check_input_set(input_set, prior)
        wants = None if input_set not in LINKED else input_set == "interference"  # None: no link
        if (None if link is None else link.interference > 0) != wants:
            raise ValueError("a pressure link goes with the 'calibrated' input set (no interference) or the "
                             "'interference' one, and only with them")
        self.gp = gp
        self.prior = prior
        self.input_set = input_set
        self.link = link

    @staticmethod
    def inputs(features: np.ndarray, instances: np.ndarray, prior: Any | None, input_set: str = "full") -> np.ndarray:
        check_input_set(input_set, prior)
        x = elasticity_inputs(features, instances)
        if prior is None:
            return x
        f = np.atleast_2d(np.asarray(features, dtype=np.float64))
        f = np.broadcast_to(f, (len(x), f.shape[1])) if len(f) == 1 else f
        m = np.asarray(instances).reshape(-1)
        rho = pressure_column(prior, f, m)
        if input_set == "full":
            return np.hstack([x, rho])
        if input_set == "interference":
            return np.hstack([rho, stall_column(prior, f, m)])
        return rho

    @staticmethod
    def gp_target(x: np.ndarray, attainment: np.ndarray, link: PressureLink | None) -> np.ndarray:
        """What the GP learns: logit attainment, less the link's logit (clipped to the same
        range) under a linked input set (LINKED)."""
        y = to_logit(attainment)
        if link is None:
            return y
        return y - np.clip(link.logit(x), -_LOGIT_MAX, _LOGIT_MAX)

    @classmethod
    def fit(cls, features: np.ndarray, instances: np.ndarray, attainment: np.ndarray, seed: int = 0,
            prior: Any | None = None, input_set: str = "full") -> ElasticityModel:
        """features: (n, 7) the model's whole load; instances: (n,) m; attainment: (n,) in [0, 1]."""
        a = np.asarray(attainment, dtype=np.float64)
        if a.shape != (len(features),) or np.any((a < 0) | (a > 1)):
            raise ValueError("attainment must be (n,) values in [0, 1]")
        x = cls.inputs(features, instances, prior, input_set)
        link = PressureLink.fit(x, a, interference=input_set == "interference") if input_set in LINKED else None
        gp = GPRegressor.fit(x, cls.gp_target(x, a, link), seed=seed, trend=link is None)
        return cls(gp, prior, input_set, link)

    def predict_rows(self, features: np.ndarray, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw (not yet monotone) mean and std per row, back on the attainment scale."""
        x = self.inputs(features, instances, self.prior, self.input_set)
        mu, sd = self.gp.predict(x)
        if self.link is not None:
            mu = mu + self.link.logit(x)
        return predictive_attainment(mu, sd)


    def raw_attainment(self, load: LoadFeatures, instances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ms = np.asarray(instances, dtype=np.float64)
        return self.predict_rows(np.repeat(feature_matrix([load]), len(ms), axis=0), ms)


def monotone_curve(raw_mean: np.ndarray, raw_std: np.ndarray, margin: float = 0.0
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, std, lower bound) for m = 1..len(raw): running maxima as in the module doc."""
    raw = np.asarray(raw_mean, dtype=np.float64)
    mu = np.clip(raw, 0.0, 1.0)
    sd = np.maximum(np.asarray(raw_std, dtype=np.float64), 0.0)
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
    mu, sd = source.raw_attainment(load, np.arange(1, grid(m) + 1))
    mean, std, _ = monotone_curve(mu[:m], sd[:m])
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
    if getattr(source, "monotone_in_m", False):
        return _min_instances_monotone(source, load, target, margin, limit, name)
    mu, sd = source.raw_attainment(load, np.arange(1, grid(limit) + 1))
    mean, std, lb = monotone_curve(mu[:limit], sd[:limit], margin)
    m = first_reaching(lb, target)
    if m is None:
        best = AttainmentEstimate(float(mean[-1]), float(std[-1]), name)
        return MinInstances(None, best, f"{limit} instances reach {lb[-1]:.3f} (mean - {margin} std), "
                                        f"below the target {target}")
    return MinInstances(m, AttainmentEstimate(float(mean[m - 1]), float(std[m - 1]), name),
                        f"{m} instances reach the target {target}")


def _min_instances_monotone(source: RawAttainment, load: LoadFeatures, target: float, margin: float, limit: int,
                            name: str) -> MinInstances:
    """min_instances for a source whose raw mean - margin * std is non-decreasing in m
    (the prior: module doc): the same answer and estimate as the grid, from the raw
    values at O(log m*) counts."""
    seen: dict[int, tuple[float, float]] = {}

    def at(m: int) -> tuple[float, float]:
        if m not in seen:
            mu, sd = source.raw_attainment(load, np.array([m]))
            seen[m] = (float(mu[0]), float(sd[0]))
        return seen[m]

    def reaches(m: int) -> bool:
        mu, sd = at(m)
        return mu - margin * max(sd, 0.0) >= target

    lo, hi = 0, 1  # lo: largest count known short of the target (0: none asked); hi: next to ask
    while not reaches(hi):
        if hi == limit:
            mu, sd = at(limit)
            best = AttainmentEstimate(float(np.clip(mu, 0.0, 1.0)), max(sd, 0.0), name)
            return MinInstances(None, best, f"{limit} instances reach {mu - margin * max(sd, 0.0):.3f} "
                                            f"(mean - {margin} std), below the target {target}")
        lo, hi = hi, min(2 * hi, limit)
    while hi - lo > 1:  # the answer is in (lo, hi]
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid
    mu, sd = at(hi)
    return MinInstances(hi, AttainmentEstimate(float(np.clip(mu, 0.0, 1.0)), max(sd, 0.0), name),
                        f"{hi} instances reach the target {target}")
