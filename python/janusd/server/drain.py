"""Waiting out a drain, in the daemon: an instance (or a model) that leaves Active lets its
requests in flight finish, up to `server.drain_timeout_s`; what is still running then is
ended by the core (ServingCore.fail_requests: aborted on its worker, failed to its
client). One implementation for `ctl unload` / `remove` / a reload (server/model_ops.py)
and a state move to Warm or Cold (server/lifecycle_ops.py). The simulator's drains end
when its workers say so (sim/cluster.py) and need no polling."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from janusd.core import Request
from janusd.server.daemon_clock import clock


async def drained(running: Callable[[], Sequence[Request]], bound_s: float, poll_s: float = 0.02) -> float:
    """Wait until `running()` is empty or `bound_s` passed; returns the seconds waited."""
    t0 = clock()
    deadline = t0 + bound_s
    while running() and clock() < deadline:
        await asyncio.sleep(poll_s)
    return clock() - t0
