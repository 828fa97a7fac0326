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

At start (`first_placement`, with control.place_at_start), before any model loads, the
oracle reads every model's checkpoint for its prior (bounded by
server.worker_ready_timeout_s) and policy/start_placement.py packs the models without
`devices` the way the first slow tick would (at zero load); those it cannot size or
place are spread round robin over the pool, as policy/pinned.py does without it.
Models a SIGHUP reload adds (`added_placement`) are placed the same way around what
serves then: every model with a serving instance counts where it serves, at its load now,
and is never moved by this (the next slow tick may); only the new ones are packed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from janusd.config import JanusConfig, ModelConfig
from janusd.core.registry import Model, Registry
from janusd.lifecycle.states import COMING_UP, InstanceState
from janusd.log import log
from janusd.oracle.types import CapacityPredictor, LoadFeatures
from janusd.policy.demand import SteadyModel, steady_items
from janusd.policy.pinned import place
from janusd.policy.placement import plan as placement_plan
from janusd.policy.snapshot import Assignment, Move, PlacementPlan, PlacementSnapshot, SteadyItem
from janusd.policy.start_placement import NO_LOAD, start_placement
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


def placed_by_controller(cfg: JanusConfig, m: Model) -> bool:
    """A model the steady placement moves: managed mode, no `devices`, not P/D."""
    return cfg.control.managed and not m.cfg.devices and not m.cfg.prefill_devices


def pool_devices(cfg: JanusConfig) -> tuple[int, ...]:
    """The devices the controller may place on: `control.pool_devices`, else all."""
    n = cfg.devices.count
    return tuple(sorted({d for d in cfg.control.pool_devices if d < n})) if cfg.control.pool_devices \
        else tuple(range(n))


async def _describe(cfg: JanusConfig, models: Sequence[ModelConfig],
                    describe: Callable[[Sequence[ModelConfig]], list[asyncio.Task[Any]]]) -> None:
    """Start the oracle's checkpoint reads of `models` and wait for them, bounded by
    server.worker_ready_timeout_s (not cancelled on timeout: the oracle keeps them)."""
    tasks = describe(models)
    if tasks:
        t0 = asyncio.get_running_loop().time()
        _, late = await asyncio.wait(tasks, timeout=cfg.server.worker_ready_timeout_s)
        if late:
            _log(f"start placement: {len(late)} checkpoint read(s) not done after "
                 f"{cfg.server.worker_ready_timeout_s:g} s; those models start round robin", logging.WARNING)
        _log(f"start placement: the oracle read {len(tasks)} checkpoint(s) in "
             f"{asyncio.get_running_loop().time() - t0:.2f} s", logging.DEBUG)


def _pack(cfg: JanusConfig, managed: Sequence[ModelConfig], pinned: list[SteadyModel], elastic_devs: list[int],
          pred: CapacityPredictor, out: dict[str, list[int]], spread: bool = True) -> None:
    """`out[m]` for each managed model: packed by policy/start_placement.py around the
    pinned ones; those it cannot size or place round robin over the pool (`spread`), else
    left as `out` has them (policy/pinned.py's)."""
    pool = pool_devices(cfg)
    try:
        res = start_placement([m.name for m in managed], pinned, pool, pred, cfg.control.demand,
                              cfg.control.placement, elastic_devs)
    except ValueError as e:  # a policy's refusal of odd input: logged, round robin as before
        _log(f"start placement: {e}; models without devices start round robin", logging.ERROR)
        res = None
    k = 0
    for m in managed:
        if res is not None and m.name in res.placed:
            out[m.name] = list(res.placed[m.name])
        elif pool and spread:
            out[m.name] = [pool[k % len(pool)]]
            k += 1
    if res is not None:
        p = res.plan
        _log("start placement: " + ", ".join(f"{n} -> {out[n]}" for n in sorted(m.name for m in managed))
             + (f" ({p.bins_used} device(s), Phi {p.phi:.4f})" if p is not None else "")
             + "".join(f"; {n}" for n in res.notes))


def _configured(m: ModelConfig, pinned: list[SteadyModel], elastic_devs: list[int]) -> None:
    """A pinned model's start devices: steady items there, or elastic devices."""
    up = tuple(d for d in sorted(set(m.devices)) if m.start_state(d) == "active")
    if m.pool == "elastic":
        elastic_devs += up
    elif up:
        pinned.append(SteadyModel(model=m.name, load=NO_LOAD, devices=up))


async def first_placement(cfg: JanusConfig, describe: Callable[[Sequence[ModelConfig]], list[asyncio.Task[Any]]],
                          pred: CapacityPredictor) -> dict[str, list[int]]:
    """The devices every configured model starts on (module doc, "At start"): pinned
    models as configured; the controller's own packed when the oracle sizes them in time,
    else round robin over the pool. `describe(models)` starts the oracle's checkpoint
    reads (OracleRefit.describe_now) and returns their tasks."""
    out = place(list(cfg.models), cfg.devices.count)
    managed = [m for m in cfg.models if not m.devices and not m.prefill_devices]
    if not (cfg.control.managed and cfg.control.place_at_start and managed):
        return out
    await _describe(cfg, cfg.models, describe)
    pinned: list[SteadyModel] = []
    elastic_devs: list[int] = []
    for m in cfg.models:
        if m.devices and not m.prefill_devices:
            _configured(m, pinned, elastic_devs)
    _pack(cfg, managed, pinned, elastic_devs, pred, out)
    return out


