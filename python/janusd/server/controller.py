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
from typing import Any

from janusd.core.registry import Model
from janusd.lifecycle.states import RESTORABLE, InstanceState
from janusd.log import log
from janusd.oracle.types import LoadFeatures
from janusd.policy.classify import classify as classify_apps
from janusd.policy.demand import elastic_demand
from janusd.policy.keepalive import residency
from janusd.policy.scaling import scale
from janusd.policy.snapshot import AppCount, AppPool, AppTraffic, ElasticApp, RolePlan, ScalingPlan, ScalingState
from janusd.server.controller_counts import meet_count
from janusd.server.controller_extras import free_elastic_devices, meet_extras, prune_extras
from janusd.server.controller_keepalive import activity, keepalive_ops
from janusd.server.controller_ops import ControllerHost, Done, Op, Predictor
from janusd.server.controller_ops import serving as _serving
from janusd.server.controller_roles import measured_prefill_share, meet_roles
from janusd.server.controller_traffic import ArrivalHistory
from janusd.server.controller_view import plan_view
from janusd.server.steady import SteadyExecutor
from janusd.server.steady_snapshot import placed_by_controller

__all__ = ["Controller", "ControllerHost", "Op", "Predictor"]

S = InstanceState


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


def _scales_out(op: Op) -> bool:
    """An operation of elastic scaling that brings up a replica (meet_count / meet_extras)."""
    return op.target == "active" and op.reason.startswith("scale ")


