"""A bandwidth mean for the Capacity GP that saturates: decode steps per second with a
fitted time per token (pure numpy, no I/O).

Why: a profile measures bandwidth as (decode steps x weight bytes + KV bytes + prefill
bytes) per second (features.usage_in_window), its steps counted from the tokens, a token
delivered while n requests decode being 1 / max(1, n) of a step. The roofline prior's
steps per second follow the probe's step time (a few ms for a demo model), so they grow
almost linearly with the token rate; measured, they bend over well before that (on the
steady-state profiles of bench/RESULTS.md "oracle" the prior was 1.5-3x too high at the
highest served rates): a request under load waits longer per token than one engine step
(prefills in between, the daemon and the replayer on the same cores). A GP correcting
the prior with a linear trend in log-load extrapolated that bend wrongly to held-out
rates (71-78% P90 on the demo models against a noise floor of 12-20%).

The mean here: a token shares its step with the requests decoding beside it; by Little's
law there are N = tokens/s x tau of those on its instance, tau the time a request waits
per token, so the mean batch a token sees is b = 1 + N. The steps are counted the way the
measurement counts them: a token delivered while n requests decode on the model's m
instances is 1 / max(1, n / m) of a step, and under Poisson arrivals a token sees its own
request plus K ~ Poisson(m N) others (PASTA), so

    steps/s = tokens/s x E[1 / max(1, (1 + K) / m)]
            ->  tokens/s at light load, 1 / tau as the load grows

(closed form in step_fraction; for m = 1 it is (1 - e^-N) / N). Taking 1 / b instead
(the token-weighted batch, the first form here) undercounts the steps at light load and,
for m > 1, ignores that fewer decoding requests than instances each get a step of their
own: on the low-noise profiles of bench/RESULTS.md "Longer windows" the held-out
bandwidth P90 fell on all nine (file, seed) pairs (sum 315 -> 222); on the twelve older,
noisier files it was a wash (2050 -> 2046).

with tau = factor x t_step(b), t_step the device's step time at batch b (hw/devices.py host
time per step + the roofline of hw/model_spec.py's step FLOPs and bytes: what the probe
measured on an idle engine) and `factor` (>= FACTOR_MIN) the one number fitted from a
profile (fit_factor: least squares on log bandwidth over a grid). b solves its equation
by fixed-point iteration (it grows linearly in b through the per-sequence terms; B_CAP
when that diverges: overload), or in closed form under a measured StepTime (linear in b:
the iteration converges at rate rho and stalls near the limit, where that form matters).
Bandwidth = (steps/s x weight bytes + tokens/s x KV bytes per token x (mean context + 1)
+ requests/s x prefill bytes) / the device's bandwidth, the measurement's own count.

The step time: with the engine's own counters on enough rows (a profile's, dataset.py
`engine`), t_step(b, ctx) = per_step + b x (per_seq + per_seq_ctx x ctx), fitted to them
(fit_step_time: non-negative least squares of each row's forward seconds on its steps,
decoded tokens and decoded tokens x mean context), instead of the device's. Why: the
device's figures come from an idle engine's fastest step at a 16-token context
(engine/step_probe.py), and under load a step cost far more per sequence than they say:
on the demo models' profiles ~0.5 ms a sequence plus ~2 us per context token, against
the probe's ~0.03 ms, so a step of 22 sequences at a 430-token context took 31 ms where
the device said 3 ms. With the per-sequence cost right, b's fixed point climbs to the
large batches the engine falls into near its limit (bench/RESULTS.md "The engine's step
time"). Prefill time is not a separate term: the profiles' mixes hold prompt / output
length near 4 in every mix, so it cannot be told apart from per-token decode time and
lands in per_seq.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from janusd.hw.devices import DeviceSpec
from janusd.hw.model_spec import ModelSpec

FACTOR_MIN = 0.1
FACTOR_MAX = 100.0
GRID = np.exp(np.linspace(np.log(FACTOR_MIN), np.log(FACTOR_MAX), 121))  # ratio 1.06 between neighbours
B_CAP = 1e4
FLOOR = 1e-6  # a fraction of a device: the smallest bandwidth a mean returns (capacity.FLOOR)
_ITERATIONS = 60
MIN_ENGINE_ROWS = 4  # rows with counters, over at least two batch sizes, for a measured step time


@dataclass(frozen=True)
class StepTime:
    """A step's seconds as measured on the engine (module doc): per_step + b x (per_seq +
    per_seq_ctx x ctx)."""

    per_step: float
    per_seq: float
    per_seq_ctx: float

    def __post_init__(self) -> None:
        for k in ("per_step", "per_seq", "per_seq_ctx"):
            v = getattr(self, k)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"StepTime.{k} must be finite and >= 0, got {v!r}")
        if self.per_step + self.per_seq <= 0:
            raise ValueError("a StepTime must cost something per step or per sequence")

    def per_sequence(self, ctx: np.ndarray) -> np.ndarray:
        """Seconds a step spends on each sequence at mean context `ctx`."""
        return self.per_seq + self.per_seq_ctx * np.maximum(ctx, 0.0)

    def seconds(self, batch: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        return self.per_step + np.maximum(batch, 1.0) * self.per_sequence(ctx)

    def to_list(self) -> list[float]:
        return [self.per_step, self.per_seq, self.per_seq_ctx]


def fit_step_time(features: np.ndarray, engine: np.ndarray) -> StepTime | None:
    """The StepTime the rows' engine counters (dataset.py ENGINE_COLUMNS, whole-model
    features: lengths are what matter here) say, or None with fewer than MIN_ENGINE_ROWS
    usable rows (finite, with steps), fewer than two distinct tokens per step, or a fit
    that prices nothing."""
    from scipy.optimize import nnls

    f = np.atleast_2d(np.asarray(features, dtype=np.float64))
    e = np.atleast_2d(np.asarray(engine, dtype=np.float64))
    ok = np.isfinite(e).all(axis=1) & (e[:, 0] > 0) & (e[:, 1] > 0) & (e[:, 2] > 0)
    if ok.sum() < MIN_ENGINE_ROWS or len(np.unique(np.round(e[ok, 1] / e[ok, 0], 2))) < 2:
        return None
    ctx = f[ok, 3] + f[ok, 5] / 2.0
    x = np.stack([e[ok, 0], e[ok, 1], e[ok, 1] * ctx], axis=1)
    scale = x.max(axis=0)
    scale[scale <= 0] = 1.0
    coef, _ = nnls(x / scale, e[ok, 2])
    coef = coef / scale
    try:
        return StepTime(*(float(c) for c in coef))
    except ValueError:
        return None


def step_time(model: ModelSpec, device: DeviceSpec, batch: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    """Seconds of one decode step of `batch` sequences at mean context `ctx` (elementwise),
    by the device: its host time plus the roofline (a measured StepTime: StepTime.seconds)."""
    b = np.maximum(batch, 1.0)
    host = device.step_time_floor(model.layers, 0.0) + b * device.seq_overhead_s
    flops = model.decode_step_flops(b, b * ctx) / device.peak_flops
    nbytes = model.decode_step_bytes(b, b * ctx) / device.hbm_bw
    return host + np.maximum(flops, nbytes)


def step_fraction(others: np.ndarray, instances: np.ndarray) -> np.ndarray:
    """E[1 / max(1, (1 + K) / m)], K ~ Poisson(others), elementwise: the steps a token
    stands for (module doc). Exact: P(K < m) + m (E[1 / (1 + K)] - sum_{k<m} P(k) / (1 + k)),
    with E[1 / (1 + K)] = (1 - e^-lam) / lam."""
    from scipy.special import gammaln

    lam = np.maximum(np.asarray(others, dtype=np.float64), 1e-12)
    m = np.maximum(np.asarray(instances, dtype=np.float64), 1.0)
    lam, m = np.broadcast_arrays(lam, m)
    k = np.arange(int(m.max()), dtype=np.float64)[:, None]  # rows k = 0 .. max m - 1
    pmf = np.exp(k * np.log(lam)[None, :] - lam[None, :] - gammaln(k + 1.0))
    below = k < m[None, :]
    head = np.where(below, pmf, 0.0)
    mean_inv = -np.expm1(-lam) / lam
    return np.clip(head.sum(0) + m * (mean_inv - (head / (k + 1.0)).sum(0)), 0.0, 1.0)


def _instances(instances: np.ndarray | None, n: int) -> np.ndarray:
    if instances is None:
        return np.ones(n)
    m = np.asarray(instances, dtype=np.float64).reshape(-1)
    if len(m) != n or np.any(m < 1):
        raise ValueError(f"need one instance count >= 1 per row, got {m.tolist()} for {n} rows")
    return m


def steps_per_s(model: ModelSpec, device: DeviceSpec, features: np.ndarray, factor: float,
                instances: np.ndarray | None = None, measured: StepTime | None = None) -> np.ndarray:
    """(n,) decode steps per second of one instance for rows of per-instance LoadFeatures,
    each row's load carried by `instances` of them (None: one), steps timed by `measured`
    (None: the device's step time)."""
    if not (np.isfinite(factor) and factor > 0):
        raise ValueError(f"the step-time factor must be finite and > 0, got {factor!r}")
    f = np.atleast_2d(np.asarray(features, dtype=np.float64))
    m = _instances(instances, len(f))
    tok = np.maximum(f[:, 0] * f[:, 5], 0.0)  # requests/s x mean output length
    ctx = f[:, 3] + f[:, 5] / 2.0
    if measured is not None:  # linear in b: b = 1 + k (per_step + b s) solves in closed form
        k = tok * factor
        s = measured.per_sequence(ctx)
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.where(k * s < 1.0, (1.0 + k * measured.per_step) / (1.0 - k * s), B_CAP)
        b = np.clip(b, 1.0, B_CAP)  # b >= 1 covers the batch-of-one floor of StepTime.seconds
        return tok * step_fraction(m * (b - 1.0), m)
    b = np.ones_like(tok)
    for _ in range(_ITERATIONS):
        nb = np.minimum(1.0 + tok * factor * step_time(model, device, b, ctx), B_CAP)
        done = np.allclose(nb, b, rtol=1e-10, atol=0.0)
        b = nb
        if done:
            break
    return tok * step_fraction(m * (b - 1.0), m)


def bandwidth(model: ModelSpec, device: DeviceSpec, features: np.ndarray, factor: float,
              instances: np.ndarray | None = None, measured: StepTime | None = None) -> np.ndarray:
    """(n,) bandwidth of one instance as a fraction of the device's (module doc)."""
    f = np.atleast_2d(np.asarray(features, dtype=np.float64))
    tok = np.maximum(f[:, 0] * f[:, 5], 0.0)
    ctx = f[:, 3] + f[:, 5] / 2.0
    prefill = np.array([model.prefill_bytes(x) for x in f[:, 3]], dtype=np.float64).reshape(len(f))
    nbytes = (steps_per_s(model, device, f, factor, instances, measured) * model.weight_bytes
              + tok * model.kv_bytes_per_token * (ctx + 1.0) + np.maximum(f[:, 0], 0.0) * prefill)
    return np.maximum(nbytes / device.hbm_bw, FLOOR)


def fit_factor(model: ModelSpec, device: DeviceSpec, features: np.ndarray, measured_bw: np.ndarray,
               instances: np.ndarray | None = None, measured: StepTime | None = None) -> float:
    """The grid's factor whose bandwidth fits `measured_bw` (n,) best in squared log error."""
    m = np.log(np.maximum(np.asarray(measured_bw, dtype=np.float64).reshape(-1), FLOOR))
    f = np.atleast_2d(np.asarray(features, dtype=np.float64))
    if len(f) != len(m) or len(m) == 0:
        raise ValueError(f"need one measured bandwidth per row, got {len(m)} for {len(f)} rows")
    err = [float(np.mean((np.log(bandwidth(model, device, f, float(k), instances, measured)) - m) ** 2))
           for k in GRID]
    return float(GRID[int(np.argmin(err))])
