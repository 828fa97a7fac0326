"""The steady pool, executed: placement plans (policy/placement.py) turned into lifecycle
moves on real workers (PAPER.md §4, §8).

With `control.managed`, a model whose config leaves `devices` out is the controller's
to place (a model with `devices` stays pinned there: its instances count on their
devices and never move). At each slow tick, when no move of the last plan is still
queued or running:
1. snapshot (`placement_snapshot`, no awaiting): each managed model that serves (an
   Active or coming-up instance) is one or more steady items, its capacity vector from
   the oracle's CapacityPredictor (a fitted GP or the roofline prior) over its telemetry
   window (policy/demand.py, mean + capacity_margin x std; replicas when one device is
   too small); pinned non-elastic models are pinned items on the devices they serve on;
   the devices that elastic models serve on are `elastic_devices` (taken last). The
   items' current devices are where the model serves now (a key keeps the device the
   last plan gave it when the model still serves there). A model with nothing serving
   (keep-alive sent it Warm or Cold) holds no device and is not placed: its next request
   wakes it where it rests. A model the oracle cannot size yet stays where it is.
2. plan: placement.plan with consolidation and the migration budget of the period.
3. execute, in the plan's order, every move as soon as no earlier unfinished move of the
   plan shares a device with it and its devices have a transfer slot
   (`control.max_transfers_per_device`; a fork occupies its source too):
   - place: the model comes up on the target: a D2D fork from a live replica when one
     is Active, else the lifecycle's own path (H2D from a Warm copy, a Cold load, or a
     full load of an Unloaded instance);
   - migrate: make before break: the target comes up (a fork from the source, which
     serves meanwhile), and only once it is Active does the source drain (to Cold,
     freeing the device); the router sees the new instance only once it is Active;
   - remove: the instance drains to Cold.
   A move that fails leaves what it touched as the lifecycle left it (an activation
   rolls back, a source is drained only after its target is Active: never half done);
   the rest of that plan is dropped and the next slow tick plans again from what is
   really there (retried at most every slow period).
The devices the plan uses are the steady pool's; the fast loop's elastic budget is what
they leave (server/controller.py).

The snapshot of step 1 is server/steady_snapshot.py's; where models without `devices`
start, at daemon start and when a reload adds them, is server/steady_start.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from janusd.config import JanusConfig
from janusd.core.registry import Registry
from janusd.lifecycle.states import COMING_UP, InstanceState
from janusd.log import log
from janusd.oracle.types import CapacityPredictor
from janusd.policy.placement import plan as placement_plan
from janusd.policy.snapshot import Move, PlacementPlan
from janusd.server.steady_snapshot import placement_snapshot
from janusd.telemetry.telemetry import Telemetry

S = InstanceState


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class SteadyHost(Protocol):
    """What the steady executor needs of the daemon (server/daemon.py implements it)."""

    @property
    def cfg(self) -> JanusConfig: ...

    async def set_state(self, name: str, device: int, target: str, probe: bool = True) -> dict[str, Any]: ...

    async def fork(self, name: str, src: int, dst: int) -> dict[str, Any]: ...


@dataclass
class _Running:
    move: Move
    started: float
    task: asyncio.Task[Any] | None = None


class SteadyExecutor:
    """Plans the steady pool at the slow tick and runs its moves (module doc)."""

    def __init__(self, host: SteadyHost, registry: Registry, telemetry: Telemetry, clock: Callable[[], float],
                 claim: Callable[[str, int], bool], release: Callable[[str, int], None],
                 on_move: Callable[[str, str], None] = lambda kind, outcome: None,
                 extras: dict[str, set[int]] | None = None) -> None:
        """`claim(model, device)` reserves an instance against the controller's other
        operations (False: one is in flight there), `release` gives it back."""
        self.host = host
        self.registry = registry
        self.telemetry = telemetry
        self.clock = clock
        self.claim = claim
        self.release = release
        self.on_move = on_move
        self.extras = extras if extras is not None else {}  # the controller's (model -> extra replicas' devices)
        self.plan: PlacementPlan | None = None
        self.managed_keys: set[str] = set()
        self.planned_at: float | None = None
        self.notes: list[str] = []
        self.last: dict[str, int] = {}  # item key -> device in the last plan
        self.queue: deque[Move] = deque()
        self.running: list[_Running] = []
        self.transfers: Counter[int] = Counter()
        self.recent: deque[dict[str, Any]] = deque(maxlen=50)
        self.failed_plans = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    # ---------------------------------------------------------------- planning
    @property
    def busy(self) -> bool:
        return bool(self.queue or self.running)

    def managed_devices(self) -> set[int]:
        """Devices the last plan gives to models the controller places: the elastic budget
        leaves them out (a pinned model's devices are the operator's, as before)."""
        return {a.device for a in self.plan.assignment if a.key in self.managed_keys} if self.plan else set()

    def plan_devices(self) -> list[int]:
        """Every device holding a steady item in the last plan (pinned ones included)."""
        return [d.device for d in self.plan.devices] if self.plan is not None else []

    def plan_now(self, now: float, pred: CapacityPredictor, elastic: Iterable[str],
                 resting: Iterable[str] = ()) -> PlacementPlan | None:
        """A new plan when the last one is done; its moves are queued (no awaiting)."""
        cfg = self.host.cfg
        if self.busy:
            _log(f"steady placement: {len(self.queue) + len(self.running)} move(s) of the last plan still pending; "
                 "not planning again yet", logging.DEBUG)
            return None
        snap, self.notes = placement_snapshot(cfg, self.registry, self.telemetry, pred, elastic, self.last, now,
                                              resting, self.extras)
        p = placement_plan(snap, cfg.control.placement, consolidate=True)
        self.plan, self.planned_at = p, now
        self.managed_keys = {it.key for it in snap.items if it.pinned_device is None}
        self.last = {a.key: a.device for a in p.assignment}
        for u in p.unplaced:
            self.notes.append(f"{u.key}: unplaced: {u.reason}")
        moves = [mv for mv in p.moves if not self._no_op(mv)]
        self.queue.extend(moves)
        if moves:
            _log(f"steady placement: {len(moves)} move(s), {p.bins_used} device(s), Phi {p.phi:.4f}: "
                 + "; ".join(f"{mv.kind} {mv.model} {mv.src}->{mv.dst} ({mv.reason})" for mv in moves))
        return p

    def _no_op(self, mv: Move) -> bool:
        """A removal of a key whose device another item of the same model keeps (two
        replicas planned onto one device are one instance there): nothing to do."""
        if mv.kind != "remove" or self.plan is None:
            return False
        return any(a.device == mv.src and self._model_of(a.key) == mv.model for a in self.plan.assignment)

    @staticmethod
    def _model_of(key: str) -> str:
        """Item keys are MODEL, MODEL#k (replica k) or MODEL@d (frozen on device d); model
        names hold neither '#' nor '@' (config.Name)."""
        return key.split("#")[0].split("@")[0]

    # --------------------------------------------------------------- execution
    def _devices(self, mv: Move) -> set[int]:
        return {d for d in (mv.src, mv.dst) if d is not None}

    def pump(self) -> None:
        """Start the queued moves that may run now, in plan order: a move waits while an
        earlier unfinished move takes something out of its target device (the plan counted
        on that room), while an earlier move still waiting shares one of its devices (no
        overtaking on a device), while one of its devices has no transfer slot left, or
        while another operation holds one of its instances."""
        limit = self.host.cfg.control.max_transfers_per_device
        freeing: set[int] = {r.move.src for r in self.running if r.move.src is not None}
        held: set[int] = set()  # devices of earlier moves still waiting
        waiting: deque[Move] = deque()
        while self.queue:
            mv = self.queue.popleft()
            devs = self._devices(mv)
            ok = not (mv.dst is not None and mv.dst in freeing) and not (devs & held) \
                and all(self.transfers[d] < limit for d in devs)
            if ok:
                keys = [(mv.model, d) for d in sorted(devs)]
                taken = [k for k in keys if self.claim(*k)]
                if len(taken) < len(keys):  # another operation holds one of its instances
                    for k in taken:
                        self.release(*k)
                    ok = False
            if mv.src is not None:
                freeing.add(mv.src)
            if not ok:
                held |= devs
                waiting.append(mv)
                continue
            for d in devs:
                self.transfers[d] += 1
            run = _Running(mv, self.clock())
            self.running.append(run)
            run.task = asyncio.get_running_loop().create_task(self._execute(run), name=f"steady-{mv.model}")
            self._tasks.add(run.task)
            run.task.add_done_callback(self._tasks.discard)
        self.queue = waiting

    async def _execute(self, run: _Running) -> None:
        mv = run.move
        detail: dict[str, Any] = {}
        outcome = "ok"
        try:
            if mv.kind in ("place", "migrate") and mv.dst is not None:
                detail["up"] = await self._bring_up(mv.model, mv.dst, mv.src)
            if mv.kind in ("migrate", "remove") and mv.src is not None:
                detail["down"] = await self._take_down(mv.model, mv.src)
        except Exception as e:  # a refused or failed step: the rest of the plan is dropped
            outcome = f"{type(e).__name__}: {e}"
            _log(f"steady placement: {mv.kind} {mv.model} {mv.src}->{mv.dst} failed: {e}; planned again at the "
                 "next slow tick", logging.WARNING)
            self.queue.clear()
            self.failed_plans += 1
        finally:
            for d in self._devices(mv):
                self.transfers[d] -= 1
                self.release(mv.model, d)
            self.running = [r for r in self.running if r is not run]
        self.recent.append({"kind": mv.kind, "model": mv.model, "src": mv.src, "dst": mv.dst, "reason": mv.reason,
                            "forced": mv.forced, "seconds": round(self.clock() - run.started, 3),
                            "outcome": outcome, **_summary(detail)})
        self.on_move(mv.kind, "ok" if outcome == "ok" else "failed")
        if self.queue:
            self.pump()

    async def _bring_up(self, model: str, dst: int, src: int | None) -> dict[str, Any]:
        m = self.registry.models.get(model)
        if m is None:
            raise ValueError(f"model {model!r} was removed")
        inst = m.instances.get(dst)
        state = inst.state if inst is not None else S.UNLOADED
        if state is S.ACTIVE:
            return {"path": "already active"}
        if state in COMING_UP or state is S.DRAINING:
            raise ValueError(f"{model} on device {dst} is {state.value}: planned again later")
        peers = sorted((i.device for i in m.instances.values() if i.state is S.ACTIVE and i.device != dst),
                       key=lambda d: (d != src, d))
        if state is S.UNLOADED and peers:
            return await self.host.fork(model, peers[0], dst)  # a new instance: D2D from a live replica
        # Warm / Cold (the lifecycle picks D2D, H2D or a Cold load by estimated time), or a
        # full load of an Unloaded instance when no replica is live
        return await self.host.set_state(model, dst, "active", probe=False)

    async def _take_down(self, model: str, src: int) -> dict[str, Any]:
        m = self.registry.models.get(model)
        inst = m.instances.get(src) if m is not None else None
        if inst is None or inst.state is not S.ACTIVE:
            return {"state": inst.state.value if inst is not None else "none"}
        if self.plan is not None and any(a.device == src and self._model_of(a.key) == model
                                         for a in self.plan.assignment):
            return {"kept": "another replica of the plan stays on this device"}
        return await self.host.set_state(model, src, "cold", probe=False)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -------------------------------------------------------------------- view
    def view(self, now: float) -> dict[str, Any]:
        p = self.plan
        return {
            "planned_at_s_ago": None if self.planned_at is None else round(now - self.planned_at, 3),
            "bins_used": p.bins_used if p else None,
            "phi": round(p.phi, 6) if p else None,
            "migrations": p.migrations if p else None,
            "devices": [{"device": d.device, "load": [round(x, 4) for x in d.load], "phi": round(d.phi, 6),
                         "items": list(d.keys)} for d in (p.devices if p else ())],
            "overloaded": list(p.overloaded) if p else [],
            "moves": [{"kind": mv.kind, "model": mv.model, "src": mv.src, "dst": mv.dst, "forced": mv.forced,
                       "reason": mv.reason} for mv in (p.moves if p else ())],
            "queued": [{"kind": mv.kind, "model": mv.model, "src": mv.src, "dst": mv.dst} for mv in self.queue],
            "running": [{"kind": r.move.kind, "model": r.move.model, "src": r.move.src, "dst": r.move.dst,
                         "for_s": round(now - r.started, 3)} for r in self.running],
            "recent": list(self.recent),
            "notes": list(self.notes),
            "failed_plans": self.failed_plans,
        }


def _summary(detail: dict[str, Any]) -> dict[str, Any]:
    """The path and seconds of each half of a move, for ctl plan."""
    out: dict[str, Any] = {}
    for half in ("up", "down"):
        d = detail.get(half)
        if isinstance(d, dict):
            out[half] = {k: d[k] for k in ("path", "state", "total_s", "source_device", "kept") if k in d}
    return out
