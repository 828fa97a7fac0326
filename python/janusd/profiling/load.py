"""The load a profile point offers: the length mixes, the measured window and the settling
around it, and the stratified open-loop trace of one point (package doc)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from janusd.oracle.knee import HIGH
from janusd.profiling.daemon import MODEL_NAME

MIXES: dict[str, tuple[float, float]] = {"tiny": (32.0, 16.0), "short": (96.0, 32.0), "long": (384.0, 96.0)}  # mean in, out
LENGTH_SIGMA = 0.5  # lognormal spread of lengths within a mix
MIN_REQUESTS = 16  # requests in a point's measured window, at least (point_seconds)
SETTLE_FRACTION = 0.25  # warm-up and cool-down, each, as a fraction of the measured window ...
SETTLE_MIN_S = 2.0  # ... and at least this long
KNEE_STRETCH = 2.0  # a point inside a series' knee bracket measures this many times longer


def point_seconds(rate: float, point_s: float) -> float:
    """A point's measured window: point_s, longer at low rates so it holds about
    MIN_REQUESTS requests (at most 3 x point_s): attainment over a few requests is noise."""
    return min(max(point_s, MIN_REQUESTS / rate), 3.0 * point_s)


def settle_seconds(window_s: float) -> float:
    """Warm-up before and cool-down after a measured window (each): the load runs through
    both, so the window's requests meet a system already at its steady state and keep
    meeting it until they end, instead of an empty engine first and a draining one last."""
    return max(SETTLE_MIN_S, SETTLE_FRACTION * window_s)


def in_knee(measured: list[tuple[float, float]], rate: float) -> bool:
    """Whether `rate` lies between the highest measured rate served at knee.HIGH and the
    lowest one that was not: where attainment changes, which a point measures longer
    (KNEE_STRETCH)."""
    ok = [r for r, a in measured if a >= HIGH]
    bad = [r for r, a in measured if a < HIGH]
    return bool(ok and bad) and max(ok) < rate < min(bad)


def _segment(rate: float, t0: float, seconds: float, mean_in: float, mean_out: float, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrivals, input lengths, output lengths) of one stratified stretch of a trace."""
    from scipy.stats import norm

    n = max(1, int(round(rate * seconds)))
    quantiles = norm.ppf((np.arange(n) + 0.5) / n)

    def lengths(mean: float) -> np.ndarray:
        mu = math.log(mean) - LENGTH_SIGMA**2 / 2
        return np.exp(mu + LENGTH_SIGMA * rng.permutation(quantiles))

    return t0 + np.sort(rng.uniform(0.0, seconds, n)), lengths(mean_in), lengths(mean_out)


def make_trace(rate: float, segments: Sequence[float], mix: str, rng: np.random.Generator, ttft_ms: float,
               tpot_ms: float, max_len: int) -> Any:
    """An open-loop trace at `rate` over back-to-back stretches of the given seconds (a
    profile point: warm-up, measured window, cool-down), lognormal lengths around the mix's
    means.

    Each stretch is stratified, so that repeats of a load point offer the same load where
    it is measured: round(rate * seconds) arrivals placed as a Poisson process given their
    count (sorted uniforms; a Poisson count would spread a 16-request window's rate by
    +-25%), and lengths at the lognormal's quantiles (i + 1/2) / n in a random order (the
    window's mean and spread are the mix's, only their order varies). What is left between
    repeats is the arrival pattern and the machine."""
    from janusd.trace.formats import Trace

    mean_in, mean_out = MIXES[mix]
    parts, t0 = [], 0.0
    for seconds in segments:
        if not seconds > 0:
            raise ValueError(f"segments must be > 0 seconds, got {list(segments)}")
        parts.append(_segment(rate, t0, seconds, mean_in, mean_out, rng))
        t0 += seconds
    arrivals, ins, outs = (np.concatenate(c) for c in zip(*parts, strict=True))
    ins = np.clip(np.round(ins), 1, max_len // 2).astype(np.int64)
    outs = np.clip(np.round(outs), 1, max_len // 4).astype(np.int64)
    n = len(arrivals)
    return Trace.build(arrivals, ["profile"] * n, [MODEL_NAME] * n, ins, outs,
                       np.full(n, ttft_ms), np.full(n, tpot_ms))
