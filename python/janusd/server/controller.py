"""The controller's daemon shell: the control room (control/room.py) on real time and
real workers (PAPER.md §2, §4, §5, §8).

With `control.managed`, two loops run in the daemon, fast (control.fast_period_s, 0.5 s)
and slow (control.slow_period_s, 30 s). At each tick the shell reads the core into the
room's snapshot (control/observe.py), asks the room for that tick's plan, and carries
each Op out as a task through the lifecycle operations (server/lifecycle_ops.py: a fork
from the Op's source, else the lifecycle's own path by estimated time; a P/D
reassignment drains to Warm and comes back in its new role; a migration's second half
only once its first succeeded), then tells the room how it ended. What to do is the
room's alone: the simulator (sim/control_shell.py) drives the same room, and
tests/test_control_rooms.py fails if a module here decides what it decides.

A loop that overruns its period logs it and skips the missed ticks, never stacks them;
a tick that raises is logged and the loop lives on. `janus ctl plan` shows what the room
decided and why (control/view.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from janusd.config import JanusConfig
from janusd.control.observe import observe, pool_devices
from janusd.control.ops import Activate, Op, Reassign, Rest
from janusd.control.room import ControlRoom
from janusd.control.snapshot import ControlSnapshot, Predictor
from janusd.control.view import plan_view
from janusd.core import ServingCore
from janusd.lifecycle.states import InstanceState
from janusd.log import log
from janusd.server.daemon_clock import clock as daemon_clock
from janusd.server.decisions import Decision, DecisionLog

__all__ = ["Controller", "ControllerHost", "Op", "Predictor"]

S = InstanceState


class ControllerHost(Protocol):
    """What the controller's shell needs of the daemon (server/daemon.py implements it)."""

    core: ServingCore

    @property
    def cfg(self) -> JanusConfig: ...

    def predictor(self) -> Predictor: ...

    async def set_state(self, name: str, device: int, target: str, probe: bool = True,
                        role: str | None = None) -> dict[str, Any]: ...

    async def fork(self, name: str, src: int, dst: int) -> dict[str, Any]: ...


