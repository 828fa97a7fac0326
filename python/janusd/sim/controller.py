"""The Janus controller as the simulator runs it: policy/ at its periods, lifecycle moves
taking the time their bytes need.

The decisions are policy/'s own functions, called here exactly as docs/DESIGN.md's
"Controller policies" describes one tick (no copies: tests/test_sim_controller.py checks
that these names are the policy modules' objects):
- every fast period (ControlConfig.fast_period_s, 0.5 s): classify.classify on each app's
  arrivals per second over the last minute (classify.traffic_from_counts; DESIGN.md: cheap
  enough for every tick); when an app changed pool, placement.plan without consolidation
  (placement "on change"); then elastic scaling: budget = pool - devices the steady pool
  uses - devices still draining, m* per elastic app (demand.elastic_demand), scaling.scale;
- every slow period (30 s): steady items (demand.steady_items) -> placement.plan with
  consolidation and the migration budget left in the period.
Predictions come from the oracle (oracle/oracle.py Oracle) with the roofline prior of
each model on a device derated by the simulator's efficiencies (and the perf model's
fixed cost per step as the device's host time per step), i.e. the oracle is
trained on the simulator's own performance model (no GP fitting in the loop yet).
Loads are the core's telemetry windows (LoadFeatures.from_window), as in the daemon.

Lifecycle moves (PAPER.md §8, lifecycle/states.py names): an instance goes Loading ->
Active after `control_overhead_s` plus its weight shard over the link: D2D (hw/ d2d_bw)
when another instance of the model is Active (a fork), else H2D (h2d_bw, from the Warm
host copy every model is assumed to have); removal drains (Draining -> Unloaded once its
requests are done). A migration places the new instance first and drains the old one
when the new one is Active; so does a change of pool (an app turning elastic keeps its
steady instance until an elastic one is Active, and back). Moves only start instances;
what stops them is one rule applied after every tick (_reconcile): an instance no plan
wants goes once every instance its model's plans want is Active.

Keep-alive (sim/keepalive.py, policy/keepalive.residency): every slow period, before the
placement, a model idle for warm_after_s goes Warm (its instances drain; it leaves the
placement and the scaling until a request comes), for cold_after_s Cold; a request for a
resting model wakes it at once on a free device, Active after the control overhead plus
the restore path's time (H2D from Warm, the checkpoint from Cold), and it rejoins the
plans as a steady item where it woke. Its requests are held meanwhile (the core's
model_wait_timeout_s), as in the daemon.

Modes (sim/policies.py): janus (both pools), steady-only (every app pinned steady),
elastic-only (every app pinned elastic), prism (steady-only with every move loaded over
H2D, no fork), blitzscale (every app elastic, each scaled to its own m* first come first
served by app name until the pool runs out, no global compression).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from janusd.hw.devices import DeviceSpec
from janusd.lifecycle.states import InstanceState, holds_device_memory
from janusd.oracle.oracle import Oracle
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import LoadFeatures
from janusd.policy import classify, demand, placement, scaling
from janusd.policy.policy_config import ControllerConfig
from janusd.policy.snapshot import AppPool, Pool, Assignment, ElasticApp, PlacementSnapshot, ScalingState
from janusd.sim.cluster import Cluster, Served
from janusd.sim.keepalive import KeepAlive

S = InstanceState
MODES = ("janus", "steady-only", "elastic-only", "prism", "blitzscale")


class ControllerError(ValueError):
    """A served model the controller cannot plan for (says which and why)."""


@dataclass(frozen=True)
class Periods:
    fast_s: float = 0.5
    slow_s: float = 30.0
    traffic_window_s: int = 60  # classify's long window, in 1 s buckets
    short_buckets: int = 5  # classify's short window (peak rate)
    control_overhead_s: float = 0.5  # a lifecycle move's fixed cost (detect, prepare, switch)
    # placement "on change" (DESIGN.md: 30 s + on change): besides a pool change, every
    # this often the steady pool is re-planned without consolidation, which re-places
    # instances of devices that grown demand vectors overfill (the plan's forced moves)
    recheck_s: float = 5.0


@dataclass
class _State:
    pools: tuple[AppPool, ...] = ()
    scaling: ScalingState = field(default_factory=ScalingState)
    steady: dict[str, Assignment] = field(default_factory=dict)  # item key -> where
    elastic: dict[str, list[int]] = field(default_factory=dict)  # app -> its elastic workers
    migrations: int = 0  # optional moves executed in this slow period


def build_oracle(served: list[Served], cluster: Cluster) -> Oracle:
    """One roofline prior per served model on the simulator's device as the performance
    model runs it: peak FLOP/s, bandwidth and memory derated by its efficiencies, and the
    bandwidth further by the fixed per-step cost at the model's own decode step (the prior
    has no per-step term: a decode step that reads 16 GB of weights in 12.5 ms takes
    17.5 ms with the 5 ms overhead, so without it the prior saw 40% more decode capacity
    than the simulator gives)."""
    perf = cluster.perf
    dev: DeviceSpec = msgspec.structs.replace(perf.device, peak_flops=perf.device.peak_flops * perf.compute_eff,
                                              hbm_bw=perf.device.hbm_bw * perf.bandwidth_eff,
                                              hbm_bytes=perf.device.hbm_bytes * perf.usable_frac,
                                              step_overhead_s=perf.overhead_s, layer_overhead_s=0.0,
                                              seq_overhead_s=0.0)  # the perf model's step cost, no other
    o = Oracle()
    for s in served:
        if s.arch.spec is None or s.arch.tp != 1:
            raise ControllerError(f"model {s.name} ({s.arch.name}, tp {s.arch.tp}): the controller's oracle prior "
                                  "needs a dense model on one device (tp 1)")
        weights_s = s.arch.weight_bytes / dev.hbm_bw
        step_dev = msgspec.structs.replace(dev, hbm_bw=dev.hbm_bw * weights_s / (weights_s + perf.overhead_s))
        o.set_prior(s.name, RooflinePrior(s.arch.spec, step_dev, s.ttft_slo_ms / 1000, s.tpot_slo_ms / 1000))
    return o


class Controller:
    def __init__(self, cluster: Cluster, served: list[Served], mode: str = "janus",
                 cfg: ControllerConfig = ControllerConfig(), periods: Periods = Periods()) -> None:
        if mode not in MODES:
            raise ControllerError(f"unknown controller mode {mode!r} (known: {', '.join(MODES)})")
        self.c = cluster
        self.mode = mode
        self.cfg = cfg
        self.p = periods
        self.apps = sorted(s.name for s in served)
        self.oracle = build_oracle(served, cluster)
        self.st = _State()
        self.counts: dict[str, list[int]] = {a: [] for a in self.apps}  # arrivals per 1 s bucket
        self._bucket0 = 0
        self._traffic_key: tuple[int, int] | None = None  # the buckets of the last answer
        self._traffic_val: list = []
        self._row_model = cluster.request_model
        self._names = cluster.req_model
        self.decisions = 0  # policy calls made (tests, the summary)
        self._placed_at = 0.0
        self._pending: set[tuple[str, int]] = set()  # loads waiting for memory (retried every fast tick)
        self._handover: dict[str, set[int]] = {}  # model -> devices serving it until its new pool does
        pin: dict[str, Pool] = {"steady-only": "steady", "prism": "steady", "elastic-only": "elastic",
                                "blitzscale": "elastic"}
        self.pin: Pool | None = pin.get(mode)
        self.keep = KeepAlive(cluster, cfg.keepalive)
        self._waking: dict[str, float] = {}  # woken model -> its restore s, while it waits for a free device
        self._rested_on: dict[str, list[int]] = {}  # resting model -> the devices it left
        cluster.on_arrival = self._arrival
        cluster.figures = lambda: {"decisions": self.decisions, "rested": self.keep.rested, "woken": self.keep.woken}

    # --------------------------------------------------------------- inputs
    def _arrival(self, row: int, now: float) -> None:
        b = int(now)
        name = self._names[int(self._row_model[row])]
        lst = self.counts[name]
        k = b - self._bucket0
        if k >= 0:
            if len(lst) <= k:
                lst.extend([0] * (k + 1 - len(lst)))
            lst[k] += 1
        if name in self._waking or self.keep.resting(name) is not None:
            self._wake(name, now)

    def _traffic(self, now: float) -> list:
        """Per app arrivals per second over the last traffic_window_s whole seconds. The
        fast tick comes twice per 1 s bucket: the second finds the same complete buckets
        and gets the same answer without asking again."""
        end = int(now) - self._bucket0
        start = max(0, end - self.p.traffic_window_s)
        stop = max(end, start + 1)  # before the first whole second: the bucket in progress
        key = (start + self._bucket0, stop + self._bucket0)
        if key == self._traffic_key and stop == end:
            return self._traffic_val
        out = []
        for a in self.apps:
            window = self.counts[a][start:stop]
            if len(window) < stop - start:
                window += [0] * (stop - start - len(window))
            out.append(classify.traffic_from_counts(a, window, 1.0, self.p.short_buckets, pin=self.pin))
        self._traffic_key, self._traffic_val = key, out
        # keep memory bounded: drop buckets older than the window
        if start > 4 * self.p.traffic_window_s:
            for a in self.apps:
                del self.counts[a][:start]
            self._bucket0 += start
        return out

    def _load(self, app: str, now: float) -> LoadFeatures:
        return LoadFeatures.from_window(self.c.core.telemetry.model(app, now))

    # ------------------------------------------------------------------ loop
    def start(self) -> None:
        self.c.at(0.0, self._first)

    def _first(self, now: float) -> None:
        self._classify(now)
        self._place(now, consolidate=False)
        self._fast(now)
        self.c.at(now + self.p.fast_s, self._fast_tick)
        self.c.at(now + self.p.slow_s, self._slow_tick)

    def _fast_tick(self, now: float) -> None:
        for name in sorted(self._waking):
            self._wake(name, now)
        self._retry_pending(now)
        self._finish_handovers(now)
        if self._classify(now) or now - self._placed_at >= self.p.recheck_s:
            self._place(now, consolidate=False)
        self._fast(now)
        self._reconcile(now)
        if self.c.busy:
            self.c.at(now + self.p.fast_s, self._fast_tick)

    def _slow_tick(self, now: float) -> None:
        self.st.migrations = 0
        for name, _res in self.keep.tick(now, [a for a in self.apps if a not in self._waking]):
            self._rest(name, now)
        self._place(now, consolidate=True)
        self._reconcile(now)
        if self.c.busy:
            self.c.at(now + self.p.slow_s, self._slow_tick)

    # -------------------------------------------------------------- classify
    def _classify(self, now: float) -> bool:
        res = classify.classify(self._traffic(now), self.st.pools, now, self.cfg.classify)
        self.decisions += 1
        changed = [d for d in res.decisions if d.changed] or not self.st.pools
        self.st.pools = res.state
        return bool(changed)

    def _pool_of(self) -> dict[str, str]:
        return {p.app: p.pool for p in self.st.pools}

    # ------------------------------------------------------------- placement
    def _place(self, now: float, consolidate: bool) -> None:
        pools = self._pool_of()
        steady = [a for a in self.apps if pools.get(a, "steady") == "steady" and self._awake(a)]
        models = [demand.SteadyModel(model=a, load=self._load(a, now)) for a in steady]
        items = [i for d in demand.steady_items(models, self.oracle, self.cfg.demand) for i in d.items]
        elastic_devs = sorted({d for devs in self.st.elastic.values() for d in devs})
        current = tuple(a for _, a in sorted(self.st.steady.items()))
        snap = PlacementSnapshot(pool=tuple(range(self.c.n_devices)), items=tuple(items), current=current,
                                 elastic_devices=tuple(elastic_devs))
        left = max(0, self.cfg.placement.migration_budget - self.st.migrations)
        plan = placement.plan(snap, self.cfg.placement, consolidate=consolidate, migrations_left=left)
        self.decisions += 1
        self._placed_at = now
        for mv in plan.moves:
            if mv.kind == "place" and mv.dst is not None:
                self._evict_elastic(mv.dst, now, mv.model)
                self._start(mv.model, mv.dst, now)
            elif mv.kind == "migrate" and mv.dst is not None and mv.src is not None:
                self._evict_elastic(mv.dst, now, mv.model)
                self._start(mv.model, mv.dst, now)
                if not mv.forced:
                    self.st.migrations += 1
            elif mv.kind == "remove" and mv.src is not None:
                if pools.get(mv.model) == "elastic":  # leaving for the elastic pool
                    self._hand_over(mv.model, mv.src, now)
                else:
                    self._stop(mv.model, mv.src, now)
        self.st.steady = {a.key: a for a in plan.assignment}

    # --------------------------------------------------------------- scaling
    def _fast(self, now: float) -> None:
        pools = self._pool_of()
        elastic = [a for a in self.apps if pools.get(a) == "elastic" and self._awake(a)]
        for a in list(self.st.elastic):
            if a not in elastic:  # back to steady: its elastic instances go
                for d in self.st.elastic.pop(a):
                    self._hand_over(a, d, now)
        if not elastic:
            return
        steady_devs = {a.device for a in self.st.steady.values()}
        draining = set(self.c._draining)
        budget = max(0, self.c.n_devices - len(steady_devs) - len(draining - steady_devs))
        apps = []
        for a in elastic:
            m, _why = demand.elastic_demand(a, self._load(a, now), self.oracle, self.cfg.demand)
            apps.append(ElasticApp(app=a, demand=max(1, m), current=len(self.st.elastic.get(a, ()))))
        if self.mode == "blitzscale":  # no global allocator: each app's own m*, first come by name
            counts, left = {}, budget
            for e in apps:
                counts[e.app] = min(e.demand, left)
                left -= counts[e.app]
        else:
            plan = scaling.scale(apps, budget, self.st.scaling, self.cfg.scaling)
            self.st.scaling = plan.state
            counts = {c.app: c.count for c in plan.apps}
        self.decisions += 1
        free = self._free_devices(steady_devs | draining)
        for a in elastic:
            have = self.st.elastic.setdefault(a, [])
            want = counts.get(a, 0)
            while len(have) > want:
                self._stop(a, have.pop(), now)
            while len(have) < want and free:
                d = free.pop(0)
                self._start(a, d, now)
                have.append(d)

    def _free_devices(self, busy: set[int]) -> list[int]:
        taken = set(busy) | {d for devs in self.st.elastic.values() for d in devs}
        for inst in self.c.core.registry.instances.values():
            if inst.state is not S.UNLOADED:
                taken.add(inst.device)
        return [d for d in range(self.c.n_devices) if d not in taken]

    def _evict_elastic(self, device: int, now: float, keep: str) -> None:
        """The steady pool takes `device`: elastic instances there go (one of `keep`, the
        model being placed, stays and becomes the steady one)."""
        for a, devs in self.st.elastic.items():
            if device in devs:
                devs.remove(device)
                if a != keep:
                    self._stop(a, device, now)

    # ------------------------------------------------------------ lifecycle
    def _start(self, model: str, device: int, now: float) -> None:
        """Load `model` on `device`, or, while the device's memory is held by instances
        still draining (their weights and the newcomer's would not fit), wait: retried at
        every fast tick while the plan still wants it there."""
        inst = self.c.core.instance(model, device)
        if inst.state is S.ACTIVE or inst.state is S.LOADING:
            if device in self._handover.get(model, ()):  # wanted again where it still serves
                self._handover[model].discard(device)
                if not self._handover[model]:
                    del self._handover[model]
            return
        arch = self.c.served[model].arch
        held = [a for n, a in self.c.residents(device).items() if n != model]
        if inst.state is S.DRAINING or not self.c.perf.weights_fit([*held, arch]):
            self._pending.add((model, device))
            return
        self._pending.discard((model, device))
        dev = self.c.perf.device
        forks = [i for i in self.c.core.registry.models[model].instances.values() if i.state is S.ACTIVE]
        link = dev.d2d_bw if forks and self.mode != "prism" else dev.h2d_bw
        load_s = self.p.control_overhead_s + self.c.perf.load_s(arch, link)
        self.c.place(model, [device], now, load_s)

    def _hand_over(self, model: str, device: int, now: float) -> None:
        """An instance of a model changing pools: it serves until the model has an Active
        instance in its new pool, then goes (make before break: stopped at once, a model
        whose new instance waits for a device or for memory had none at all, and its
        requests failed after the 30 s hold)."""
        self._handover.setdefault(model, set()).add(device)
        self._finish_handovers(now)

    def _finish_handovers(self, now: float) -> None:
        for model in sorted(self._handover):
            devs = self._handover[model]
            insts = self.c.core.registry.models[model].instances.values()
            if any(i.state is S.ACTIVE and i.device not in devs for i in insts):
                for d in sorted(devs):
                    self._stop(model, d, now)
                del self._handover[model]

    def _retry_pending(self, now: float) -> None:
        for model, device in sorted(self._pending, key=lambda k: (k[1], k[0])):
            wanted = device in self.st.elastic.get(model, ()) or any(
                a.device == device and a.key.split("#")[0] == model for a in self.st.steady.values())
            if not wanted:
                self._pending.discard((model, device))
            else:
                self._start(model, device, now)

    def _planned(self) -> dict[str, set[int]]:
        """Per model, the devices some plan wants it on now: the steady assignments, the
        elastic workers, and instances handing over to a new pool."""
        want: dict[str, set[int]] = {}
        for a in self.st.steady.values():
            want.setdefault(a.key.split("#")[0], set()).add(a.device)
        for m, devs in self.st.elastic.items():
            want.setdefault(m, set()).update(devs)
        for m, devs in self._handover.items():
            want.setdefault(m, set()).update(devs)
        return want

    def _reconcile(self, now: float) -> None:
        """Stop the instances no plan wants. A Loading one goes at once; an Active one once
        every instance its model's plans want is Active (make before break: the source of a
        migration serves until its target does, however the plan changed meanwhile), or at
        once when the plans want the model nowhere. Before this the moves themselves
        stopped what they replaced, and a move that lost track (a migration target that
        waited for memory while the plan changed, a move onto a device where the model
        already served) left an instance serving unplanned for the rest of the run: 37 in
        the 62-app day, holding KV pages and step time the placement had given to others
        (bench/RESULTS.md "sim, fifth pass")."""
        want = self._planned()
        models = self.c.core.registry.models
        ready: dict[str, bool] = {}
        for inst in list(self.c.core.registry.instances.values()):
            m = inst.model
            if (inst.state is not S.ACTIVE and inst.state is not S.LOADING) or inst.device in want.get(m, ()):
                continue
            if inst.state is S.ACTIVE:
                ok = ready.get(m)
                if ok is None:
                    insts = models[m].instances
                    ok = ready[m] = all((i := insts.get(d)) is not None and i.state is S.ACTIVE
                                        for d in want.get(m, ()))
                if not ok:
                    continue
            self._stop(m, inst.device, now)

    # ----------------------------------------------------------- keep-alive
    def _awake(self, app: str) -> bool:
        return self.keep.resting(app) is None and app not in self._waking

    def _rest(self, model: str, now: float) -> None:
        """Keep-alive sent `model` Warm or Cold: every instance goes, and the plans forget it."""
        m = self.c.core.registry.models[model]
        held = sorted(i.device for i in m.instances.values() if holds_device_memory(i.state))
        for key in [k for k, a in self.st.steady.items() if k.split("#")[0] == model]:
            self._stop(model, self.st.steady.pop(key).device, now)
        for d in self.st.elastic.pop(model, []):
            self._stop(model, d, now)
        for d in sorted(self._handover.pop(model, set())):
            self._stop(model, d, now)
        for key in [k for k in self._pending if k[0] == model]:
            self._pending.discard(key)
        for d in held:
            self._stop(model, d, now)
        if held:  # (Warm -> Cold held nothing: where it rested stays known)
            self._rested_on[model] = held

    def _wake(self, model: str, now: float) -> None:
        """A request for a resting model: restore it where it rested when its weights fit
        there beside what that device holds now (the daemon restores the Warm instance in
        place), else on a free device (or wait for one, retried every fast tick); it joins
        the steady plan where it woke."""
        if model not in self._waking:
            self._waking[model] = self.keep.wake(model, now)
        arch = self.c.served[model].arch
        elastic = {d for devs in self.st.elastic.values() for d in devs}
        home = [d for d in self._rested_on.get(model, []) if d not in elastic and d not in self.c._draining
                and self.c.perf.weights_fit([*(a for n, a in self.c.residents(d).items() if n != model), arch])]
        steady_devs = {a.device for a in self.st.steady.values()}
        free = home or self._free_devices(steady_devs | set(self.c._draining))
        if not free:
            return
        self._rested_on.pop(model, None)
        d = free[0]
        self.c.place(model, [d], now, self.p.control_overhead_s + self._waking.pop(model))
        self.st.steady[model] = Assignment(key=model, device=d)

    def _stop(self, model: str, device: int, now: float) -> None:
        inst = self.c.core.registry.models[model].instances.get(device)
        if inst is None:
            return
        if inst.state is S.ACTIVE:
            self.c.drain(model, device, now)
        elif inst.state is S.LOADING:
            self.c.set_state(model, device, S.UNLOADED, now)
