"""A production-like synthetic trace (PAPER.md §1): skewed, diurnal, bursty, per-app lengths.

Why synthetic: the production day the paper replays is not public. The public traces in
/work/shared/traces cover 2 apps (Azure) or give per-client rates without app identity
across models (ServeGen); this generator reproduces the shape the paper reports so the
control plane can be exercised at 62 apps on a laptop, deterministically for a seed.

Model, calibrated in expectation (not by rejection sampling):
- Popularity: app r (1-based rank) gets request share w_r proportional to r^-s, with s
  solved so the top round(12% x apps) apps carry `top12_request_share` (0.8) of requests.
- Lengths: each app has a kind (chat, code, writer: short; rag: long-context) and a mean
  request length L_r = L0 * (w_1/w_r)^beta * jitter_r, times 4 for rag apps; input and
  output are lognormal with those means, clipped to [1, max]. beta is solved so that the
  top round(30% x apps) apps by expected token volume w_r * E[in + out] (the clipped
  lognormal means, in closed form) carry `top30_token_share` (0.8) of tokens. Popular
  apps are thus short, the long tail longer, a few tail apps long-context.
- Time: app rate lambda_r(t) = c_r * D_r(t) * B_r(t) on a 1 s grid. D is a diurnal
  cosine (peak near 14:00, amplitude `diurnal_amplitude`, per-app phase +-2 h); B adds
  bursts: at a Poisson number of instants the rate ramps to A x (A ~ U(5, 10)) within
  1-5 s, then decays exponentially (tau ~ U(20, 120) s). c_r is set from the exact grid
  integral of D*B so that expected counts are w_r * rate * duration whatever the bursts.
  Counts per second are Poisson, arrivals uniform within the second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from janusd.trace.formats import Trace

KINDS = {
    # kind: (output share of the mean length, sigma_in, sigma_out, ttft_slo_ms, tpot_slo_ms)
    "chat": ((0.2, 0.45), 0.9, 0.8, 1000.0, 100.0),
    "code": ((0.03, 0.12), 0.8, 1.0, 800.0, 50.0),
    "writer": ((0.4, 0.6), 0.7, 0.6, 1500.0, 100.0),
    "rag": ((0.02, 0.08), 0.6, 0.8, 3000.0, 150.0),
}


@dataclass(frozen=True)
class SynthParams:
    """Knobs of the generator. Defaults: 24 h of 62 apps is ~260 k requests."""

    apps: int = 62
    hours: float = 24.0
    seed: int = 0
    rate: float = 3.0  # mean requests/s over the trace at rate_scale 1
    rate_scale: float = 1.0
    top12_request_share: float = 0.8
    top30_token_share: float = 0.8
    base_length: float = 600.0  # mean input+output tokens of the most popular app
    max_input: int = 32000
    max_output: int = 4096
    diurnal_amplitude: float = 0.5
    start_hour: float = 0.0
    bursts_per_app_hour: float = 0.5
    with_slo: bool = True

    def check(self) -> None:
        if self.apps < 1:
            raise ValueError(f"apps must be >= 1, got {self.apps}")
        if not self.hours > 0:
            raise ValueError(f"hours must be > 0, got {self.hours}")
        if not (self.rate > 0 and self.rate_scale > 0):
            raise ValueError("rate and rate_scale must be > 0")
        for name in ("top12_request_share", "top30_token_share"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"{name} must be in (0, 1)")
        if not 0 <= self.diurnal_amplitude < 1:
            raise ValueError("diurnal_amplitude must be in [0, 1)")
        if self.bursts_per_app_hour < 0:
            raise ValueError("bursts_per_app_hour must be >= 0")
        expected = self.rate * self.rate_scale * self.hours * 3600
        if expected > 50_000_000:
            raise ValueError(f"that is ~{expected:.3g} requests; lower --rate/--rate-scale/--hours (limit 5e7)")


@dataclass(frozen=True)
class AppProfile:
    name: str
    model: str
    kind: str
    request_share: float
    mean_input: float  # lognormal mean before clipping
    mean_output: float
    sigma_input: float
    sigma_output: float
    ttft_slo_ms: float
    tpot_slo_ms: float


def top_k(n: int, fraction: float) -> int:
    """How many apps "the top x%" means: max(1, round(x * n)) (62 apps: 12% -> 7, 30% -> 19)."""
    return max(1, int(math.floor(fraction * n + 0.5)))


def top_share(values: np.ndarray, k: int) -> float:
    v = np.sort(np.asarray(values, dtype=np.float64))[::-1]
    total = v.sum()
    return float(v[:k].sum() / total) if total > 0 else float("nan")


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _phi(x: np.ndarray) -> np.ndarray:
    """Standard normal CDF (elementwise)."""
    return 0.5 * (1.0 + _erf(np.asarray(x, dtype=np.float64) / math.sqrt(2.0)))


def clipped_lognormal_mean(mean: np.ndarray, sigma: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """E[clip(X, lo, hi)] for X lognormal with the given mean and log-sd (closed form)."""
    mean, sigma = np.asarray(mean, dtype=np.float64), np.asarray(sigma, dtype=np.float64)
    mu = np.log(mean) - sigma**2 / 2
    a, b = (np.log(lo) - mu) / sigma, (np.log(hi) - mu) / sigma
    inner = mean * (_phi(b - sigma) - _phi(a - sigma))
    return lo * _phi(a) + inner + hi * (1 - _phi(b))


def _bisect(f, lo: float, hi: float, target: float, increasing: bool, iters: int = 80) -> float:
    for _ in range(iters):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def app_profiles(p: SynthParams) -> list[AppProfile]:
    """The calibrated per-app parameters (pure function of the params and seed)."""
    p.check()
    rng = np.random.default_rng([p.seed, 1])
    n = p.apps
    ranks = np.arange(1, n + 1, dtype=np.float64)
    k12, k30 = top_k(n, 0.12), top_k(n, 0.30)
    if n > 1:
        s = _bisect(lambda x: top_share(ranks**-x, k12), 0.0, 10.0, p.top12_request_share, increasing=True)
    else:
        s = 1.0
    w = ranks**-s
    w /= w.sum()
    head = ranks <= k12
    kinds = np.where(head, rng.choice(["chat", "code"], size=n, p=[0.7, 0.3]),
                     rng.choice(["chat", "code", "writer", "rag"], size=n, p=[0.35, 0.2, 0.25, 0.2]))  # fmt: skip
    out_share = np.array([rng.uniform(*KINDS[k][0]) for k in kinds])
    sig_in = np.array([KINDS[k][1] for k in kinds])
    sig_out = np.array([KINDS[k][2] for k in kinds])
    jitter = np.exp(rng.normal(0.0, 0.25, size=n))
    longctx = np.where(kinds == "rag", 4.0, 1.0)

    def means(beta: float) -> tuple[np.ndarray, np.ndarray]:
        length = p.base_length * (w[0] / w) ** beta * jitter * longctx
        return length * (1 - out_share), np.maximum(length * out_share, 1.0)

    def token_top(beta: float) -> float:
        mi, mo = means(beta)
        e = clipped_lognormal_mean(mi, sig_in, 1, p.max_input) + clipped_lognormal_mean(mo, sig_out, 1, p.max_output)
        return top_share(w * e, k30)

    beta = _bisect(token_top, -1.0, 1.5, p.top30_token_share, increasing=False) if n > 1 else 0.0
    mi, mo = means(beta)
    width = len(str(n))
    return [
        AppProfile(
            name=f"app{r + 1:0{width}d}-{kinds[r]}", model=f"model{r + 1:0{width}d}", kind=str(kinds[r]),
            request_share=float(w[r]), mean_input=float(mi[r]), mean_output=float(mo[r]),
            sigma_input=float(sig_in[r]), sigma_output=float(sig_out[r]),
            ttft_slo_ms=KINDS[kinds[r]][3], tpot_slo_ms=KINDS[kinds[r]][4],
        )  # fmt: skip
        for r in range(n)
    ]


def _intensity(p: SynthParams, rng: np.random.Generator, seconds: int) -> np.ndarray:
    """Relative rate D*B of one app on the 1 s grid (bin centres)."""
    t = np.arange(seconds, dtype=np.float64) + 0.5
    hour = p.start_hour + t / 3600.0
    peak = 14.0 + rng.uniform(-2.0, 2.0)
    shape = 1.0 + p.diurnal_amplitude * np.cos(2 * np.pi * (hour - peak) / 24.0)
    burst = np.zeros(seconds)
    for _ in range(rng.poisson(p.bursts_per_app_hour * p.hours)):
        t0 = rng.uniform(0, seconds)
        amp, rise, tau = rng.uniform(5.0, 10.0), rng.uniform(1.0, 5.0), rng.uniform(20.0, 120.0)
        i0 = int(t0)
        i1 = min(seconds, i0 + int(rise + 8 * tau) + 1)
        x = t[i0:i1] - t0
        g = np.where(x < rise, np.clip(x / rise, 0, 1), np.exp(-(x - rise) / tau))
        burst[i0:i1] += (amp - 1.0) * g
    return shape * (1.0 + burst)


def _lognormal(rng: np.random.Generator, mean: float, sigma: float, size: int, hi: int) -> np.ndarray:
    mu = math.log(mean) - sigma**2 / 2
    return np.clip(np.rint(rng.lognormal(mu, sigma, size)), 1, hi).astype(np.int64)


def synthesize(p: SynthParams) -> Trace:
    """Generate the trace (sorted by arrival, arrivals rounded to 1 us)."""
    profiles = app_profiles(p)
    seconds = max(1, int(round(p.hours * 3600)))
    total = p.rate * p.rate_scale * seconds
    root = np.random.SeedSequence([p.seed, 2])
    arrivals, app_ids, ins, outs = [], [], [], []
    for a, (prof, seq) in enumerate(zip(profiles, root.spawn(len(profiles)), strict=True)):
        rng = np.random.default_rng(seq)
        shape = _intensity(p, rng, seconds)
        lam = shape * (prof.request_share * total / shape.sum())
        counts = rng.poisson(lam)
        m = int(counts.sum())
        times = np.repeat(np.arange(seconds, dtype=np.float64), counts) + rng.random(m)
        arrivals.append(times)
        app_ids.append(np.full(m, a, dtype=np.int32))
        ins.append(_lognormal(rng, prof.mean_input, prof.sigma_input, m, p.max_input))
        outs.append(_lognormal(rng, prof.mean_output, prof.sigma_output, m, p.max_output))
    arrival = np.round(np.concatenate(arrivals), 6)
    app_id = np.concatenate(app_ids)
    order = np.lexsort((app_id, arrival))
    app_id = app_id[order]
    ttft = np.array([pr.ttft_slo_ms for pr in profiles])[app_id]
    tpot = np.array([pr.tpot_slo_ms for pr in profiles])[app_id]
    names = [pr.name for pr in profiles]
    models = [pr.model for pr in profiles]
    nan = np.full(len(app_id), np.nan)
    return Trace(
        arrival_s=arrival[order],
        app_id=app_id,
        model_id=app_id.copy(),
        input_tokens=np.concatenate(ins)[order],
        output_tokens=np.concatenate(outs)[order],
        ttft_slo_ms=ttft if p.with_slo else nan,
        tpot_slo_ms=tpot if p.with_slo else nan.copy(),
        apps=tuple(names),
        models=tuple(models),
    )
