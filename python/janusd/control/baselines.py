"""The elastic allocator of the BlitzScale baseline (`janus sim --policy blitzscale`):
each app scaled to its own m*, first come first served by app name, until the budget
runs out; no debounce, no global compression. It lives beside the room because the
simulator's baselines must run the same room with one rule swapped, not a second
controller (PAPER.md §9 compares Janus with exactly this allocator)."""

from __future__ import annotations

from collections.abc import Sequence

from janusd.policy.snapshot import AppCount, ElasticApp, ScalingPlan, ScalingState


def first_come(apps: Sequence[ElasticApp], budget: int, state: ScalingState) -> ScalingPlan:
    """Counts by app name: min(m*, the instances what is left holds: a tp-N instance takes
    N devices of the budget); `state` passes through unchanged."""
    left, out = budget, []
    for a in sorted(apps, key=lambda a: a.app):
        n = min(a.demand, left // a.devices)
        left -= n * a.devices
        out.append(AppCount(app=a.app, demand=a.demand, debounced=a.demand, count=n, prefill=0, decode=n,
                            reason="first come" if n == a.demand else f"first come: {n} of {a.demand} left"))
    asked = sum(a.demand * a.devices for a in apps)
    return ScalingPlan(apps=tuple(out), budget=budget, asked=asked, given=budget - left,
                       compressed=asked > budget, state=state)
