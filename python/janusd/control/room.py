"""The controller: two timescales over one snapshot (PAPER.md §2, §4, §5, §8), for both shells.

- fast (control.fast_period_s, 0.5 s): the classifier (policy/classify.py, with
  hysteresis) puts each model with `pool = "auto"` in the elastic pool while it is hot or
  bursty (peak over short windows / mean, from arrivals bucketed per second over the
  window); `pool = "steady"` / `"elastic"` pin it. Every elastic model that has traffic
  gets m* from the oracle (policy/demand.py, through the snapshot's predictor: a fitted
  GP or the roofline prior) at the load of a burst when one shows in the last second, one
  more than serves after refusals, and held at its largest over `scale_in_hold_s`
  (control/burst.py: scale out at once, in only after demand stayed low); the counts are
  debounced and compressed to the elastic budget (policy/scaling.py) and met: a model with `devices` with its own instances there
  (control/counts.py: Warm before Cold, a surplus Active one goes Warm after draining), a
  model the steady placement places isolated on devices of its own (PAPER.md §2: left out
  of the steady snapshot; m* replicas on the pool's free devices, forked from a live
  instance, drained to Warm when m* falls, never below one; its steady instance serves
  beside its neighbours until one of them is Active, then drains: extras.hand_over; one alone on
  its device counts as its own), a P/D model with a prefill / decode split (control/roles.py).
  The elastic budget is the seats the elastic models may use (a placed model's devices of
  its own, a tp-N model's N per group: control/groups.py; a model with `devices` its
  instance slots) less those on devices the steady placement took.
  A scaled-in replica rests Warm as long as keep-alive keeps an idle model Warm, then goes
  Cold (control/keepalive.py cool_scaled_in).
- slow (control.slow_period_s, 30 s): keep-alive (policy/keepalive.py, control/keepalive.py):
  a model without a request for `warm_after_s` goes Warm on every device, after
  `cold_after_s` Cold; its next request wakes it (control/wake.py); then the steady
  placement (control/steady.py) packs the models without `devices` and paces its moves;
  a tp > 1 one gets its replica count on groups of its own (control/groups.py).
Each plan returns Ops (control/ops.py); an operation in flight on an instance is never
issued twice, and the shell reports each one's end (`finished`), which may release
steady moves waiting for it. A failed one is planned again next period, never left half
done (the lifecycle rolls an instance back to where it was)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from janusd.config import ControlConfig
from janusd.control.baselines import first_come
from janusd.control.burst import BurstWatch
from janusd.control.counts import meet_count
from janusd.control.extras import free_elastic_devices, hand_over, meet_extras, prune_extras
from janusd.control.groups import free_groups, steady_group_ops
from janusd.control.keepalive import activity, cool_scaled_in, keepalive_ops
from janusd.control.ops import SCALE_IN, Done, Op, group, halves
from janusd.control.roles import meet_roles
from janusd.control.snapshot import ControlSnapshot, ModelView
from janusd.control.steady import SteadyPlanner, model_of
from janusd.control.traffic import ArrivalHistory
from janusd.lifecycle.states import RESTORABLE, InstanceState
from janusd.policy.classify import classify as classify_apps
from janusd.policy.demand import elastic_demand, replicas_to_fit
from janusd.policy.keepalive import residency
from janusd.policy.scaling import scale
from janusd.policy.snapshot import AppCount, AppPool, ElasticApp, RolePlan, ScalingPlan, ScalingState

S = InstanceState
ALLOCATORS = ("global", "first_come")
# between slow ticks, the steady pool is re-planned without consolidation this often (and
# at once when the classifier moved a model between pools): a device whose grown demand
# vectors overfill it is relieved within seconds, not at the next 30 s tick (the plan's
# forced moves only; consolidation stays the slow tick's)
RECHECK_S = 5.0


def _nothing(*_: Any) -> None:
    return None


class ControlRoom:
    """The two plans, their state between ticks and the operations in flight (module doc).
    `allocator`: "global" (Janus: one budget, compressed by the quota method) or
    "first_come" (the BlitzScale baseline of `janus sim`: each app its own m* by name
    until the budget runs out). Hooks: `on_op(target, outcome)` per finished operation,
    `on_elastic(model, m*, count, (prefill, decode) or None)` per elastic model at each
    fast tick, `on_move(kind, outcome)` per finished steady move, `on_figure(name, value)`
    for the plans' figures, `log(message, level)`, `on_undone(model)` per scale-in of a
    replica within the hold time of its scale-out (control/burst.py)."""

    def __init__(self, cfg: ControlConfig, allocator: str = "global",
                 on_op: Callable[[str, str], None] = _nothing,
                 on_elastic: Callable[[str, int, int, tuple[int, int] | None], None] = _nothing,
                 on_move: Callable[[str, str], None] = _nothing,
                 on_figure: Callable[[str, float], None] = _nothing,
                 log: Callable[[str, int], None] = _nothing,
                 on_undone: Callable[[str], None] = _nothing) -> None:
        if allocator not in ALLOCATORS:
            raise ValueError(f"unknown allocator {allocator!r} (known: {', '.join(ALLOCATORS)})")
        self.cfg = cfg
        self.allocator = allocator
        self.on_op, self.on_elastic, self.on_move, self.on_figure = on_op, on_elastic, on_move, on_figure
        self.on_undone = on_undone
        self.burst = BurstWatch(cfg.scaling.scale_in_hold_s)
        self.warm_since: dict[tuple[str, int], float] = {}  # a scaled-in replica resting Warm, since
        self.log = log
        self.scaling_state = ScalingState()
        self.pools: tuple[AppPool, ...] = ()  # the classifier's state between ticks
        self.last_pools: list[dict[str, Any]] = []
        self.arrivals = ArrivalHistory()
        self.last_scaling: ScalingPlan | None = None
        self.demands: dict[str, tuple[int, str]] = {}  # model -> (m*, reason) at the last fast tick
        self.roles: dict[str, RolePlan] = {}  # P/D model -> its role plan at the last fast tick
        self.residency: dict[str, tuple[str, float]] = {}  # model -> (residency, since)
        self.last_keepalive: list[dict[str, Any]] = []
        self.in_flight: dict[tuple[str, int], tuple[Op, float]] = {}
        self.recent: deque[Done] = deque(maxlen=50)
        self.extras: dict[str, set[int]] = {}  # placed model -> devices of its extra (elastic) replicas
        self.decisions = 0  # policy calls made (the simulator's summary)
        self.steady = SteadyPlanner(cfg.demand, cfg.placement, cfg.max_transfers_per_device, self._claim,
                                    self._release, lambda msg: log(msg, logging.INFO))

    # ------------------------------------------------------------ in flight
    def _claim(self, op: Op, now: float) -> bool:
        """Reserve the instances of an op (False: an operation is in flight on one)."""
        keys = [(h.model, h.device) for h in halves(op)]
        if any(k in self.in_flight for k in keys):
            return False
        for k in keys:
            self.in_flight[k] = (op, now)
        return True

    def _release(self, model: str, device: int) -> None:
        self.in_flight.pop((model, device), None)

    def _issue(self, snap: ControlSnapshot, ops: list[Op], now: float) -> list[Op]:
        """The plan's ops not on an instance with one in flight, each claimed; a scale-out
        of a placed model counts as its extra from now (else the next fast tick started
        another, and the steady snapshot could take it for the steady instance)."""
        out = []
        for op in ops:
            if not self._claim(op, now):
                continue
            m = snap.models.get(op.model)
            if op.scales_out and m is not None and snap.placed_by_controller(m):
                self.extras.setdefault(op.model, set()).add(op.device)
            if op.scales and op.target != "active" and self.burst.undone(op.model, op.device, now):
                self.on_undone(op.model)
            self.log(f"controller: {op.model} on device {op.device} -> {op.target} ({op.reason})", logging.INFO)
            out.append(op)
        return out + self.steady.pump(snap, now)

    def finished(self, op: Op, outcome: str, now: float, snap: ControlSnapshot,
                 phases: dict[str, float] | None = None, detail: dict[str, Any] | None = None) -> list[Op]:
        """The shell carried `op` out (`outcome`: "ok" or the error; `phases`: its timed
        phases; `detail`: what each half did, for `ctl plan`); returns the steady moves
        this releases."""
        if op.steady:
            kind = self.steady.done(op, outcome, now, detail)
            if kind is not None:
                self.on_move(kind, "ok" if outcome == "ok" else "failed")
        else:
            self._done(op, outcome, now, snap, phases)
        return self.steady.pump(snap, now) if self.steady.queue else []

    def _done(self, op: Op, outcome: str, now: float, snap: ControlSnapshot, phases: dict[str, float] | None) -> None:
        """An elastic, keep-alive or role operation ended: its claim goes, an extra that
        did not come up (or was scaled in) is no more, `ctl plan` and the metrics hear it."""
        t0 = self.in_flight.get((op.model, op.device), (op, now))[1]
        self._release(op.model, op.device)
        m = snap.models.get(op.model)
        placed = m is not None and snap.placed_by_controller(m)
        if (outcome == "ok" and placed and op.scales and op.target != "active") or \
                (outcome != "ok" and op.scales_out):  # a scale-in ends an extra; a failed scale-out is none
            self._drop_extra(op.model, op.device)
        if outcome == "ok" and op.scales_out:
            self.burst.scaled_out(op.model, op.device, now)
        if outcome == "ok" and op.target == "warm":  # a scaled-in replica's Warm time starts now
            self.warm_since[(op.model, op.device)] = now
        if outcome != "ok":
            self.log(f"controller: {op.model} on device {op.device} -> {op.target} failed: {outcome}",
                     logging.WARNING)
        self.recent.append(Done(op, t0, now - t0, outcome, dict(phases or {})))
        self.on_op(op.target, "ok" if outcome == "ok" else "failed")

    def _drop_extra(self, model: str, device: int) -> None:
        left = self.extras.get(model)
        if left is not None:
            left.discard(device)
            if not left:
                del self.extras[model]

    # ------------------------------------------------------------------ fast
    def _elastic(self, snap: ControlSnapshot, now: float) -> list[ModelView]:
        """The models in the elastic pool now (classified with hysteresis, pins obeyed)."""
        models = [m for m in snap.models.values() if m.instances]
        if not models:
            return []
        window = self.cfg.window_s
        traffic = [self.arrivals.traffic(m.name, m.pool, m.window.arrivals_total, now, window) for m in models]
        c = classify_apps(traffic, self.pools, now, self.cfg.classify)
        self.decisions += 1
        self.pools = c.state
        self.last_pools = [{"model": d.app, "pool": d.pool, "changed": d.changed, "reason": d.reason}
                           for d in c.decisions]
        for d in c.decisions:
            if d.changed:
                self.log(f"controller: {d.app} -> {d.pool} pool ({d.reason})", logging.INFO)
        elastic = {d.app for d in c.decisions if d.pool == "elastic"}
        return [m for m in models if m.name in elastic]

    def _elastic_app(self, snap: ControlSnapshot, m: ModelView, free: list[int],
                     seats: set[int | tuple[str, int]], now: float) -> ElasticApp | None:
        """One elastic model's ask of the budget (None: no traffic, or no prior yet); what
        it may use joins `seats`: a placed model's devices of its own (whole devices), a
        model with `devices` its own instance slots (model, device): two such models
        sharing their devices each count theirs, so that one's base instance does not take
        the other's burst replica out of the budget (on a real daemon burst-b never got
        its second instance beside burst-a: [W])."""
        w = m.window
        if w.request_rate <= 0.0 and w.in_flight == 0:  # left to keep-alive (a request wakes it)
            return None
        want, why = self._demand(snap, m, now)
        if want is None:
            return None
        if snap.placed_by_controller(m):
            # isolated (PAPER.md §2): its replicas are devices of its own, the ones the steady
            # pool leaves; the steady instance it had serves until one is Active (hand_over)
            if not self.extras.get(m.name) and not any(i.serving for i in m.instances.values()):
                return None  # resting (keep-alive): the waking request brings it back first
            self._adopt_lone(snap, m)
            extras = self.extras.get(m.name, set())
            mine = extras | set(free_groups(free, m.tp))  # leads of tp-device groups (control/groups.py)
            want = min(want, len(mine))
            unit = "device(s)" if m.tp == 1 else f"group(s) of {m.tp} devices"
            self.demands[m.name] = (want, f"{why}; {len(mine)} {unit} of its own at most")
            seats.update(x for d in mine for x in group(d, m.tp))  # whole devices of its own
            return ElasticApp(app=m.name, demand=want, current=len(extras), devices=m.tp)
        usable = sum(1 for i in m.instances.values() if i.serving or i.state in RESTORABLE)
        want = max(1, min(want, usable))
        self.demands[m.name] = (want, why)
        seats.update((m.name, d) for d in m.instances)  # its own instance slots: co-located ones each count
        return ElasticApp(app=m.name, demand=want, prefill_share=m.prefill_share if m.pd else 0.5,
                          current=sum(1 for i in m.instances.values() if i.serving))

    def _demand(self, snap: ControlSnapshot, m: ModelView, now: float) -> tuple[int | None, str]:
        """m* at the load a burst raised it to, one more than serves after refusals, held
        over the hold time (control/burst.py); None: the oracle has no prior for it yet."""
        load, burst = self.burst.load(m, self.arrivals, now)
        refused = self.burst.refused(m)
        try:
            want, why = elastic_demand(m.name, load, snap.predictor, self.cfg.demand)
        except KeyError as e:  # its spec is being read
            self.log(f"controller: {m.name}: {e}; keeping its instances as they are", logging.DEBUG)
            return None, ""
        notes = [burst] if burst else []
        fit, _ = replicas_to_fit(m.name, load, snap.predictor, 0.0, self.cfg.demand.max_elastic_instances)
        fit = self.cfg.demand.max_elastic_instances if fit is None else fit
        if fit > want:  # the device time the load takes: m* never gives it less than that
            want = fit
            notes.append(f"capacity: {fit} instance(s) to carry the load")
        serving = sum(1 for i in m.instances.values() if i.serving)
        if refused and want <= serving:
            want = min(serving + 1, self.cfg.demand.max_elastic_instances)
            notes.append(f"{refused} request(s) refused since the last tick: one more than the {serving} serving")
        want, held = self.burst.hold(m.name, want, now)
        notes += [held] if held else []
        return want, "; ".join([why] + notes)

    def plan_fast(self, snap: ControlSnapshot, now: float) -> list[Op]:
        """Elastic scaling (module doc): m* per elastic model with traffic, debounced and
        compressed to the budget, then met with instances."""
        self.demands = {}
        prune_extras(self.extras, snap.models, self.in_flight)
        elastic = self._elastic(snap, now)
        self.burst.forget({m.name for m in elastic})
        ops = self._extras_left_behind(snap, {m.name for m in elastic})
        ops += cool_scaled_in(snap.models.values(), self.warm_since, now, self._warm_for_s(), self.in_flight)
        last = self.steady.planned_at
        if any(d["changed"] for d in self.last_pools) or last is None or now - last >= RECHECK_S:
            self._plan_steady(snap, now, set(), consolidate=False)
        free = free_elastic_devices(snap.pool, self.steady.plan_devices(), self.extras, snap.models.values())
        apps: list[ElasticApp] = []
        seats: set[int | tuple[str, int]] = set()
        for m in elastic:
            a = self._elastic_app(snap, m, free, seats, now)
            if a is not None:
                apps.append(a)
        if apps:
            # the steady pool has priority (PAPER.md §2): devices it took leave the elastic budget
            managed = self.steady.managed_devices()
            plan = self._scale(apps, sum(1 for k in seats if (k if isinstance(k, int) else k[1]) not in managed))
            for a in plan.apps:
                ops += self._meet(snap, snap.models[a.app], a, free)
        return self._issue(snap, ops, now)

    def _warm_for_s(self) -> float:
        """How long a scaled-in replica rests Warm before Cold: as long as keep-alive keeps
        an idle model Warm."""
        k = self.cfg.keepalive
        return k.cold_after_s - k.warm_after_s

    def _scale(self, apps: list[ElasticApp], budget: int) -> ScalingPlan:
        if self.allocator == "first_come":
            plan = first_come(apps, budget, self.scaling_state)
        else:
            plan = scale(apps, budget, self.scaling_state, self.cfg.scaling)
        self.decisions += 1
        self.scaling_state, self.last_scaling = plan.state, plan
        for k, v in (("budget", plan.budget), ("asked", plan.asked), ("given", plan.given)):
            self.on_figure(f"elastic_{k}", v)
        return plan

    def _meet(self, snap: ControlSnapshot, m: ModelView, a: AppCount, free: list[int]) -> list[Op]:
        """Ops toward one elastic model's count (module doc's three kinds of model)."""
        self.on_elastic(a.app, a.demand, a.count, (a.prefill, a.decode) if m.pd else None)
        why = f"m*={a.demand} (debounced {a.debounced}, given {a.count}): {a.reason}; {self.demands[a.app][1]}"
        if snap.placed_by_controller(m):
            base = self._base(m)
            count = a.count if base else max(1, a.count)  # never below one instance that serves
            ops = meet_extras(m, count, free, f"own replicas {why}", self.extras, self.in_flight, snap.load_on)
            return ops + hand_over(snap, m, base, self.extras, self.in_flight)
        if m.pd:
            plan, ops = meet_roles(m, a, why, self.in_flight)
            self.roles[m.name] = plan
            return ops
        return meet_count(m, max(1, a.count), why, self.in_flight, snap.load_on, self.steady.managed_devices(),
                          lambda d: snap.others_on(d, m.name), compressed=a.count < a.debounced)

    def _base(self, m: ModelView) -> list[int]:
        """Where a placed model serves outside its own replicas: its steady instance(s)."""
        mine = self.extras.get(m.name, set())
        return sorted(d for d, i in m.instances.items() if i.serving and d not in mine)

    def _adopt_lone(self, snap: ControlSnapshot, m: ModelView) -> None:
        """A steady instance of an elastic model alone on its device is already a replica of
        its own: it counts as one (handing it over would free the device only to take it again)."""
        for d in self._base(m):
            if not snap.others_on(d, m.name):
                self.extras.setdefault(m.name, set()).add(d)

    def _extras_left_behind(self, snap: ControlSnapshot, elastic: set[str]) -> list[Op]:
        """A placed model no longer in the elastic pool: where a steady instance of it
        serves, its own replicas go Warm (only elastic scaling shrinks them, and the
        steady snapshot leaves their devices out: it kept them serving, in no plan);
        where none does (it was handed over), its replicas become its steady instances,
        and the steady placement packs them (a surplus one is removed by the plan)."""
        ops: list[Op] = []
        for name in sorted(self.extras):
            m = snap.models.get(name)
            if m is None or name in elastic:
                continue
            if self._base(m):
                ops += meet_extras(m, 0, [], f"{SCALE_IN}: back in the steady pool", self.extras, self.in_flight,
                                   snap.load_on)
            else:
                del self.extras[name]
        return ops

    # ------------------------------------------------------------------ slow
    def plan_slow(self, snap: ControlSnapshot, now: float) -> list[Op]:
        """Keep-alive, then the steady placement (module doc). Warm and Cold apply to every
        instance of the model; a P/D model only while it is in the elastic pool: its
        waking request brings back one mixed instance and only the fast tick splits it
        again, so a steady P/D model keeps its configured roles."""
        elastic = {p.app for p in self.pools if p.pool == "elastic"}
        acts, models = activity(snap.models.values(), elastic, self.residency, now)
        decisions = residency(acts, now, self.cfg.keepalive)
        self.decisions += 1
        resting = {d.model for d in decisions if d.changed and d.residency != "active"}
        self._plan_steady(snap, now, resting)
        self.last_keepalive = [{"model": d.model, "residency": d.residency, "changed": d.changed, "reason": d.reason}
                               for d in decisions]
        free = free_elastic_devices(snap.pool, self.steady.plan_devices(), self.extras, snap.models.values())
        groups = steady_group_ops(snap, elastic | resting, free, self.cfg.demand, self.in_flight, snap.load_on)
        return self._issue(snap, keepalive_ops(decisions, models, self.in_flight) + groups, now)

    def _plan_steady(self, snap: ControlSnapshot, now: float, resting: set[str], consolidate: bool = True) -> None:
        """The steady placement's plan, when the room places any model (its moves are
        queued in self.steady and released by pump). `resting`: models keep-alive sends
        Warm or Cold at this tick (they leave the steady pool without a move)."""
        if not any(snap.placed_by_controller(m) for m in snap.models.values()):
            return
        elastic = [p.app for p in self.pools if p.pool == "elastic"]
        try:
            p = self.steady.plan_now(snap, now, elastic, resting, self.extras, consolidate)
        except ValueError as e:  # a policy's refusal of odd input: logged, keep-alive still runs
            self.log(f"controller: steady placement: {e}", logging.ERROR)
            return
        if p is not None:
            self.decisions += 1
            for a in p.assignment:  # a device the steady pool now holds is no longer an extra
                self.extras.get(model_of(a.key), set()).discard(a.device)
            self.on_figure("steady_bins_used", p.bins_used)
            self.on_figure("steady_phi", p.phi)
            self.on_figure("steady_migrations", p.migrations)
        self.on_figure("steady_pending_moves", len(self.steady.queue) + len(self.steady.running))