class Controller:
    """The two loops and the operations' tasks around one ControlRoom."""

    def __init__(self, host: ControllerHost, clock: Callable[[], float] = daemon_clock,
                 on_op: Callable[[str, str], None] = lambda op, outcome: None,
                 on_elastic: Callable[[str, int, int, tuple[int, int] | None], None] =
                 lambda model, demand, count, split: None,
                 on_move: Callable[[str, str], None] = lambda kind, outcome: None,
                 on_figure: Callable[[str, float], None] = lambda figure, value: None,
                 decisions: DecisionLog | None = None,
                 absent: Callable[[], Iterable[int]] = lambda: ()) -> None:
        """The hooks are the room's (control/room.py ControlRoom): metrics. `decisions`:
        where each Op carried is recorded (server/decisions.py; the daemon's, shared with
        the wakes). `absent`: the device slots no node offers now (the ray launcher,
        server/node_joins.py), left out of the pool the room places on."""
        self.host = host
        self.absent = absent
        self.clock = clock
        self.decisions = decisions if decisions is not None else DecisionLog(host.cfg.control.decisions_kept)
        self.room = ControlRoom(host.cfg.control, on_op=on_op, on_elastic=on_elastic, on_move=on_move,
                                on_figure=on_figure, log=lambda msg, level: log.log(level, msg))
        self.overruns = {"fast": 0, "slow": 0}
        self._tasks: set[asyncio.Task[Any]] = set()

    def snapshot(self, now: float) -> ControlSnapshot:
        cfg = self.host.cfg
        gone = set(self.absent())
        pool = cfg.control.pool_devices
        if gone:  # the configured pool (every device when none is) less the absent slots
            pool = [d for d in pool_devices(cfg.devices.count, pool) if d not in gone] or pool
        return observe(self.host.core, now, cfg.devices.count, self.host.predictor(), cfg.control.managed, pool)

    # the room's plans, on the core as it is now (tests call these with a fake clock)
    def plan_fast(self, now: float) -> list[Op]:
        return self.room.plan_fast(self.snapshot(now), now)

    def plan_slow(self, now: float) -> list[Op]:
        return self.room.plan_slow(self.snapshot(now), now)

    # -------------------------------------------------------------- execution
    def start(self, ops: list[Op]) -> None:
        """Carry each Op out as a task (the room issued each one once)."""
        for op in ops:
            rec = self.decisions.carried(op, self.clock())
            t = asyncio.get_running_loop().create_task(self._run(op, rec), name=f"ctl-{op.model}-{op.device}")
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _carry(self, op: Op) -> dict[str, dict[str, Any]]:
        """One Op through the lifecycle operations; returns the workers' replies by half
        ("leave" of a reassignment, "up" or the op's own, "down" of a migration)."""
        h = self.host
        replies: dict[str, dict[str, Any]] = {}
        match op:
            case Activate(source=int(src), role=None):  # a new replica: D2D from a live one
                replies["up"] = await h.fork(op.model, src, op.device)
            case Activate():  # the lifecycle's own path (H2D, a Cold load, a full load)
                replies["up"] = await h.set_state(op.model, op.device, "active", probe=False, role=op.role)
            case Reassign():  # drain to Warm, come back in the new role (one operation, one device)
                replies["leave"] = await h.set_state(op.model, op.device, "warm", probe=False)
                replies["up"] = await h.set_state(op.model, op.device, "active", probe=False, role=op.role)
            case Rest():
                replies["down"] = await h.set_state(op.model, op.device, op.target, probe=False)
        nxt = op.then if isinstance(op, Activate) else None
        if nxt is not None and self._active(nxt.model, nxt.device):
            replies["down"] = await h.set_state(nxt.model, nxt.device, nxt.target, probe=False)
        return replies

    def _active(self, model: str, device: int) -> bool:
        m = self.host.core.model(model)
        i = m.instances.get(device) if m is not None else None
        return i is not None and i.state is S.ACTIVE

    async def _run(self, op: Op, rec: Decision) -> None:
        replies: dict[str, dict[str, Any]] = {}
        try:
            replies = await self._carry(op)
            outcome = "ok"
        except Exception as e:  # a refused or failed move: planned again next period
            outcome = f"{type(e).__name__}: {e}"
        now = self.clock()
        self.decisions.ended(rec, outcome, now)
        phases = {f"{half}_{k}" if half in ("leave", "down") and op.target == "active" else k: float(v)
                  for half, r in replies.items() for k, v in (r.get("phases") or {}).items()}
        detail = {half: {k: r[k] for k in ("path", "state", "total_s", "source_device", "kept") if k in r}
                  for half, r in replies.items()}
        self.start(self.room.finished(op, outcome, now, self.snapshot(now), phases, detail))

    async def run(self) -> None:
        cfg = self.host.cfg.control
        await asyncio.gather(self._loop("fast", cfg.fast_period_s, self.plan_fast),
                             self._loop("slow", cfg.slow_period_s, self.plan_slow))

    async def _loop(self, name: str, period: float, plan: Callable[[float], list[Op]]) -> None:
        nxt = self.clock()
        while True:
            now = self.clock()
            try:
                self.start(plan(now))
            except Exception as e:  # a policy's ValueError on odd input: logged, the loop lives on
                log.error(f"controller {name} loop: {type(e).__name__}: {e}")
            took = self.clock() - now
            nxt += period
            if self.clock() > nxt:
                skipped = int((self.clock() - nxt) // period) + 1
                self.overruns[name] += 1
                log.warning(f"controller {name} loop overran its {period:g} s period ({took:.3f} s); "
                            f"skipping {skipped} tick(s)")
                nxt += skipped * period
            await asyncio.sleep(max(0.0, nxt - self.clock()))

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ views
    def view(self, now: float) -> dict[str, Any]:
        """`janus ctl plan` (control/view.py)."""
        return plan_view(self.room, self.snapshot(now), now, self.overruns)
