"""Waiting out a drain, in the daemon: the core drains (core/draining.py: the one
implementation, bounded, the simulator's too); this awaits its end. An instance (or a
model) that leaves Active lets its requests in flight finish, up to
`server.drain_timeout_s`; what is still running then is ended by the core with the
Failure given here. Used by `ctl unload` / `remove` / a reload (server/model_ops.py) and a
state move to Warm or Cold (server/lifecycle_ops.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from janusd.core import Failure, Instance, ServingCore
from janusd.server.daemon_clock import clock


async def drain(core: ServingCore, inst: Instance, bound_s: float, failure: Failure,
                poke: Callable[[], None]) -> tuple[float, int]:
    """Drain `inst`; returns (seconds waited, requests ended at the bound). The daemon's
    tick task ends the drain (poked here so it knows the bound); should no tick come
    (the task backing off after errors), this ticks the core itself past the bound."""
    fut: asyncio.Future[tuple[float, int]] = asyncio.get_running_loop().create_future()
    t0 = clock()

    def done(now: float, ended: int) -> None:
        if not fut.done():
            fut.set_result((now - t0, ended))

    core.drain(inst, t0, bound_s, failure, done)
    poke()
    while not fut.done():
        await asyncio.wait({fut}, timeout=max(0.05, t0 + bound_s + 0.5 - clock()))
        if not fut.done() and clock() >= t0 + bound_s + 0.5:
            core.tick(clock())
    return fut.result()
