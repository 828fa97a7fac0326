"""The steady pool planned and paced (PAPER.md §4, §8): placement plans (policy/placement.py)
turned into lifecycle Ops, released to the shell in an order the devices can take.

A model the controller places has no `devices` (a model with `devices` stays pinned:
its instances count where they serve and never move). At each slow tick, when no move
of the last plan is still queued or running:
1. snapshot (control/steady_snapshot.py): each model that serves is one or more steady
   items sized by the oracle; a model with nothing serving (keep-alive sent it Warm or
   Cold) holds no device and is not placed: its next request wakes it where it rests;
2. plan: placement.plan with consolidation and the migration budget of the period;
3. release (`pump`), in the plan's order, every move as soon as no earlier unfinished
   move of the plan shares a device with it and its devices have a transfer slot
   (`control.max_transfers_per_device`; a fork occupies its source too), as one Op:
   - place: the model comes up on the target: a D2D fork from a live replica when one
     is Active (the source first), else the lifecycle's own path (H2D from a Warm copy,
     a Cold load, or a full load of an Unloaded instance);
   - migrate: make before break: the target comes up (a fork from the source, which
     serves meanwhile), and only once it is Active does the source drain to Cold (the
     Op's `then`);
   - remove: the instance drains to Cold.
   A move that fails leaves what it touched as the lifecycle left it; the rest of that
   plan is dropped and the next slow tick plans again from what is really there.
The devices the plan uses are the steady pool's; the fast tick's elastic budget is what
they leave (control/room.py)."""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from janusd.control.ops import Activate, Op, Rest, fork_source
from janusd.control.snapshot import ControlSnapshot
from janusd.control.steady_snapshot import placement_snapshot
from janusd.lifecycle.states import COMING_UP, InstanceState
from janusd.policy.placement import plan as placement_plan
from janusd.policy.policy_config import DemandConfig, PlacementConfig
from janusd.policy.snapshot import Move, PlacementPlan

S = InstanceState


def model_of(key: str) -> str:
    """Item keys are MODEL, MODEL#k (replica k) or MODEL@d (frozen on device d); model
    names hold neither '#' nor '@' (config.Name)."""
    return key.split("#")[0].split("@")[0]


@dataclass
class _Running:
    move: Move
    op: Op
    started: float


