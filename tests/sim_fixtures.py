"""Small traces for the simulator tests (synthetic, seeded)."""

from __future__ import annotations

import numpy as np

from janusd.trace.formats import Trace


def poisson_trace(n: int, span_s: float, apps: dict[str, str], seed: int = 0, max_in: int = 2000,
                  max_out: int = 300, weights: list[float] | None = None) -> Trace:
    """n requests uniformly over span_s; app -> model name; lengths uniform."""
    rng = np.random.default_rng(seed)
    names = sorted(apps)
    p = None if weights is None else np.asarray(weights) / np.sum(weights)
    app = rng.choice(len(names), n, p=p)
    return Trace.build(np.sort(rng.uniform(0, span_s, n)), [names[a] for a in app], [apps[names[a]] for a in app],
                       rng.integers(16, max_in, n), rng.integers(1, max_out, n))
