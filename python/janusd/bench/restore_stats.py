"""`janus bench restore`'s statistics (bench/restore.py): pure, so a recorded run's gaps
can be re-judged by hand."""

from __future__ import annotations

import statistics


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))] if s else float("nan")


def pair_bootstrap(by_pair: list[tuple[list[float], list[float]]], n: int = 2000) -> list[float]:
    """The 5th and 95th percentiles of the p99 increase (%) over the pairs resampled with
    replacement (n draws, seeded): how far the figure moves with which pairs one happened
    to measure. [nan, nan] for fewer than 2 pairs."""
    import random

    if len(by_pair) < 2:
        return [float("nan"), float("nan")]
    rng = random.Random(0)
    draws = []
    for _ in range(n):
        pick = [by_pair[rng.randrange(len(by_pair))] for _ in by_pair]
        q = [g for a, _ in pick for g in a]
        d = [g for _, b in pick for g in b]
        if q and d:
            draws.append((p99(d) / p99(q) - 1) * 100)
    draws.sort()
    return [round(draws[int(0.05 * len(draws))], 1), round(draws[int(0.95 * len(draws)) - 1], 1)]
