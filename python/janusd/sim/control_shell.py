"""The controller's simulator shell: the daemon's control room (control/room.py) on virtual
time, its Ops carried out as moves that take the time their bytes need.

Every decision is the room's, as in the daemon (server/controller.py): at each fast period
(0.5 s) and slow period (30 s) the shell reads the core into the room's snapshot
(control/observe.py, the same function the daemon calls), asks the room for that tick's
plan, and carries each Op out on the simulated cluster, then tells the room how it ended:
- to Active: a fork from the Op's source over D2D (hw/ d2d_bw; `prism` loads every move
  over H2D instead), a Warm or Cold instance restored in place by the path
  lifecycle/restore_path.py chooses (H2D from the host copy; the checkpoint read for a
  Cold one), an Unloaded one loaded over H2D (every model is assumed to have a host
  copy), each after `control_overhead_s`. An instance whose weights do not fit beside
  what its device holds fails, as the daemon's worker answers out of memory;
- to Warm or Cold: the instance drains (its requests finish), then rests;
- a migration's second half runs once the first half is Active.
A request for a model with no Active instance wakes one by control/wake.py's rule, as
the daemon's lifecycle_ops.wake does; its requests are held meanwhile by the core.
The models start where control/start.py packs them (the daemon's start placement); a
tp > 1 model first, on an aligned free group of its own (control/start.py start_groups).
An Op's device is a group's lead: the instance takes lead .. lead + tp - 1 (the model's
tp); an activation onto a group whose devices an instance of another shape holds fails
(Cluster.blocked), as one that does not fit does, and is planned again.

Modes (sim/policies.py): janus (both pools), steady-only (every app pinned steady),
elastic-only (every app pinned elastic), prism (steady-only with every move loaded over
H2D, no fork), blitzscale (every app elastic, each scaled to its own m* first come first
served by app name until the pool runs out: control/baselines.py)."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from janusd.config import ControlConfig
from janusd.control.observe import observe
from janusd.control.ops import Activate, Op, Rest, group
from janusd.control.room import ControlRoom
from janusd.control.start import pack_start, start_groups
from janusd.control.wake import regroup, wake_op
from janusd.lifecycle.restore_path import Bandwidths
from janusd.lifecycle.states import COMING_UP, InstanceState
from janusd.policy.policy_config import ControllerConfig
from janusd.policy.demand import SteadyModel
from janusd.policy.start_placement import NO_LOAD
from janusd.sim.cluster import Cluster
from janusd.sim.configured import start_states
from janusd.sim.oracle_error import MisjudgingOracle
from janusd.sim.served import Served
from janusd.sim.sim_oracle import ControllerError, build_oracle

S = InstanceState
MODES = ("janus", "steady-only", "elastic-only", "prism", "blitzscale")
_PINS = {"steady-only": "steady", "prism": "steady", "elastic-only": "elastic", "blitzscale": "elastic"}


@dataclass(frozen=True)
class Periods:
    fast_s: float = 0.5
    slow_s: float = 30.0
    traffic_window_s: int = 60  # classify's long window, in 1 s buckets
    control_overhead_s: float = 0.5  # a lifecycle move's fixed cost (detect, prepare, switch)


def control_config(cfg: ControllerConfig, periods: Periods) -> ControlConfig:
    """The daemon's [control] section for the simulated pool: managed, the simulator's
    periods and window, the policies' own settings."""
    return ControlConfig(managed=True, fast_period_s=periods.fast_s, slow_period_s=periods.slow_s,
                         window_s=float(periods.traffic_window_s), demand=cfg.demand, placement=cfg.placement,
                         scaling=cfg.scaling, classify=cfg.classify, keepalive=cfg.keepalive)


