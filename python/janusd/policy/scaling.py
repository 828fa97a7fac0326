"""Fast path: how many instances each elastic app gets, every 0.5 s (PAPER.md §5).

`scale(apps, budget, state, config)`, pure and deterministic, in three steps:

1. Debounce. A raw demand (m*) that flips around a threshold (3, 4, 3, 4, ...) must not
   flip the count. Rule: with the last `debounce_plans` demands (this one included), the
   debounced demand stays where it was while that value lies between their minimum and
   maximum, and otherwise moves to the nearer end. So it moves only when every recent
   demand is on the same side of it (a real change lasts two ticks: one tick, 0.5 s, of
   delay), and on an input oscillating between two values it changes at most once and
   then holds (tests/test_policy_scaling.py). The first tick of an app takes its demand.
2. Budget. The elastic budget is the devices the steady pool leaves (the caller passes
   it: the pool minus the steady plan's bins_used; scale-in waits for drain, so a device
   whose instance is still draining is counted as held until it is free). When the debounced demands fit, each app gets its own. When they exceed it,
   each app first gets `min_instances_per_app` (when the budget allows that for every
   app), and the rest is shared in proportion to what each asked beyond it, by the
   largest-remainder (Hamilton) method: floors of the exact quotas, then one more
   instance to the largest remainders. Ties between equal remainders go to the app that
   holds more instances now (fewer moves), then the larger demand, then the app name.
   The counts then sum to the budget exactly, and each is within one of its exact quota
   and never above its demand. Hamilton's method can give an app one instance fewer at
   a larger budget (the Alabama paradox; a test shows the case), which the debounce of
   the next ticks absorbs as it would any change.
3. P/D. An app with at least `pd_min_instances` instances runs prefill and decode apart:
   round(count * prefill_share) prefill instances (halves up), at least one of each.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from janusd.policy.policy_config import ScalingConfig
from janusd.policy.snapshot import AppCount, ElasticApp, ScalingPlan, ScalingState


class ScalingError(ValueError):
    """Bad scaling input (duplicate app, negative demand or budget); names what."""


def _check(apps: Sequence[ElasticApp], budget: int) -> None:
    if budget < 0:
        raise ScalingError(f"budget must be >= 0, got {budget}")
    seen: set[str] = set()
    for a in apps:
        if a.app in seen:
            raise ScalingError(f"elastic app {a.app!r} appears twice")
        seen.add(a.app)
        if a.demand < 0 or a.current < 0:
            raise ScalingError(f"elastic app {a.app!r}: demand and current must be >= 0")
        if not 0.0 <= a.prefill_share <= 1.0:
            raise ScalingError(f"elastic app {a.app!r}: prefill_share must be in [0, 1], got {a.prefill_share}")


def debounce(previous: int | None, recent: Sequence[int]) -> int:
    """The debounced demand: `previous` clamped into [min(recent), max(recent)]."""
    lo, hi = min(recent), max(recent)
    if previous is None:
        return recent[-1]
    return min(max(previous, lo), hi)


def largest_remainder(weights: Sequence[int], seats: int, tie: Sequence[tuple[int, ...]] | None = None) -> list[int]:
    """Hamilton apportionment of `seats` in proportion to integer `weights` (sum > 0):
    floors of the exact quotas (exact rational arithmetic, no float ties), then one seat
    each to the largest remainders; `tie[i]` orders equal remainders (larger first),
    then the lower index."""
    total = sum(weights)
    if total <= 0:
        raise ScalingError("largest_remainder: weights must sum to > 0")
    quotas = [Fraction(w * seats, total) for w in weights]
    out = [int(q) for q in quotas]  # floor: quotas are >= 0
    rest = seats - sum(out)
    key = tie if tie is not None else [() for _ in weights]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - out[i]), tuple(-x for x in key[i]), i))
    for i in order[:rest]:
        out[i] += 1
    return out


def _split(count: int, share: float, cfg: ScalingConfig) -> tuple[int, int]:
    if count < cfg.pd_min_instances:
        return 0, count
    prefill = min(max(int(count * share + 0.5), 1), count - 1)
    return prefill, count - prefill


def scale(apps: Sequence[ElasticApp], budget: int, state: ScalingState, cfg: ScalingConfig) -> ScalingPlan:
    """Counts per elastic app for this tick (see the module doc), and the state to pass
    to the next tick. Apps absent from `apps` are forgotten by the state."""
    _check(apps, budget)
    ordered = sorted(apps, key=lambda a: a.app)
    history = dict(state.recent_demands)
    prev = dict(state.debounced)
    keep = max(cfg.debounce_plans - 1, 0)
    recents: list[tuple[int, ...]] = []
    wanted: list[int] = []
    for a in ordered:
        recent = (tuple(history.get(a.app, ())) + (a.demand,))[-cfg.debounce_plans:]
        recents.append(recent)
        wanted.append(debounce(prev.get(a.app), recent))
    asked = sum(wanted)
    compressed = asked > budget
    if not compressed:
        counts = list(wanted)
    else:
        floor = cfg.min_instances_per_app if budget >= cfg.min_instances_per_app * len(ordered) else 0
        base = [min(floor, w) for w in wanted]
        extra = [w - b for w, b in zip(wanted, base)]
        seats = budget - sum(base)
        tie = [(a.current, w) for a, w in zip(ordered, wanted)]
        share = largest_remainder(extra, seats, tie) if sum(extra) > 0 else [0] * len(extra)
        counts = [b + s for b, s in zip(base, share)]
    out = []
    for a, recent, w, c in zip(ordered, recents, wanted, counts):
        p, d = _split(c, a.prefill_share, cfg)
        if w != a.demand:
            why = f"debounced: m* {a.demand}, recent {list(recent)}, kept {w}"
        else:
            why = f"m* {a.demand}"
        if c < w:
            why += f"; compressed to {c} (budget {budget} < asked {asked})"
        out.append(AppCount(app=a.app, demand=a.demand, debounced=w, count=c, prefill=p, decode=d, reason=why))
    new_state = ScalingState(
        recent_demands=tuple((a.app, recent[len(recent) - keep:] if keep else ()) for a, recent in zip(ordered, recents)),
        debounced=tuple((a.app, w) for a, w in zip(ordered, wanted)),
    )
    return ScalingPlan(apps=tuple(out), budget=budget, asked=asked, given=sum(counts), compressed=compressed,
                       state=new_state)
