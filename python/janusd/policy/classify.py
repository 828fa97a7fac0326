"""Bursty isolation: which apps the elastic pool serves (PAPER.md §2), with hysteresis.

`classify(traffic, state, now, config)`, pure and deterministic, per app:
- an operator pin decides (config), whatever the traffic;
- a steady app goes elastic when it is hot (mean rate >= elastic_rate) or bursty
  (volatility = peak/mean >= elastic_volatility, at a mean rate of at least
  min_burst_rate: below it a handful of requests makes any peak/mean);
- an elastic app is quiet when its rate is below steady_rate and it is calm
  (volatility below steady_volatility, or a rate below min_burst_rate); it returns to the
  steady pool only after staying quiet for quiet_s (its demotion); any tick that is not
  quiet restarts that clock.
The lower thresholds sit strictly below the upper ones (ClassifyConfig checks), so an
app whose rate wanders around one threshold crosses to elastic once and stays: the band
between the two is the hysteresis, and quiet_s bounds how often it can come back. An app
seen for the first time starts steady and is classified at once.
Nothing here counts evaluations: promotion is immediate and demotion is measured on
`now`, so the shell may classify on every fast tick (it costs microseconds per app) to
isolate a burst within 0.5 s instead of waiting for the 30 s tick, without changing
how long an app must stay quiet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from janusd.policy.policy_config import ClassifyConfig
from janusd.policy.snapshot import AppPool, AppTraffic, Classification, Pool, PoolDecision


class ClassifyError(ValueError):
    """Bad traffic figures (negative or not finite, peak below mean, an app twice)."""


def volatility(t: AppTraffic) -> float:
    """peak/mean; 1.0 (flat) for an app with no traffic."""
    return t.peak_rate / t.rate if t.rate > 0.0 else 1.0


def traffic_from_counts(app: str, counts: Sequence[int], bucket_s: float, short_buckets: int,
                        pin: Pool | None = None) -> AppTraffic:
    """An app's AppTraffic from its arrivals per bucket over the long window (oldest
    first): mean rate over all of it, peak rate over any `short_buckets` consecutive
    buckets (the short window that makes a 5-10x jump within seconds visible while the
    mean over minutes barely moves)."""
    if bucket_s <= 0 or short_buckets < 1 or not counts:
        raise ClassifyError(f"app {app!r}: need counts, bucket_s > 0 and short_buckets >= 1")
    if any(c < 0 for c in counts):
        raise ClassifyError(f"app {app!r}: counts must be >= 0")
    k = min(short_buckets, len(counts))
    window = sum(counts[:k])
    peak = window
    for i in range(k, len(counts)):
        window += counts[i] - counts[i - k]
        peak = max(peak, window)
    rate = sum(counts) / (len(counts) * bucket_s)
    return AppTraffic(app=app, rate=rate, peak_rate=max(peak / (k * bucket_s), rate), pin=pin)


def _check(traffic: Sequence[AppTraffic]) -> None:
    seen: set[str] = set()
    for t in traffic:
        if t.app in seen:
            raise ClassifyError(f"app {t.app!r} appears twice")
        seen.add(t.app)
        if not (math.isfinite(t.rate) and math.isfinite(t.peak_rate) and t.rate >= 0.0):
            raise ClassifyError(f"app {t.app!r}: rates must be finite and >= 0, got {t.rate}, {t.peak_rate}")
        if t.peak_rate < t.rate:
            raise ClassifyError(f"app {t.app!r}: peak_rate {t.peak_rate} is below the mean rate {t.rate}")


def classify(traffic: Sequence[AppTraffic], state: Sequence[AppPool], now: float,
             cfg: ClassifyConfig) -> Classification:
    """Each app's pool now, why, and the state to pass to the next evaluation. Apps
    absent from `traffic` are forgotten."""
    _check(traffic)
    before = {s.app: s for s in state}
    decisions: list[PoolDecision] = []
    out: list[AppPool] = []
    for t in sorted(traffic, key=lambda t: t.app):
        prev = before.get(t.app)
        was = prev.pool if prev is not None else "steady"
        vol = volatility(t)
        figures = f"rate {t.rate:.2f}/s, peak/mean {vol:.2f}"
        quiet_since = None
        if t.pin is not None:
            pool, why = t.pin, f"pinned to {t.pin} by the operator"
        elif was == "steady":
            hot = t.rate >= cfg.elastic_rate
            bursty = t.rate >= cfg.min_burst_rate and vol >= cfg.elastic_volatility
            if hot or bursty:
                pool = "elastic"
                why = f"{'hot' if hot else 'bursty'}: {figures}"
            else:
                pool, why = "steady", f"steady: {figures}"
        else:
            calm = vol < cfg.steady_volatility or t.rate < cfg.min_burst_rate
            if t.rate < cfg.steady_rate and calm:
                quiet_since = prev.quiet_since if prev is not None and prev.quiet_since is not None else now
                if now - quiet_since >= cfg.quiet_s:
                    pool, why, quiet_since = "steady", f"quiet for {now - quiet_since:.0f} s: {figures}", None
                else:
                    pool, why = "elastic", f"quiet for {now - quiet_since:.0f} s of {cfg.quiet_s:.0f}: {figures}"
            else:
                pool, why = "elastic", f"elastic: {figures}"
        decisions.append(PoolDecision(app=t.app, pool=pool, changed=pool != was, reason=why))  # type: ignore[arg-type]
        out.append(AppPool(app=t.app, pool=pool, quiet_since=quiet_since))  # type: ignore[arg-type]
    return Classification(decisions=tuple(decisions), state=tuple(out))