class Controller:
    """The two loops, their state between ticks and the operations in flight; the plans'
    helpers live beside it (controller_traffic, controller_counts, controller_roles,
    controller_extras, controller_keepalive) and `ctl plan`'s view in controller_view."""

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
        self._arrivals = ArrivalHistory()  # the classifier's input: arrival counts sampled per fast tick
        self.last_scaling: ScalingPlan | None = None
        self.demands: dict[str, tuple[int, str]] = {}  # model -> (m*, reason) at the last fast tick
        self.roles: dict[str, RolePlan] = {}  # P/D model -> its role plan at the last fast tick
        self.residency: dict[str, tuple[str, float]] = {}  # model -> (residency, since)
        self.last_keepalive: list[dict[str, Any]] = []
        self.in_flight: dict[tuple[str, int], tuple[Op, float]] = {}
        self.recent: deque[Done] = deque(maxlen=50)
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
        """The model's arrivals per second over the telemetry window (server/controller_traffic.py)."""
        window = self.host.cfg.control.window_s
        total = self.host.core.telemetry.model(m.name, now).arrivals_total
        return self._arrivals.traffic(m, total, now, window)

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
        prune_extras(self.extras, self.host.core.registry.models, self.in_flight)
        free = free_elastic_devices(self.host.cfg, self.steady, self.extras, self.host.core.registry.models.values())
        elastic = self._elastic(now)
        ops: list[Op] = self._extras_left_behind({m.name for m in elastic})
        for m in elastic:
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
            return ops
        # the steady pool has priority (PAPER.md §2): devices it took leave the elastic budget
        plan = scale(apps, len(devices - self.steady.managed_devices()), self.scaling_state, cfg.scaling)
        self.scaling_state, self.last_scaling = plan.state, plan
        for k, v in (("budget", plan.budget), ("asked", plan.asked), ("given", plan.given)):
            self.on_figure(f"elastic_{k}", v)
        for a in plan.apps:
            self.on_elastic(a.app, a.demand, a.count, (a.prefill, a.decode) if models[a.app].pd else None)
            why = f"m*={a.demand} (debounced {a.debounced}, given {a.count}): {a.reason}"
            if placed_by_controller(self.host.cfg, models[a.app]):
                ops += meet_extras(models[a.app], a.count, free, f"extra replicas {why}", self.extras,
                                   self.in_flight, self.host.core.requests.on_device)
            elif models[a.app].pd:
                ops += self._meet_roles(models[a.app], a, why)
            else:
                ops += meet_count(models[a.app], max(1, a.count), why, self.in_flight,
                                  self.host.core.requests.on_device, self.steady)
        return ops

    def _extras_left_behind(self, elastic: set[str]) -> list[Op]:
        """Extra replicas of models no longer in the elastic pool go Cold. Only elastic
        scaling shrinks extras and the steady snapshot leaves their devices out
        (steady_snapshot.py), so a model that went back to the steady pool kept them
        serving, in no plan, for as long as its traffic kept keep-alive away."""
        ops: list[Op] = []
        models = self.host.core.registry.models
        for name in sorted(self.extras):
            m = models.get(name)
            if m is not None and name not in elastic:
                ops += meet_extras(m, 0, [], "scale in: back in the steady pool", self.extras, self.in_flight,
                                   self.host.core.requests.on_device)
        return ops

    def _prefill_share(self, m: Model, load: LoadFeatures) -> float:
        """P/D: prefill's part of the model's device time (server/controller_roles.py)."""
        return measured_prefill_share(self.host.core, m, load)

    def _meet_roles(self, m: Model, count: AppCount, reason: str) -> list[Op]:
        """P/D: operations toward `count`'s prefill / decode split (server/controller_roles.py);
        the role plan is kept for `ctl plan`."""
        plan, ops = meet_roles(m, count, reason, self.in_flight, self.host.core.requests.on_device)
        self.roles[m.name] = plan
        return ops

    def plan_slow(self, now: float) -> list[Op]:
        """Keep-alive: each model's residency (its most-alive instance) against its last
        request; Warm and Cold apply to every instance of the model. A P/D model only while
        it is in the elastic pool: its waking request brings back one mixed instance and
        only the fast loop splits it again, so a steady P/D model keeps its configured roles."""
        elastic = {p.app for p in self.pools if p.pool == "elastic"}
        acts, models = activity(self.host.core.registry.models.values(), elastic, self.residency,
                                self.host.core.telemetry, self.host.core.requests, now)
        decisions = residency(acts, now, self.host.cfg.control.keepalive)
        self._plan_steady(now, {d.model for d in decisions if d.changed and d.residency != "active"})
        self.last_keepalive = [{"model": d.model, "residency": d.residency, "changed": d.changed, "reason": d.reason}
                               for d in decisions]
        return keepalive_ops(decisions, models, self.in_flight)

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
            if _scales_out(op):
                m = self.host.core.registry.models.get(op.model)
                if m is not None and placed_by_controller(self.host.cfg, m):
                    # an extra from the start: meet_extras counts it while it comes up (else the
                    # next fast tick started another), the steady snapshot leaves its device out
                    # (else an Active-but-unrecorded one could pass for the steady instance);
                    # _run drops it if the operation fails
                    self.extras.setdefault(op.model, set()).add(op.device)
            _log(f"controller: {op.model} on device {op.device} -> {op.target} ({op.reason})")
            t = asyncio.get_running_loop().create_task(self._run(op), name=f"ctl-{op.model}-{op.device}")
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    def _drop_extra(self, model: str, device: int) -> None:
        left = self.extras.get(model)
        if left is not None:
            left.discard(device)
            if not left:
                del self.extras[model]

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
            if m is not None and placed_by_controller(self.host.cfg, m) and op.reason.startswith("scale ") \
                    and op.target != "active":  # a scale-out was recorded by start(); a scale-in ends one
                self._drop_extra(op.model, op.device)
        except Exception as e:  # a refused or failed move: planned again next period
            outcome = f"{type(e).__name__}: {e}"
            if _scales_out(op):  # start() counted it as an extra: a failed scale-out is none at once
                self._drop_extra(op.model, op.device)  # (not only at the next fast tick's prune_extras)
            _log(f"controller: {op.model} on device {op.device} -> {op.target} failed: {e}", logging.WARNING)
        finally:
            self.in_flight.pop(key, None)
        self.recent.append(Done(op, t0, self.clock() - t0, outcome, phases))
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
    def view(self, now: float) -> dict[str, Any]:
        """`janus ctl plan` (server/controller_view.py)."""
        return plan_view(self, now)
