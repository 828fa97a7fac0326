"""Static, right-sized (`janus sim --vs-static`): a comparison with static on every device
flatters any controller (static then holds the whole pool for the whole run), so beside
it the simulator reports static as an operator who sized it would run it: on the fewest
devices at which it reaches the controller's token attainment, and on as many devices as
the controller used on average (its device-hours over the run). Each figure is a run of
the `static` policy (devices split evenly, bound for the run) on the same trace."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from janusd.sim.placement import PlacementError

Run = Callable[[int], dict[str, Any]]  # devices -> that static run's summary


def _static(run: Run, n: int, seen: dict[int, dict[str, Any] | None]) -> dict[str, Any] | None:
    """Static's summary on `n` devices (None where static cannot place every model)."""
    if n not in seen:
        try:
            seen[n] = run(n)
        except PlacementError:
            seen[n] = None
    return seen[n]


def _attainment(run: Run, n: int, seen: dict[int, dict[str, Any] | None]) -> float:
    s = _static(run, n, seen)
    return -1.0 if s is None else float(s["token_attainment"])


def fewest_devices(run: Run, target: float, lo: int, hi: int, seen: dict[int, dict[str, Any] | None]) -> int | None:
    """The fewest devices in [lo, hi] at which static reaches `target`, by bisection (static's
    attainment grows with its devices: each model gets more; where it does not, this finds
    a crossing, not necessarily the first); None when `hi` devices do not reach it."""
    if _attainment(run, hi, seen) < target:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        if _attainment(run, mid, seen) >= target:
            hi = mid
        else:
            lo = mid + 1
    return hi


def _figures(n: int | None, s: dict[str, Any] | None) -> dict[str, Any]:
    return {"devices": n, "token_attainment": None if s is None else s["token_attainment"],
            "device_hours": None if s is None else s["device_hours"]}


def vs_static(run: Run, controller: dict[str, Any], devices: int, models: int) -> dict[str, Any]:
    """Static on all `devices`, right-sized to the controller's token attainment (from
    `models` devices up: one each at least), and on the controller's mean devices (its
    device-hours over its run, time 0 to the last request's end, rounded up)."""
    seen: dict[int, dict[str, Any] | None] = {}
    target = float(controller["token_attainment"])
    n = fewest_devices(run, target, max(1, models), devices, seen)
    span_s = max(float(controller["sim_end_s"]), 1e-9)
    mean = max(1, min(devices, math.ceil(controller["device_hours"] * 3600.0 / span_s)))
    return {"all_devices": _figures(devices, _static(run, devices, seen)),
            "right_sized": {**_figures(n, seen.get(n) if n is not None else None), "target": target},
            "at_controller_devices": _figures(mean, _static(run, mean, seen)),
            "runs": len(seen)}
