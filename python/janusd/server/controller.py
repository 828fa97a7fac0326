"""The controller: the daemon's shell around the policies (PAPER.md §2, §4, §5, §8).

With `control.managed`, two loops run in the daemon:
- fast (control.fast_period_s, 0.5 s): the classifier (policy/classify.py, with
  hysteresis) puts each model with `pool = "auto"` in the elastic pool while it is hot or
  bursty (peak over short windows / mean, from arrivals bucketed per second over the
  telemetry window); `pool = "steady"` / `"elastic"` pin it. Every elastic model that has
  traffic gets m* from the oracle (policy/demand.py, through oracle/types.py's
  ElasticityPredictor: a fitted GP or the roofline prior), the counts are debounced and
  compressed to the elastic budget (policy/scaling.py), and each count is met with the
  instances the model already has on its `devices`: a Warm (else Cold) one is activated
  (lifecycle_ops picks D2D fork, H2D or a checkpoint read by estimated time), a surplus
  Active one goes Warm after draining. A P/D model (`prefill_devices`) that is elastic
  gets its count split into prefill and decode instances (scaling.py, by prefill's part
  of its device time: demand.prefill_share over the per-token costs the core measured)
  and policy/roles.py turns the split into activations in a role (a resting instance
  comes up as the role that is short), reassignments (drain to Warm, come back in the
  new role) and drains, never leaving the model unable to serve while an activation is
  on its way;
- slow (control.slow_period_s, 30 s): keep-alive (policy/keepalive.py): a model without
  a request for `warm_after_s` goes Warm on every device, after `cold_after_s` Cold; its
  next request is held and wakes it (lifecycle_ops.wake), never refused; then the steady
  placement (server/steady.py): models without `devices` are packed on the pool by
  policy/placement.py and moved (fork or load the target, then drain the source),
  within the migration budget and a bound on transfers per device. The elastic budget
  is the elastic models' devices less those the steady placement took.
Each loop computes its plan from a snapshot (plan_fast / plan_slow: no awaiting, so a
test drives them with a fake clock) and then starts the operations; an operation in
flight is never started twice, a failed one is logged, counted and planned again next
period, never left half done (lifecycle_ops rolls an instance back to where it was). A
loop that overruns its period logs it and skips the missed ticks, never stacks them.

A model the steady placement places (no `devices`) that is in the elastic pool keeps its
steady instance(s); m* beyond them are extra replicas on the pool's free devices (no
steady item, no extra of another model, nothing serving, no pinned model's device):
forked from a live instance (or restored where it rests Warm/Cold), drained to Cold when
m* falls, never moved by the placement (`self.extras`). A model with `devices` is scaled
among them as before. `janus ctl plan` shows what the loops decided and why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from janusd.config import JanusConfig
from janusd.core.registry import Instance, Model
from janusd.core.serving import ServingCore
from janusd.lifecycle.states import COMING_UP, RESTORABLE, InstanceState
from janusd.log import log
from janusd.oracle.decode_estimate import DecodeStepEstimator
from janusd.oracle.prefill_estimate import PrefillEstimator
from janusd.oracle.types import CapacityPredictor, ElasticityPredictor, LoadFeatures
from janusd.policy.classify import traffic_from_counts
from janusd.policy.classify import classify as classify_apps
from janusd.policy.demand import elastic_demand, prefill_share
from janusd.policy.keepalive import residency
from janusd.policy.roles import plan_roles
from janusd.policy.scaling import scale
from janusd.policy.snapshot import (AppCount, AppPool, AppTraffic, ElasticApp, ModelActivity, RoleInstance, RolePlan,
                                    ScalingPlan, ScalingState)
from janusd.server.steady import SteadyExecutor, placed_by_controller

BUCKET_S = 1.0  # arrivals are bucketed per second for the classifier
SHORT_BUCKETS = 5  # its short window: 5 s (a burst's 5-10x jump within seconds)

S = InstanceState


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class Predictor(CapacityPredictor, ElasticityPredictor, Protocol):
    """The oracle as the controller asks it: capacity vectors (steady) and m* (elastic)."""


class ControllerHost(Protocol):
    """What the controller needs of the daemon (server/daemon.py implements it)."""

    core: ServingCore

    @property
    def cfg(self) -> JanusConfig: ...

    def predictor(self) -> Predictor: ...

    async def set_state(self, name: str, device: int, target: str, probe: bool = True,
                        role: str | None = None) -> dict[str, Any]: ...

    async def fork(self, name: str, src: int, dst: int) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Op:
    """One lifecycle operation a plan asks for, with the reason shown by `ctl plan`."""

    model: str
    device: int
    target: str  # "active" | "warm" | "cold"
    reason: str
    role: str | None = None  # P/D: the engine role an activation comes up in (None: the instance's own)
    reassign: bool = False  # P/D: an Active instance drains to Warm first, then comes up as `role`


@dataclass
class _Done:
    op: Op
    started: float
    seconds: float
    outcome: str  # "ok" or the error
    phases: dict[str, float] = field(default_factory=dict)


def _serving(i: Instance) -> bool:
    """Active, or on its way there: counts toward a model's instances."""
    return i.state is S.ACTIVE or i.state in COMING_UP


