"""Fixed placements of the simulator's baselines: how many device groups each served model
gets for the whole run, and which devices.

- even (the `static` baseline, ServerlessLLM-like, PAPER.md §9): the pool is split evenly
  between the served models, each bound to its share for the whole run;
- proportional (the dispatch variants rr, least-load, lst-imh-*): the pool split by each
  model's share of the trace's work (`work_s`), so that the dispatch policies are
  compared on a placement that fits the load, not on one that starves the popular apps.
Every model gets one group at least; an instance of tp devices takes tp consecutive
devices. Pure functions: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


class PlacementError(ValueError):
    """The pool cannot hold one instance of every served model."""


def split_groups(tps: Mapping[str, int], weights: Mapping[str, float], devices: int) -> dict[str, int]:
    """Instances per model: one each, then the remaining devices by largest remainder of
    weight x devices / tp (ties by name). PlacementError when one each does not fit."""
    names = sorted(tps)
    need = sum(tps[n] for n in names)
    if need > devices:
        raise PlacementError(f"{devices} devices cannot hold one instance of each of the {len(names)} models "
                             f"(that needs {need})")
    total_w = sum(max(0.0, weights.get(n, 0.0)) for n in names) or float(len(names))
    share = {n: (max(0.0, weights.get(n, 0.0)) if total_w else 1.0) / total_w * devices for n in names}
    count = {n: max(1, math.floor(share[n] / tps[n])) for n in names}
    while sum(count[n] * tps[n] for n in names) > devices:  # the floors of the ones raised to 1 overshoot
        n = max((n for n in names if count[n] > 1), key=lambda n: (count[n] * tps[n] - share[n], n))
        count[n] -= 1
    left = devices - sum(count[n] * tps[n] for n in names)
    while True:
        fits = [n for n in names if tps[n] <= left]
        if not fits:
            break
        n = max(fits, key=lambda n: (share[n] / tps[n] - count[n], -names.index(n)))
        count[n] += 1
        left -= tps[n]
    return count


def even(tps: Mapping[str, int], devices: int) -> dict[str, int]:
    """The static baseline: equal device shares (in devices, not instances)."""
    return split_groups(tps, {n: 1.0 for n in tps}, devices)


def lay_out(count: Mapping[str, int], tps: Mapping[str, int]) -> dict[str, list[list[int]]]:
    """Concrete devices: each model's groups of tp consecutive devices, largest tp first."""
    out: dict[str, list[list[int]]] = {}
    nxt = 0
    for n in sorted(count, key=lambda n: (-tps[n], n)):
        groups = []
        for _ in range(count[n]):
            groups.append(list(range(nxt, nxt + tps[n])))
            nxt += tps[n]
        out[n] = groups
    return out