async def added_placement(cfg: JanusConfig, added: Sequence[ModelConfig], registry: Registry, telemetry: Telemetry,
                          describe: Callable[[Sequence[ModelConfig]], list[asyncio.Task[Any]]],
                          pred: CapacityPredictor, elastic: Iterable[str], now: float) -> dict[str, list[int]]:
    """The devices of models a SIGHUP reload adds (`cfg`: the new config; module doc):
    pinned ones as configured, the controller's own packed around what serves now (each
    serving model at its current devices and load, elastic ones' devices taken last),
    else round robin as policy/pinned.py spreads them."""
    out = place(list(cfg.models), cfg.devices.count)
    managed = [m for m in added if not m.devices and not m.prefill_devices]
    if not (cfg.control.managed and cfg.control.place_at_start and managed):
        return {m.name: out[m.name] for m in added}
    await _describe(cfg, managed, describe)
    pinned: list[SteadyModel] = []
    elastic_devs: list[int] = []
    hot = set(elastic)
    for m in registry.models.values():
        devs = tuple(_serving_devices(m))
        if not devs:
            continue
        if m.name in hot or m.cfg.pool == "elastic" or m.cfg.prefill_devices:
            elastic_devs += devs
        else:
            pinned.append(SteadyModel(model=m.name, load=LoadFeatures.from_window(telemetry.model(m.name, now)),
                                      devices=devs))
    for a in added:
        if a.devices and not a.prefill_devices:
            _configured(a, pinned, elastic_devs)
    _pack(cfg, managed, pinned, elastic_devs, pred, out, spread=False)
    return {m.name: out[m.name] for m in added}


def _serving_devices(m: Model) -> list[int]:
    return sorted(d for d, i in m.instances.items() if i.state is S.ACTIVE or i.state in COMING_UP)


def placement_snapshot(cfg: JanusConfig, registry: Registry, telemetry: Telemetry, pred: CapacityPredictor,
                       elastic: Iterable[str], last: dict[str, int], now: float,
                       resting: Iterable[str] = (), extras: dict[str, set[int]] | None = None,
                       ) -> tuple[PlacementSnapshot, list[str]]:
    """The steady pool now (module doc, step 1) and the reasons for what was left out.
    `elastic`: models the classifier has in the elastic pool; `last`: item key -> device
    of the last plan; `resting`: models going Warm/Cold now (keep-alive): not placed;
    `extras`: model -> devices of its elastic replicas (not the steady pool's: left out
    of its current devices, counted as elastic devices)."""
    extras = extras or {}
    elastic, resting = set(elastic), set(resting)
    notes: list[str] = []
    models: list[SteadyModel] = []
    serving: dict[str, list[int]] = {}
    frozen: list[SteadyItem] = []
    elastic_devs: set[int] = set()
    for m in sorted(registry.models.values(), key=lambda m: m.name):
        mine = extras.get(m.name, set())
        elastic_devs.update(d for d in _serving_devices(m) if d in mine)
        devs = [d for d in _serving_devices(m) if d not in mine]
        if not devs or m.cfg.prefill_devices or m.name in resting:
            continue
        if not placed_by_controller(cfg, m):
            if m.name in elastic:
                elastic_devs.update(devs)
                continue
        load = LoadFeatures.from_window(telemetry.model(m.name, now))
        try:
            pred.capacity(m.name, load)
        except KeyError as e:  # no prior yet (its spec is being read): it stays where it serves
            notes.append(f"{m.name}: {e}; kept where it is")
            frozen += [SteadyItem(key=f"{m.name}@{d}", model=m.name, vector=(0.0, 0.0, 0.0), pinned_device=d)
                       for d in devs]
            continue
        if placed_by_controller(cfg, m):
            models.append(SteadyModel(model=m.name, load=load))
            serving[m.name] = devs
        else:
            models.append(SteadyModel(model=m.name, load=load, devices=tuple(devs)))
    items = list(frozen)
    current: list[Assignment] = []
    for d in steady_items(models, pred, cfg.control.demand):
        items += d.items
        devs = list(serving.get(d.model, ()))
        if not d.items:  # fits no device even split: left where it serves (noted), never drained for it
            notes.append(f"{d.model}: {d.reason}; kept where it is")
            continue
        if not devs:
            continue
        keys = [it.key for it in d.items if it.pinned_device is None]
        # a key keeps the device the last plan gave it, where the model still serves
        mine: dict[str, int] = {}
        for k in keys:
            dv = last.get(k)
            if dv is not None and dv in devs:
                mine[k] = dv
                devs.remove(dv)
        for k in keys:
            if k not in mine and devs:
                mine[k] = devs.pop(0)
        current += [Assignment(key=k, device=dv) for k, dv in mine.items()]
        # serving beyond the items (fewer replicas wanted now): leavers, removed by the plan
        current += [Assignment(key=f"{d.model}#surplus{dv}", device=dv) for dv in devs]
    pool = pool_devices(cfg)
    snap = PlacementSnapshot(pool=pool, items=tuple(sorted(items, key=lambda i: i.key)),
                             current=tuple(sorted(current, key=lambda a: a.key)),
                             elastic_devices=tuple(sorted(elastic_devs & set(pool))))
    return snap, notes


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
