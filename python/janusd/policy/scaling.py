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
   whose instance is still draining is counted as held until it is free). When the
   debounced demands fit, each app gets its own. When they exceed it, the budget is
   handed out one instance at a time, so that a larger budget only ever adds to what a
   smaller one gave (house monotone: no app loses an instance because the budget grew):
   first `min_instances_per_app` rounds of one instance per app (within a round the
   larger demand first, then the tie-break below), then the rest by Balinski and
   Young's quota method on what each asked beyond that floor: the next instance goes to
   the app with the largest extra / (extra instances so far + 1) (Jefferson's divisor)
   among those it would not lift above their upper quota at the new total. Every
   count then stays within one of its exact quota, never above its demand, and the
   counts sum to the budget exactly. Why not largest remainder (Hamilton): it keeps
   quota but is not house monotone (the Alabama paradox: weights 6, 6, 2 get 4, 4, 2 of
   10 and 5, 5, 1 of 11), and a fast tick whose budget grows by one device must not
   take an instance away from an app (a drain for nothing). Why not a divisor method
   alone (Jefferson, Webster): house monotone but can break quota (a large app takes
   more than its ceiling). The quota method has both (Balinski and Young 1975). Ties
   between equal priorities go to the app that holds more instances now (fewer moves),
   then the larger demand, then the app name. Below `min_instances_per_app` x apps,
   the budget goes by the floor rounds alone (the largest demands first).
   Tensor parallelism ([P]): the budget is devices and an instance of a tp-N app takes
   N of them (ElasticApp.devices). Where every app has tp 1 the above is the whole rule.
   Otherwise (apportion_devices): the floor rounds give whole instances (the larger
   demand first) while the devices left hold one, then the quota method apportions the
   devices left among the apps' extra devices (extra instances x N) and each app gets the
   whole instances its share holds; a share's remainder below N stays unused (at most
   N - 1 devices per tp-N app a tick: the price of not re-solving a knapsack every 0.5 s).
3. P/D. An app with at least `pd_min_instances` instances runs prefill and decode apart:
   round(count * prefill_share) prefill instances (halves up), at least one of each.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

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
        if a.devices < 1:
            raise ScalingError(f"elastic app {a.app!r}: devices per instance must be >= 1, got {a.devices}")
        if not 0.0 <= a.prefill_share <= 1.0:
            raise ScalingError(f"elastic app {a.app!r}: prefill_share must be in [0, 1], got {a.prefill_share}")


def debounce(previous: int | None, recent: Sequence[int]) -> int:
    """The debounced demand: `previous` clamped into [min(recent), max(recent)]."""
    lo, hi = min(recent), max(recent)
    if previous is None:
        return recent[-1]
    return min(max(previous, lo), hi)


def _tie_key(tie: Sequence[tuple[int, ...]] | None, i: int) -> tuple[int, ...]:
    return tuple(-x for x in tie[i]) if tie is not None else ()


def quota_method(weights: Sequence[int], seats: int, tie: Sequence[tuple[int, ...]] | None = None) -> list[int]:
    """Balinski-Young quota apportionment of `seats` in proportion to integer `weights`
    (sum > 0, seats <= sum): one seat at a time, house size h -> h + 1, to the largest
    weight / (seats so far + 1) among apps whose seats so far are below their exact quota
    at h + 1 (so no app passes its upper quota); exact integer arithmetic, no float
    ties. `tie[i]` orders equal priorities (larger first), then the lower index. Each
    count is within one of its quota, they sum to `seats`, and none decreases when
    `seats` grows (house monotone)."""
    total = sum(weights)
    if total <= 0:
        raise ScalingError("quota_method: weights must sum to > 0")
    if not 0 <= seats <= total:
        raise ScalingError(f"quota_method: seats must be in [0, {total}], got {seats}")
    n = len(weights)
    out = [0] * n
    # a heap on priority weight / (a + 1), as the pair (weight, a + 1) compared exactly
    order = sorted(range(n), key=lambda i: _tie_key(tie, i) + (i,))
    rank = {i: r for r, i in enumerate(order)}

    class _P:
        __slots__ = ("i",)

        def __init__(self, i: int) -> None:
            self.i = i

        def __lt__(self, other: _P) -> bool:  # larger priority first, then the tie order
            a, b = self.i, other.i
            lhs, rhs = weights[a] * (out[b] + 1), weights[b] * (out[a] + 1)
            return lhs > rhs if lhs != rhs else rank[a] < rank[b]

    heap = [_P(i) for i in range(n) if weights[i] > 0]
    heapq.heapify(heap)
    for h in range(seats):
        held: list[_P] = []
        while True:
            p = heapq.heappop(heap)
            # eligible: seats so far < quota at h + 1 = weight * (h + 1) / total
            if out[p.i] * total < weights[p.i] * (h + 1):
                break
            held.append(p)
        out[p.i] += 1
        heapq.heappush(heap, p)
        for q in held:
            heapq.heappush(heap, q)
    return out


def apportion(demands: Sequence[int], budget: int, floor: int,
              tie: Sequence[tuple[int, ...]] | None = None) -> list[int]:
    """Counts for `demands` (each > 0 asked; sum > budget) over `budget`: the floor rounds,
    then the quota method on the rest (module doc, step 2). House monotone in `budget`:
    it is the first `budget` seats of one fixed sequence."""
    n = len(demands)
    base = [0] * n
    # the floor rounds: round r gives one instance to each app asking more than r
    by_demand = sorted(range(n), key=lambda i: (-demands[i],) + _tie_key(tie, i) + (i,))
    left = budget
    for r in range(floor):
        for i in by_demand:
            if left == 0:
                return base
            if demands[i] > r:
                base[i] += 1
                left -= 1
    extra = [d - b for d, b in zip(demands, base)]
    if left == 0 or sum(extra) == 0:
        return base
    share = quota_method(extra, min(left, sum(extra)), tie)
    return [b + s for b, s in zip(base, share)]


def apportion_devices(wanted: Sequence[int], devices: Sequence[int], budget: int, floor: int,
                      tie: Sequence[tuple[int, ...]] | None = None) -> list[int]:
    """Instance counts for `wanted` instances of `devices` devices each over `budget`
    devices (module doc, step 2's tensor-parallel rule); never above `wanted`, and the
    counts' devices never exceed `budget`."""
    n = len(wanted)
    counts = [0] * n
    left = budget
    by_demand = sorted(range(n), key=lambda i: (-wanted[i],) + _tie_key(tie, i) + (i,))
    for r in range(floor):
        for i in by_demand:
            if wanted[i] > r and devices[i] <= left:
                counts[i] += 1
                left -= devices[i]
    extra = [(w - c) * k for w, c, k in zip(wanted, counts, devices)]
    if left <= 0 or sum(extra) == 0:
        return counts
    share = quota_method(extra, min(left, sum(extra)), tie)
    return [c + s // k for c, s, k in zip(counts, share, devices)]


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
    asked = sum(w * a.devices for a, w in zip(ordered, wanted))
    compressed = asked > budget
    if not compressed:
        counts = list(wanted)
    else:
        tie = [(a.current, w) for a, w in zip(ordered, wanted)]
        if all(a.devices == 1 for a in ordered):
            counts = apportion(wanted, budget, cfg.min_instances_per_app, tie)
        else:
            counts = apportion_devices(wanted, [a.devices for a in ordered], budget, cfg.min_instances_per_app, tie)
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
    given = sum(c * a.devices for a, c in zip(ordered, counts))
    return ScalingPlan(apps=tuple(out), budget=budget, asked=asked, given=given, compressed=compressed,
                       state=new_state)