class SimControl:
    """The room, its ticks and its Ops' moves on one simulated cluster (module doc)."""

    def __init__(self, cluster: Cluster, served: list[Served], mode: str = "janus",
                 cfg: ControllerConfig = ControllerConfig(), periods: Periods = Periods(),
                 oracle_error: float = 0.0, oracle_seed: int = 0, control: ControlConfig | None = None,
                 plans: bool = True) -> None:
        """`oracle_error`: the room's oracle misjudges each model's load by up to this
        fraction (sim/oracle_error.py); 0: the simulator's own performance model, exactly.
        `control`: a daemon's [control] section (`janus sim --config`: its periods, window
        and policies instead of `cfg` and `periods`); `plans` False: no ticks (an unmanaged
        daemon: the models stay where they start, requests still wake resting ones)."""
        if mode not in MODES:
            raise ControllerError(f"unknown controller mode {mode!r} (known: {', '.join(MODES)})")
        self.c = cluster
        self.mode = mode
        self.p = periods
        self.oracle = build_oracle(served, cluster)
        if oracle_error > 0.0:
            self.oracle = MisjudgingOracle(self.oracle, [x.name for x in served], oracle_error, oracle_seed)
        if control is not None:
            self.p = Periods(fast_s=control.fast_period_s, slow_s=control.slow_period_s,
                             traffic_window_s=int(control.window_s), control_overhead_s=periods.control_overhead_s)
        self.plans = plans
        ctl_cfg = control if control is not None else control_config(cfg, periods)
        self.room = ControlRoom(ctl_cfg, "first_come" if mode == "blitzscale" else "global")
        pin = _PINS.get(mode)
        if pin is not None:
            for m in cluster.core.models().values():
                m.cfg = msgspec.structs.replace(m.cfg, pool=pin)
        dev = cluster.perf.device
        self.bw = Bandwidths(memcpy=dev.h2d_bw, measured={"d2d": dev.d2d_bw, "h2d": dev.h2d_bw})
        self.waking: set[tuple[str, int]] = set()  # instances a request is bringing up
        self.counts = {"rested": 0, "woken": 0, "failed_ops": 0}
        self.ops: list[tuple[float, Op]] = []  # every Op the room issued, in order (tests)
        cluster.on_arrival = self._arrival
        cluster.figures = lambda: {"decisions": self.room.decisions, **self.counts}

    def snapshot(self, now: float):  # type: ignore[no-untyped-def]
        return observe(self.c.core, now, self.c.n_devices, self.oracle)

    # ------------------------------------------------------------------ ticks
    def start(self) -> None:
        self.c.at(0.0, self._first)

    def _first(self, now: float) -> None:
        models = self.c.core.models()
        names = sorted(n for n, m in models.items() if not m.cfg.devices)
        out: dict[str, list[int]] = {}
        ctl = self.room.cfg
        pins = [SteadyModel(model=n, load=NO_LOAD, devices=tuple(m.cfg.devices)) for n, m in models.items()
                if m.cfg.devices]
        pool = tuple(range(self.c.n_devices))
        tps = {n: self.c.served[n].arch.tp for n in names}
        leads, lines = start_groups(tps, pool, {d for m in pins for d in m.devices})
        missing = sorted(n for n, t in tps.items() if t > 1 and n not in leads)
        if missing:  # nothing would ever bring it up (no instance rests anywhere to wake)
            raise ControllerError("; ".join(ln for ln in lines if "no free" in ln)
                                  + f" (pool of {self.c.n_devices} devices)")
        out.update({n: [d] for n, d in leads.items()})
        names1 = [n for n in names if tps[n] == 1]
        if names1:
            held = {x for n, d in leads.items() for x in group(d, tps[n])}
            pack_start(names1, pins, tuple(d for d in pool if d not in held), self.oracle, ctl.demand, ctl.placement,
                       [], out)
            left = [n for n in names1 if not out.get(n)]
            if held and left:
                raise ControllerError(f"{', '.join(left)}: no device left beside the tp groups {sorted(leads.items())} "
                                      f"(pool of {self.c.n_devices} devices)")
        for name in names:
            for d in out.get(name, []):
                self._load(name, d, now, S.LOADING, None)
        for m in pins:  # a pinned model starts as the daemon starts it (sim/configured.py)
            for d, state in start_states(models[m.model].cfg):
                rest = None if state == "active" else Rest(model=m.model, device=d, reason="start", target=state)
                self._load(m.model, d, now, S.LOADING, None if rest is None else
                           (lambda t, ok, r=rest: self._down(r, t, lambda *_: None)))
        if self.plans:
            self._fast(now)
            self.c.at(now + self.p.slow_s, self._slow)

    def _fast(self, now: float) -> None:
        self._carry_all(self.room.plan_fast(self.snapshot(now), now), now)
        if self.c.busy:
            self.c.at(now + self.p.fast_s, self._fast)

    def _slow(self, now: float) -> None:
        self._carry_all(self.room.plan_slow(self.snapshot(now), now), now)
        if self.c.busy:
            self.c.at(now + self.p.slow_s, self._slow)

    def _arrival(self, row: int, now: float) -> None:
        name = self.c.req_model[int(self.c.request_model[row])]
        m = self.c.core.models()[name]
        if m.view().active:  # (the view's tuple: no list made per arrival)
            return
        nbytes = self._bytes(name)
        busy = {d for (n, d) in self.waking if n == name} | {d for (n, d) in self.room.in_flight if n == name}
        op = wake_op(name, m.instances, m.pd, lambda st: self.bw.restore_s(st.value, nbytes), busy)
        if op is not None and self.c.blocked(name, op.device) is not None:
            op = regroup(op, self.c.served[name].arch.tp, self.c.n_devices, self.c.holding, busy)
        if op is not None:
            self.counts["woken"] += 1
            self.waking.add((name, op.device))
            self._up(op, now, lambda t, ok: self.waking.discard((name, op.device)))

    # -------------------------------------------------------------- execution
    def _bytes(self, model: str) -> int:
        arch = self.c.served[model].arch
        return int(arch.weight_bytes / arch.tp)

    def _carry_all(self, ops: list[Op], now: float) -> None:
        for op in ops:
            self.ops.append((now, op))
            if op.reason.startswith("keep-alive") and self.c.core.instance(op.model, op.device).state is S.ACTIVE:
                self.counts["rested"] += 1  # Active -> Warm or Cold (a Warm one going Cold rested already)
            self._carry(op, now)

    def _carry(self, op: Op, now: float) -> None:
        def done(t: float, outcome: str) -> None:
            if outcome != "ok":
                self.counts["failed_ops"] += 1
            self._carry_all(self.room.finished(op, outcome, t, self.snapshot(t)), t)

        def then(t: float, outcome: str) -> None:
            nxt = op.then if isinstance(op, Activate) else None
            if outcome != "ok" or nxt is None or self.c.core.instance(nxt.model, nxt.device).state is not S.ACTIVE:
                done(t, outcome)
            else:
                self._down(nxt, t, lambda t2, out2: done(t2, out2))

        if op.target == "active":
            self._up(op, now, lambda t, ok: then(t, ok))
        else:
            self._down(op, now, lambda t, ok: done(t, ok))

    def _up(self, op: Op, now: float, done) -> None:  # type: ignore[no-untyped-def]
        """Bring an instance to Active (module doc); done(t, outcome) when it got there or failed."""
        inst = self.c.core.instance(op.model, op.device)
        if inst.state is S.ACTIVE:
            return done(now, "ok")
        if inst.state in COMING_UP or inst.state is S.DRAINING:
            return done(now, f"ValueError: {op.model} on device {op.device} is {inst.state.value}")
        arch = self.c.served[op.model].arch
        held = [a for n, a in self.c.residents(op.device).items() if n != op.model]
        if not self.c.perf.weights_fit([*held, arch]):
            return done(now, f"WorkerError: {op.model} does not fit on device {op.device} beside {len(held)} model(s)")
        taken = self.c.blocked(op.model, op.device)
        if taken is not None:
            return done(now, f"WorkerError: {op.model} (tp {arch.tp}) on device {op.device}: device {taken} is held "
                        "by an instance of another group")
        dev, nbytes = self.c.perf.device, self._bytes(op.model)
        if isinstance(op, Activate) and op.source is not None:
            via = S.FORKING
            load_s = self.c.perf.load_s(arch, dev.h2d_bw if self.mode == "prism" else dev.d2d_bw)
        elif inst.state in (S.WARM, S.COLD):
            via = S.RESTORING
            load_s = self.bw.restore_s(inst.state.value, nbytes)
        else:
            via, load_s = S.LOADING, self.c.perf.load_s(arch, dev.h2d_bw)
        self._load(op.model, op.device, now, via, done, load_s)

    def _load(self, model: str, device: int, now: float, via: InstanceState, done, load_s: float | None = None):  # type: ignore[no-untyped-def]
        if load_s is None:
            load_s = self.c.perf.load_s(self.c.served[model].arch, self.c.perf.device.h2d_bw)

        def up(t: float) -> None:
            if done is not None:
                st = self.c.core.instance(model, device).state
                done(t, "ok" if st is S.ACTIVE else f"ValueError: {model} on device {device} is {st.value}")

        devices = list(group(device, self.c.served[model].arch.tp))
        self.c.place(model, devices, now, self.p.control_overhead_s + load_s, via=via, on_done=up)

    def _down(self, op: Op, now: float, done) -> None:  # type: ignore[no-untyped-def]
        """Drain an instance to Warm or Cold; done(t, outcome) once it rests."""
        inst = self.c.core.instance(op.model, op.device)
        to = S.WARM if op.target == "warm" else S.COLD
        if inst.state is S.ACTIVE:
            return self.c.drain(op.model, op.device, now, to, lambda t: done(t, "ok"))
        if inst.state is S.WARM and to is S.COLD:
            self.c.set_state(op.model, op.device, S.COLD, now)
            return done(now, "ok")
        if inst.state is to:
            return done(now, "ok")
        return done(now, f"ValueError: {op.model} on device {op.device} is {inst.state.value}: cannot go {op.target}")