class SteadyPlanner:
    """Plans the steady pool at the slow tick and paces its moves (module doc)."""

    def __init__(self, demand: DemandConfig, placement: PlacementConfig, max_transfers: int,
                 claim: Callable[[Op, float], bool], release: Callable[[str, int], None],
                 log: Callable[[str], None] = lambda msg: None) -> None:
        """`claim(op, now)` reserves an op's instances against the room's other
        operations (False: one is in flight there), `release(model, device)` gives one back."""
        self.demand = demand
        self.placement = placement
        self.max_transfers = max_transfers
        self.claim = claim
        self.release = release
        self.log = log
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

    # ---------------------------------------------------------------- planning
    @property
    def busy(self) -> bool:
        return bool(self.queue or self.running)

    def managed_devices(self) -> set[int]:
        """Devices the last plan gives to models the controller places: the elastic budget
        leaves them out (a pinned model's devices are the operator's)."""
        return {a.device for a in self.plan.assignment if a.key in self.managed_keys} if self.plan else set()

    def plan_devices(self) -> list[int]:
        """Every device holding a steady item in the last plan (pinned ones included)."""
        return [d.device for d in self.plan.devices] if self.plan is not None else []

    def plan_now(self, snap: ControlSnapshot, now: float, elastic: Iterable[str], resting: Iterable[str] = (),
                 extras: dict[str, set[int]] | None = None, consolidate: bool = True) -> PlacementPlan | None:
        """A new plan when the last one is done; its moves are queued. Without
        `consolidate` only the forced moves (an overfilled device, a model new to the
        pool) are planned: the room's re-check between slow ticks. A model no device
        fits is never removed from where it serves (the plan would leave it nowhere and
        its requests waiting for a wake that a removal in progress blocks)."""
        if self.busy:
            return None
        ps, self.notes = placement_snapshot(snap, self.demand, elastic, self.last, resting, extras)
        p = placement_plan(ps, self.placement, consolidate=consolidate)
        self.plan, self.planned_at = p, now
        self.managed_keys = {it.key for it in ps.items if it.pinned_device is None}
        self.last = {a.key: a.device for a in p.assignment}
        self.notes += [f"{u.key}: unplaced: {u.reason}" for u in p.unplaced]
        unplaced = {u.key for u in p.unplaced}
        moves = [mv for mv in p.moves
                 if mv.kind != "remove" or not (self._kept(mv.model, mv.src) or mv.key in unplaced)]
        self.queue.extend(moves)
        if moves:
            self.log(f"steady placement: {len(moves)} move(s), {p.bins_used} device(s), Phi {p.phi:.4f}: "
                     + "; ".join(f"{mv.kind} {mv.model} {mv.src}->{mv.dst} ({mv.reason})" for mv in moves))
        return p

    def _kept(self, model: str, device: int | None) -> bool:
        """Another item of the same model keeps `device` in the plan (two replicas planned
        onto one device are one instance there): its instance there stays."""
        return self.plan is not None and any(a.device == device and model_of(a.key) == model
                                             for a in self.plan.assignment)

    # ----------------------------------------------------------------- pacing
    @staticmethod
    def _devices(mv: Move) -> set[int]:
        return {d for d in (mv.src, mv.dst) if d is not None}

    def pump(self, snap: ControlSnapshot, now: float) -> list[Op]:
        """The queued moves that may start now, in plan order, as Ops: a move waits while
        an earlier unfinished move takes something out of its target device (the plan
        counted on that room), while an earlier move still waiting shares one of its
        devices (no overtaking on a device), while one of its devices has no transfer slot
        left, or while another operation holds one of its instances."""
        freeing: set[int] = {r.move.src for r in self.running if r.move.src is not None}
        held: set[int] = set()  # devices of earlier moves still waiting
        waiting: deque[Move] = deque()
        out: list[Op] = []
        while self.queue:
            mv = self.queue.popleft()
            devs = self._devices(mv)
            ok = not (mv.dst is not None and mv.dst in freeing) and not (devs & held) \
                and all(self.transfers[d] < self.max_transfers for d in devs)
            op = self._op(snap, mv) if ok else None
            if op is not None and not self.claim(op, now):
                ok = False
            if mv.src is not None:
                freeing.add(mv.src)
            if not ok:
                held |= devs
                waiting.append(mv)
                continue
            if op is None:  # nothing to do (already where the plan wants it) or refused
                continue
            for d in devs:
                self.transfers[d] += 1
            self.running.append(_Running(mv, op, now))
            out.append(op)
        self.queue = waiting
        return out

    def _op(self, snap: ControlSnapshot, mv: Move) -> Op | None:
        """The move as one Op (module doc, step 3), or None when there is nothing to do;
        a move onto an instance coming up or draining fails the rest of the plan."""
        m = snap.models.get(mv.model)
        down = None
        why = self._why(mv)
        if mv.kind in ("migrate", "remove") and mv.src is not None and not self._kept(mv.model, mv.src):
            down = Rest(model=mv.model, device=mv.src, reason=why, target="cold", steady=True)
        if mv.kind == "remove" or mv.dst is None:
            return down
        inst = m.instances.get(mv.dst) if m is not None else None
        state = inst.state if inst is not None else S.UNLOADED
        if m is None or state in COMING_UP or state is S.DRAINING:
            why = "it was removed" if m is None else f"it is {state.value} there"
            self._failed(mv, f"cannot bring {mv.model} up on device {mv.dst}: {why}; planned again later")
            return None
        if state is S.ACTIVE:
            return down
        src = fork_source(m.instances, mv.dst, prefer=mv.src) if state is S.UNLOADED else None
        return Activate(model=mv.model, device=mv.dst, reason=why, source=src, then=down, steady=True)

    def _why(self, mv: Move) -> str:
        """A move's reason with the figures behind it: what it does, the planner's own
        reason, the summed Phi it lowers, the devices it frees, the target device's Phi
        in the plan, and the plan it belongs to (`janus ctl events`, the log)."""
        what = {"place": f"place on device {mv.dst}", "migrate": f"move device {mv.src} -> {mv.dst}",
                "remove": f"remove from device {mv.src}"}[mv.kind]
        figures = [f"Phi gain {mv.phi_gain:+.3g}"] if abs(mv.phi_gain) >= 1e-4 else []
        if mv.bins_freed:
            figures.append(f"{mv.bins_freed} device(s) freed")
        p = self.plan
        if p is not None:
            dst = next((d for d in p.devices if d.device == mv.dst), None)
            if dst is not None:
                figures.append(f"device {dst.device} Phi {dst.phi:.3g} after")
            figures.append(f"plan: {p.bins_used} device(s), Phi {p.phi:.3g}")
        return f"steady placement: {what}: {mv.reason}" + (f" ({'; '.join(figures)})" if figures else "")

    def _failed(self, mv: Move, why: str) -> None:
        self._end(mv, 0.0, why)

    def _end(self, mv: Move, seconds: float, outcome: str, detail: dict[str, Any] | None = None) -> None:
        """A move ended (recorded for `ctl plan`); one that failed drops the rest of the
        plan, which the next slow tick makes again from what is really there."""
        if outcome != "ok":
            self.log(f"steady placement: {mv.kind} {mv.model} {mv.src}->{mv.dst} failed: {outcome}; planned again "
                     "at the next slow tick")
            self.queue.clear()
            self.failed_plans += 1
        self.recent.append({"kind": mv.kind, "model": mv.model, "src": mv.src, "dst": mv.dst, "reason": mv.reason,
                            "forced": mv.forced, "seconds": round(seconds, 3), "outcome": outcome, **(detail or {})})

    def done(self, op: Op, outcome: str, now: float, detail: dict[str, Any] | None = None) -> str | None:
        """A released move's Op ended (`outcome`: "ok" or the error); returns the move's
        kind, None when the op is not one of this planner's."""
        run = next((r for r in self.running if r.op is op), None)
        if run is None:
            return None
        self.running = [r for r in self.running if r is not run]
        mv = run.move
        for d in self._devices(mv):
            self.transfers[d] -= 1
            self.release(mv.model, d)
        self._end(mv, now - run.started, outcome, detail)
        return mv.kind

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