def _role_state(i: Instance) -> str:
    """An instance's state in policy/roles.py's words (RoleState)."""
    if i.state in COMING_UP:
        return "coming_up"
    if i.state is S.UNLOADED:
        return "failed" if i.error else "unloaded"
    return i.state.value


class Controller:
    def __init__(self, host: ControllerHost, clock: Callable[[], float] = time.monotonic,
                 on_op: Callable[[str, str], None] = lambda op, outcome: None,
                 on_elastic: Callable[[str, int, int, tuple[int, int] | None], None] =
                 lambda model, demand, count, split: None,
                 on_move: Callable[[str, str], None] = lambda kind, outcome: None,
                 on_figure: Callable[[str, float], None] = lambda figure, value: None) -> None:
        """Metrics' hooks: `on_op(target, outcome)` once per finished operation,
        `on_elastic(model, m*, count given, (prefill, decode) of a P/D model else None)`
        per elastic model at each fast tick,
        `on_move(kind, outcome)` once per finished steady placement move, `on_figure(name,
        value)` for the plans' figures (steady_bins_used, steady_phi, steady_migrations,
        steady_pending_moves, elastic_budget, elastic_asked, elastic_given)."""
        self.host = host
        self.clock = clock
        self.on_op = on_op
        self.on_elastic = on_elastic
        self.on_figure = on_figure
        self.scaling_state = ScalingState()
        self.pools: tuple[AppPool, ...] = ()  # the classifier's state between ticks
        self.last_pools: list[dict[str, Any]] = []
        self._arrivals: dict[str, deque[tuple[float, int]]] = {}  # model -> (t, arrivals so far)
        self.last_scaling: ScalingPlan | None = None
        self.demands: dict[str, tuple[int, str]] = {}  # model -> (m*, reason) at the last fast tick
        self.roles: dict[str, RolePlan] = {}  # P/D model -> its role plan at the last fast tick
        self.residency: dict[str, tuple[str, float]] = {}  # model -> (residency, since)
        self.last_keepalive: list[dict[str, Any]] = []
        self.in_flight: dict[tuple[str, int], tuple[Op, float]] = {}
        self.recent: deque[_Done] = deque(maxlen=50)
        self.overruns = {"fast": 0, "slow": 0}
        self._tasks: set[asyncio.Task[Any]] = set()
        # model -> devices of its extra (elastic) replicas, for models the steady placement places
        self.extras: dict[str, set[int]] = {}
        self.steady = SteadyExecutor(host, host.core.registry, host.core.telemetry, clock, self._claim,
                                     self._release, on_move, extras=self.extras)

    def _claim(self, model: str, device: int) -> bool:
        """Reserve an instance for a steady move (False: an operation is in flight there)."""
        if (model, device) in self.in_flight:
            return False
        self.in_flight[(model, device)] = (Op(model, device, "steady", "steady placement move"), self.clock())
        return True

    def _release(self, model: str, device: int) -> None:
        self.in_flight.pop((model, device), None)

    # ------------------------------------------------------------------ plans
    def _traffic(self, m: Model, now: float) -> AppTraffic:
        """Arrivals per BUCKET_S over the telemetry window, from samples of the model's
        arrival counter taken at each fast tick (a bucket edge reads the latest sample
        at or before it)."""
        window = self.host.cfg.control.window_s
        total = self.host.core.telemetry.model(m.name, now).arrivals_total
        hist = self._arrivals.setdefault(m.name, deque())
        hist.append((now, total))
        while len(hist) > 2 and hist[1][0] <= now - window:
            hist.popleft()
        n = max(1, int(window // BUCKET_S))
        edges = [now - (n - k) * BUCKET_S for k in range(n + 1)]
        at: list[int] = []
        j = 0
        seen = list(hist)
        for e in edges:
            while j + 1 < len(seen) and seen[j + 1][0] <= e:
                j += 1
            at.append(seen[j][1] if seen[j][0] <= e else seen[0][1])
        counts = [max(0, b - a) for a, b in zip(at, at[1:])]
        pin = None if m.cfg.pool == "auto" else m.cfg.pool
        return traffic_from_counts(m.name, counts, BUCKET_S, SHORT_BUCKETS, pin=pin)  # type: ignore[arg-type]

    def _elastic(self, now: float) -> list[Model]:
        """The models in the elastic pool now (classified with hysteresis, pins obeyed)."""
        models = [m for m in self.host.core.registry.models.values() if m.instances]
        if not models:
            return []
        c = classify_apps([self._traffic(m, now) for m in models], self.pools, now, self.host.cfg.control.classify)
        self.pools = c.state
        self.last_pools = [{"model": d.app, "pool": d.pool, "changed": d.changed, "reason": d.reason}
                           for d in c.decisions]
        for d in c.decisions:
            if d.changed:
                _log(f"controller: {d.app} -> {d.pool} pool ({d.reason})")
        elastic = {d.app for d in c.decisions if d.pool == "elastic"}
        return [m for m in models if m.name in elastic]

    def plan_fast(self, now: float) -> list[Op]:
        """Elastic scaling: m* per elastic model with traffic, debounced and compressed to
        the budget (the devices the elastic models may use), then met with their own
        Warm/Cold/Active instances. A model without traffic in the telemetry window is
        left to keep-alive (a request wakes it)."""
        cfg = self.host.cfg.control
        tel = self.host.core.telemetry
        pred = self.host.predictor()
        apps: list[ElasticApp] = []
        models: dict[str, Model] = {}
        devices: set[int] = set()
        self.demands = {}
        self._prune_extras()
        free = self._free_elastic_devices()
        for m in self._elastic(now):
            w = tel.model(m.name, now)
            if w.request_rate <= 0.0 and w.in_flight == 0:
                continue
            try:
                want, why = elastic_demand(m.name, LoadFeatures.from_window(w), pred, cfg.demand)
            except KeyError as e:  # the oracle has no prior for it yet (its spec is being read)
                _log(f"controller: {m.name}: {e}; keeping its instances as they are", logging.DEBUG)
                continue
            models[m.name] = m
            if placed_by_controller(self.host.cfg, m):
                # its steady instance(s) stay the steady pool's; m* beyond them are extra
                # replicas on the devices the steady pool leaves
                extras = self.extras.get(m.name, set())
                base = [d for d, i in m.instances.items() if _serving(i) and d not in extras]
                if not base:  # resting (keep-alive): the waking request brings it back first
                    continue
                mine = extras | set(free)
                want = max(0, min(want - len(base), len(mine)))
                self.demands[m.name] = (want, f"{why}; {len(base)} steady instance(s) besides")
                apps.append(ElasticApp(app=m.name, demand=want, current=len(extras)))
                devices.update(mine)
                continue
            usable = sum(1 for i in m.instances.values() if _serving(i) or i.state in RESTORABLE)
            want = max(1, min(want, usable))
            self.demands[m.name] = (want, why)
            share = self._prefill_share(m, LoadFeatures.from_window(w)) if m.pd else 0.5
            apps.append(ElasticApp(app=m.name, demand=want, prefill_share=share,
                                   current=sum(1 for i in m.instances.values() if _serving(i))))
            devices.update(m.instances)
        if not apps:
            return []
        # the steady pool has priority (PAPER.md §2): devices it took leave the elastic budget
        plan = scale(apps, len(devices - self.steady.managed_devices()), self.scaling_state, cfg.scaling)
        self.scaling_state, self.last_scaling = plan.state, plan
        for k, v in (("budget", plan.budget), ("asked", plan.asked), ("given", plan.given)):
            self.on_figure(f"elastic_{k}", v)
        ops: list[Op] = []
        for a in plan.apps:
            self.on_elastic(a.app, a.demand, a.count, (a.prefill, a.decode) if models[a.app].pd else None)
            why = f"m*={a.demand} (debounced {a.debounced}, given {a.count}): {a.reason}"
            if placed_by_controller(self.host.cfg, models[a.app]):
                ops += self._meet_extras(models[a.app], a.count, free, f"extra replicas {why}")
            elif models[a.app].pd:
                ops += self._meet_roles(models[a.app], a, why)
            else:
                ops += self._meet(models[a.app], max(1, a.count), why)
        return ops

    # -- P/D: an elastic app's prefill / decode split ------------------------------
    def _prefill_share(self, m: Model, load: LoadFeatures) -> float:
        """Prefill's part of the model's device time (demand.prefill_share) from the
        per-token costs the core measures: seconds per prompt token of the model's
        prefill fits at its mean prompt length (mean over its devices with samples; the
        estimator's prior without any), and seconds of device time per output token of
        its devices' decode fits at the sequences decoding there now (step time / n)."""
        core = self.host.core
        n_in = max(1.0, load.input_len_mean)
        fits = [e for (name, _), e in core.dispatch.estimators.items() if name == m.name and e.n]
        p = sum(e.estimate(int(n_in)) for e in fits) / len(fits) if fits else PrefillEstimator().estimate(int(n_in))
        costs = []
        for d in m.instances:
            fit = core.guard.fit.get(d)
            if fit is not None and fit.n:
                n = max(1, core.guard.decoding.get(d, 0))
                costs.append(fit.step_s(n) / n)
        dec = sum(costs) / len(costs) if costs else DecodeStepEstimator().step_s(1)
        return prefill_share(load, p / n_in, dec)

    def _meet_roles(self, m: Model, count: AppCount, reason: str) -> list[Op]:
        """Operations that bring a P/D model's instances to `count`'s prefill / decode
        split (policy/roles.py; at least one instance, run mixed). An instance with an
        operation in flight counts where it is going (coming up in the op's role, or
        draining) and is not touched."""
        if count.count < 1:
            count = msgspec.structs.replace(count, count=1, prefill=0, decode=1)
        on = self.host.core.requests.on_device
        insts = []
        for d, i in sorted(m.instances.items()):
            flight = self.in_flight.get((m.name, d))
            role, state = i.role, _role_state(i)
            if flight is not None:
                op = flight[0]
                role, state = (op.role or i.role, "coming_up") if op.target == "active" else (i.role, "draining")
            load = sum(1 for r in on(d) if r.model == m.name)  # its own requests there: the drain's length
            insts.append(RoleInstance(device=d, role=role, state=state, load=load,  # type: ignore[arg-type]
                                      busy=flight is not None))
        plan = plan_roles(count, insts)
        self.roles[m.name] = plan
        ops: list[Op] = []
        for o in plan.ops:
            why = f"{o.reason}: {reason}"
            if o.kind == "activate":
                ops.append(Op(m.name, o.device, "active", f"scale out: {why}", role=o.role))
            elif o.kind == "reassign":
                ops.append(Op(m.name, o.device, "active", f"reassign: {why}", role=o.role, reassign=True))
            elif o.kind == "deactivate":
                ops.append(Op(m.name, o.device, "warm", f"scale in: {why}"))
        return ops

    # -- elastic replicas of models the steady placement places ----------------------
    def _prune_extras(self) -> None:
        """An extra replica that no longer serves (drained, failed, keep-alive) is no more."""
        reg = self.host.core.registry.models
        for name in list(self.extras):
            m = reg.get(name)
            keep = {d for d in self.extras[name] if m is not None and d in m.instances
                    and (_serving(m.instances[d]) or (name, d) in self.in_flight)}
            if keep:
                self.extras[name] = keep
            else:
                del self.extras[name]

    def _free_elastic_devices(self) -> list[int]:
        """Pool devices with no steady item and no extra replica: where extra replicas may
        go (a pinned model's devices are the operator's and stay out)."""
        from janusd.server.steady import pool_devices

        taken = set(self.steady.plan_devices()) | {d for ds in self.extras.values() for d in ds}
        for m in self.host.core.registry.models.values():
            taken.update(m.cfg.devices)
            taken.update(d for d, i in m.instances.items() if _serving(i))  # whoever serves there
        return [d for d in pool_devices(self.host.cfg) if d not in taken]

    def _meet_extras(self, m: Model, count: int, free: list[int], reason: str) -> list[Op]:
        """Bring a placed model to `count` extra replicas: new ones on free devices (one
        where it rests Warm or Cold first, then the lowest id; taken from `free`), surplus
        ones drained to Cold (the least busy first)."""
        extras = self.extras.get(m.name, set())
        pending = {d: op.target for (name, d), (op, _) in self.in_flight.items() if name == m.name}
        have = sum(1 for d in extras if pending.get(d, "active") == "active")
        ops: list[Op] = []
        if have < count:
            def rank(d: int) -> tuple[int, int]:
                i = m.instances.get(d)
                return (0 if i is not None and i.state in RESTORABLE else 1, d)

            for d in sorted((d for d in free if (m.name, d) not in self.in_flight), key=rank):
                if have >= count:
                    break
                free.remove(d)
                ops.append(Op(m.name, d, "active", f"scale out: {reason}"))
                have += 1
        elif have > count:
            busy = self.host.core.requests.on_device
            for d in sorted((d for d in extras if d not in pending), key=lambda d: (len(busy(d)), -d)):
                if have <= count:
                    break
                ops.append(Op(m.name, d, "cold", f"scale in: {reason}"))
                have -= 1
        return ops

    def _meet(self, m: Model, count: int, reason: str) -> list[Op]:
        """Operations that bring model `m` to `count` serving instances, none of them on an
        instance with an operation in flight."""
        insts = sorted(m.instances.values(), key=lambda i: i.device)
        pending = {d: op.target for (name, d), (op, _) in self.in_flight.items() if name == m.name}
        free = [i for i in insts if i.device not in pending]
        # an operation in flight counts as done: its instance is (about to be) where it goes
        serving = sum(1 for i in insts if pending.get(i.device, "active" if _serving(i) else "") == "active")
        ops: list[Op] = []
        if serving < count:
            # Warm before Cold (less to move), then the lowest device
            for i in sorted((i for i in free if i.state in RESTORABLE), key=lambda i: (i.state is S.COLD, i.device)):
                if serving >= count:
                    break
                ops.append(Op(m.name, i.device, "active", f"scale out: {reason}"))
                serving += 1
        elif serving > count:
            busy = self.host.core.requests.on_device
            active = [i for i in free if i.state is S.ACTIVE]
            steady = self.steady.managed_devices()
            # one on a device the steady pool took goes first, then the one with the least
            # work in flight (its drain is shortest)
            for i in sorted(active, key=lambda i: (i.device not in steady, len(busy(i.device)), -i.device)):
                if serving <= max(count, 1):  # never below one Active instance
                    break
                ops.append(Op(m.name, i.device, "warm", f"scale in: {reason}"))
                serving -= 1
        return ops

    def plan_slow(self, now: float) -> list[Op]:
        """Keep-alive: each model's residency (its most-alive instance) against its last
        request; Warm and Cold apply to every instance of the model. A P/D model only while
        it is in the elastic pool: its waking request brings back one mixed instance and
        only the fast loop splits it again, so a steady P/D model keeps its configured roles."""
        cfg = self.host.cfg.control
        tel = self.host.core.telemetry
        acts: list[ModelActivity] = []
        models: dict[str, Model] = {}
        elastic = {p.app for p in self.pools if p.pool == "elastic"}
        for m in self.host.core.registry.models.values():
            if not m.instances or (m.pd and m.name not in elastic):
                continue
            states = {i.state for i in m.instances.values()}
            res = "active" if any(_serving(i) for i in m.instances.values()) else \
                  "warm" if S.WARM in states else "cold" if S.COLD in states else None
            if res is None:  # unloaded or failed: not the keep-alive's
                continue
            prev = self.residency.get(m.name)
            since = prev[1] if prev is not None and prev[0] == res else now
            self.residency[m.name] = (res, since)
            w = tel.model(m.name, now)
            acts.append(ModelActivity(model=m.name, residency=res, since=since, last_request_at=w.last_arrival_s,
                                      in_flight=self.host.core.requests.count(m.name),
                                      pinned=m.cfg.pool == "steady"))
            models[m.name] = m
        decisions = residency(acts, now, cfg.keepalive)
        self._plan_steady(now, {d.model for d in decisions if d.changed and d.residency != "active"})
        self.last_keepalive = [{"model": d.model, "residency": d.residency, "changed": d.changed, "reason": d.reason}
                               for d in decisions]
        ops: list[Op] = []
        for d in decisions:
            if not d.changed or d.residency == "active":  # coming back is the waking request's
                continue
            m = models[d.model]
            src = S.ACTIVE if d.residency == "warm" else S.WARM
            for i in sorted(m.instances.values(), key=lambda i: i.device):
                if (i.state is src or (d.residency == "cold" and i.state is S.ACTIVE)) \
                        and (m.name, i.device) not in self.in_flight:
                    ops.append(Op(m.name, i.device, d.residency, f"keep-alive: {d.reason}"))
        return ops

    def _plan_steady(self, now: float, resting: set[str]) -> None:
        """The steady placement's plan, when the controller places any model (its moves
        are queued in self.steady and started by the loop). `resting`: models keep-alive
        sends Warm or Cold at this tick (they leave the steady pool without a move)."""
        if not any(placed_by_controller(self.host.cfg, m) for m in self.host.core.registry.models.values()):
            return
        elastic = [p.app for p in self.pools if p.pool == "elastic"]
        try:
            p = self.steady.plan_now(now, self.host.predictor(), elastic, resting)
        except ValueError as e:  # a policy's refusal of odd input: logged, keep-alive still runs
            _log(f"controller: steady placement: {e}", logging.ERROR)
            return
        if p is not None:
            for a in p.assignment:  # a device the steady pool now holds is no longer an extra
                self.extras.get(a.key.split("#")[0].split("@")[0], set()).discard(a.device)
            self.on_figure("steady_bins_used", p.bins_used)
            self.on_figure("steady_phi", p.phi)
            self.on_figure("steady_migrations", p.migrations)
        self.on_figure("steady_pending_moves", len(self.steady.queue) + len(self.steady.running))

    # -------------------------------------------------------------- execution
    def start(self, ops: list[Op]) -> None:
        """Start each operation not already in flight (the plan never repeats one)."""
        for op in ops:
            key = (op.model, op.device)
            if key in self.in_flight:
                continue
            self.in_flight[key] = (op, self.clock())
            _log(f"controller: {op.model} on device {op.device} -> {op.target} ({op.reason})")
            t = asyncio.get_running_loop().create_task(self._run(op), name=f"ctl-{op.model}-{op.device}")
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    async def _run(self, op: Op) -> None:
        t0 = self.clock()
        key = (op.model, op.device)
        phases: dict[str, float] = {}
        try:
            m = self.host.core.registry.models.get(op.model)
            inst = m.instances.get(op.device) if m is not None else None
            peers = sorted(d for d, i in (m.instances.items() if m is not None else ()) if i.state is S.ACTIVE
                           and d != op.device)
            if op.target == "active" and op.role is None and (inst is None or inst.state is S.UNLOADED) and peers:
                reply = await self.host.fork(op.model, peers[0], op.device)  # a new replica: D2D from a live one
            elif op.reassign:  # drain to Warm, come back in the new role (one operation, one device)
                first = await self.host.set_state(op.model, op.device, "warm", probe=False)
                reply = await self.host.set_state(op.model, op.device, "active", probe=False, role=op.role)
                phases = {f"leave_{k}": float(v) for k, v in (first.get("phases") or {}).items()}
            else:
                reply = await self.host.set_state(op.model, op.device, op.target, probe=False, role=op.role)
            phases.update({k: float(v) for k, v in (reply.get("phases") or {}).items()})
            outcome = "ok"
            if m is not None and placed_by_controller(self.host.cfg, m) and op.reason.startswith("scale "):
                if op.target == "active":
                    self.extras.setdefault(op.model, set()).add(op.device)
                elif op.device in self.extras.get(op.model, ()):
                    self.extras[op.model].discard(op.device)
                    if not self.extras[op.model]:
                        del self.extras[op.model]
        except Exception as e:  # a refused or failed move: planned again next period
            outcome = f"{type(e).__name__}: {e}"
            _log(f"controller: {op.model} on device {op.device} -> {op.target} failed: {e}", logging.WARNING)
        finally:
            self.in_flight.pop(key, None)
        self.recent.append(_Done(op, t0, self.clock() - t0, outcome, phases))
        self.on_op(op.target, "ok" if outcome == "ok" else "failed")

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
                self.steady.pump()
            except Exception as e:  # a policy's ValueError on odd input: logged, the loop lives on
                _log(f"controller {name} loop: {type(e).__name__}: {e}", logging.ERROR)
            took = self.clock() - now
            nxt += period
            if self.clock() > nxt:
                skipped = int((self.clock() - nxt) // period) + 1
                self.overruns[name] += 1
                _log(f"controller {name} loop overran its {period:g} s period ({took:.3f} s); "
                     f"skipping {skipped} tick(s)", logging.WARNING)
                nxt += skipped * period
            await asyncio.sleep(max(0.0, nxt - self.clock()))

    async def close(self) -> None:
        await self.steady.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------------ views
    def _roles_view(self, a: AppCount) -> dict[str, Any]:
        """A P/D app's split and each instance's role and state now (`ctl plan`)."""
        m = self.host.core.registry.models.get(a.app)
        if m is None or not m.pd:
            return {}
        plan = self.roles.get(a.app)
        return {"prefill": a.prefill, "decode": a.decode,
                "instances": [{"device": i.device, "role": i.role, "state": i.state.value}
                              for i in sorted(m.instances.values(), key=lambda i: i.device)],
                "held": [{"device": o.device, "kind": o.kind, "role": o.role, "reason": o.reason}
                         for o in (plan.held if plan else ())]}

    def view(self, now: float) -> dict[str, Any]:
        """`janus ctl plan`: elastic counts with m* and the budget, keep-alive decisions,
        operations in flight and recent ones with their timings and reasons."""
        sp = self.last_scaling
        return {
            "managed": self.host.cfg.control.managed,
            "elastic": {
                "budget": sp.budget if sp else None,
                "asked": sp.asked if sp else None,
                "given": sp.given if sp else None,
                "compressed": sp.compressed if sp else None,
                "apps": [{"model": a.app, "demand": a.demand, "debounced": a.debounced, "count": a.count,
                          "reason": a.reason} | self._roles_view(a) for a in (sp.apps if sp else ())],
            },
            "steady": self.steady.view(now),
            "pools": self.last_pools,
            "keepalive": self.last_keepalive,
            "in_flight": [{"model": op.model, "device": op.device, "target": op.target, "role": op.role,
                           "reason": op.reason, "for_s": round(now - t, 3)} for op, t in self.in_flight.values()],
            "recent": [{"model": d.op.model, "device": d.op.device, "target": d.op.target, "role": d.op.role,
                        "reason": d.op.reason, "seconds": round(d.seconds, 3), "outcome": d.outcome,
                        "phases": {k: round(v, 4) for k, v in d.phases.items()}} for d in self.recent],
            "overruns": dict(self.overruns),
        }
