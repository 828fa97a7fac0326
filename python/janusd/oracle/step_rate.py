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
when that diverges: overload). Bandwidth = (steps/s x weight bytes + tokens/s x KV bytes
per token x (mean context + 1) + requests/s x prefill bytes) / the device's bandwidth,
the measurement's own count.
"""

from __future__ import annotations

import numpy as np

from janusd.hw.devices import DeviceSpec
from janusd.hw.model_spec import ModelSpec

FACTOR_MIN = 0.1
FACTOR_MAX = 100.0
GRID = np.exp(np.linspace(np.log(FACTOR_MIN), np.log(FACTOR_MAX), 121))  # ratio 1.06 between neighbours
B_CAP = 1e4
FLOOR = 1e-6  # a fraction of a device: the smallest bandwidth a mean returns (capacity.FLOOR)
_ITERATIONS = 60


def step_time(model: ModelSpec, device: DeviceSpec, batch: np.ndarray, ctx: np.ndarray) -> np.ndarray:
    """Seconds of one decode step of `batch` sequences at mean context `ctx` (elementwise)."""
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
                instances: np.ndarray | None = None) -> np.ndarray:
    """(n,) decode steps per second of one instance for rows of per-instance LoadFeatures,
    each row's load carried by `instances` of them (None: one)."""
    if not (np.isfinite(factor) and factor > 0):
        raise ValueError(f"the step-time factor must be finite and > 0, got {factor!r}")
    f = np.atleast_2d(np.asarray(features, dtype=np.float64))
    m = _instances(instances, len(f))
    tok = np.maximum(f[:, 0] * f[:, 5], 0.0)  # requests/s x mean output length
    ctx = f[:, 3] + f[:, 5] / 2.0
    b = np.ones_like(tok)
    for _ in range(_ITERATIONS):
        nb = np.minimum(1.0 + tok * factor * step_time(model, device, b, ctx), B_CAP)
        done = np.allclose(nb, b, rtol=1e-10, atol=0.0)
        b = nb
        if done:
            break
    return tok * step_fraction(m * (b - 1.0), m)


def bandwidth(model: ModelSpec, device: DeviceSpec, features: np.ndarray, factor: float,
              instances: np.ndarray | None = None) -> np.ndarray:
    """(n,) bandwidth of one instance as a fraction of the device's (module doc)."""
    f = np.atleast_2d(np.asarray(features, dtype=np.float64))
    tok = np.maximum(f[:, 0] * f[:, 5], 0.0)
    ctx = f[:, 3] + f[:, 5] / 2.0
    prefill = np.array([model.prefill_bytes(x) for x in f[:, 3]], dtype=np.float64).reshape(len(f))
    nbytes = (steps_per_s(model, device, f, factor, instances) * model.weight_bytes
              + tok * model.kv_bytes_per_token * (ctx + 1.0) + np.maximum(f[:, 0], 0.0) * prefill)
    return np.maximum(nbytes / device.hbm_bw, FLOOR)


def fit_factor(model: ModelSpec, device: DeviceSpec, features: np.ndarray, measured: np.ndarray,
               instances: np.ndarray | None = None) -> float:
    """The grid's factor whose bandwidth fits `measured` (n,) best in squared log error."""
    m = np.log(np.maximum(np.asarray(measured, dtype=np.float64).reshape(-1), FLOOR))
    f = np.atleast_2d(np.asarray(features, dtype=np.float64))
    if len(f) != len(m) or len(m) == 0:
        raise ValueError(f"need one measured bandwidth per row, got {len(m)} for {len(f)} rows")
    err = [float(np.mean((np.log(bandwidth(model, device, f, float(k), instances)) - m) ** 2)) for k in GRID]
    return float(GRID[int(np.argmin(err))])
