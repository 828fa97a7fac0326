"""The steady placement executed (server/steady.py through server/controller.py): the
real ServingCore with fake workers and a hand clock (tests/core_fakes.py), a fixed
CapacityPredictor behind oracle/types.py's Protocol, and a host whose set_state / fork
move the core's states as the lifecycle would (fakes at the edge only).

Checked: a consolidation is executed as a fork to the target, then a drain of the
source (make before break: both serve in between); a new instance forks from a live
replica, else loads; the migration budget bounds the optional moves per plan; a failed
move leaves the source serving and is planned again; at most
max_transfers_per_device moves run on a device at once; pinned models never move; the
elastic budget is what the steady pool leaves."""

from __future__ import annotations

import asyncio
from typing import Any

from janusd.config import ControlConfig, DevicesConfig, JanusConfig, ModelConfig
from janusd.lifecycle.states import InstanceState
from janusd.oracle.types import LoadFeatures, ResourceEstimate
from janusd.policy.policy_config import PlacementConfig
from janusd.server.controller import Controller
from janusd.control.steady_snapshot import placement_snapshot

from core_fakes import Rig
from test_controller import PerTwoRps

S = InstanceState


class FixedCapacity(PerTwoRps):
    """Each model's capacity vector from a table (std 0): fixed, or for the models in
    `per_rps`, hbm fixed and compute and bandwidth times the request rate."""

    def __init__(self, vectors: dict[str, tuple[float, float, float]]) -> None:
        self.vectors = vectors
        self.per_rps: set[str] = set()

    def capacity(self, model: str, load: LoadFeatures) -> ResourceEstimate:
        if model not in self.vectors:
            raise KeyError(f"no prior for {model!r}")
        h, c, b = self.vectors[model]
        if model in self.per_rps:
            c, b = c * load.request_rate, b * load.request_rate
        return ResourceEstimate(mean=(h, c, b), std=(0.0, 0.0, 0.0), source="table")


class Host:
    """set_state / fork as the lifecycle does them, on the core; every call records the
    serving devices of its model at that moment (make before break is checked on it)."""

    def __init__(self, rig: Rig, control: ControlConfig, vectors: dict[str, tuple[float, float, float]]) -> None:
        self.core = rig.core
        self.rig = rig
        self._cfg = JanusConfig(devices=DevicesConfig(count=len(rig.workers)), control=control)
        self.pred = FixedCapacity(vectors)
        self.calls: list[tuple[str, str, int, int | None, list[int]]] = []
        self.fail: set[tuple[str, int]] = set()
        self.gate: asyncio.Event | None = None  # when set, activations wait for it

    @property
    def cfg(self) -> JanusConfig:
        return self._cfg

    def predictor(self) -> Any:
        return self.pred

    def _serving(self, name: str) -> list[int]:
        return sorted(d for d, i in self.core.registry.models[name].instances.items() if i.state is S.ACTIVE)

    async def _up(self, name: str, device: int, coming: InstanceState) -> None:
        inst = self.core.instance(name, device)
        self.core.set_state(inst, coming, self.rig.now)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        if (name, device) in self.fail:
            self.core.set_state(inst, S.UNLOADED, self.rig.now, error="out of device memory")
            raise ValueError(f"{name} on device {device} could not become active (out of device memory)")
        self.core.loaded(inst, self.rig.now, 2048, 0.01)

    async def fork(self, name: str, src: int, dst: int) -> dict[str, Any]:
        self.calls.append(("fork", name, dst, src, self._serving(name)))
        await self._up(name, dst, S.FORKING)
        return {"state": "active", "path": "d2d", "source_device": src, "total_s": 0.01}

    async def set_state(self, name: str, device: int, target: str, probe: bool = True,
                        role: str | None = None) -> dict[str, Any]:
        self.calls.append((target, name, device, None, self._serving(name)))
        inst = self.core.instance(name, device)
        if target == "active":
            if inst.state is S.UNLOADED:
                self.core.set_state(inst, S.LOADING, self.rig.now)
                await asyncio.sleep(0)
                self.core.loaded(inst, self.rig.now, 2048, 0.01)
            else:
                await self._up(name, device, S.RESTORING)
            return {"state": "active", "path": "checkpoint" if inst.state is S.ACTIVE else "h2d"}
        if inst.state is not S.WARM:  # Warm -> Cold drops the host copy, nothing to drain
            self.core.set_state(inst, S.DRAINING, self.rig.now)
            await asyncio.sleep(0)
        self.core.set_state(inst, S.WARM if target == "warm" else S.COLD, self.rig.now)
        return {"state": target, "total_s": 0.0}


def managed(rig: Rig, name: str, *active_on: int) -> None:
    """A model without `devices` (the controller places it), Active where given."""
    rig.core.add_model(ModelConfig(name=name, checkpoint="demo:llama-tiny", pool="steady"))
    for d in active_on:
        rig.activate(name, d)


def slow_tick(ctl: Controller, rig: Rig) -> None:
    """One slow tick and every move it starts, to the end."""

    async def go() -> None:
        ctl.start(ctl.plan_slow(rig.now))
        while ctl._tasks:
            await asyncio.gather(*list(ctl._tasks))

    asyncio.run(go())


def serving(rig: Rig, name: str) -> list[int]:
    return sorted(d for d, i in rig.core.registry.models[name].instances.items() if i.state is S.ACTIVE)


def test_consolidation_forks_the_target_then_drains_the_source():
    rig = Rig(devices=4)
    managed(rig, "a", 0)
    managed(rig, "b", 1)
    host = Host(rig, ControlConfig(managed=True), {"a": (0.3, 0.2, 0.2), "b": (0.3, 0.3, 0.1)})
    ctl = Controller(host, clock=lambda: rig.now)
    slow_tick(ctl, rig)
    p = ctl.room.steady.plan
    assert p is not None and p.bins_used == 1 and len(p.moves) == 1
    mv = p.moves[0]
    assert mv.kind == "migrate" and not mv.forced and {mv.src, mv.dst} == {0, 1}
    # the fork came first, from the source, while the source served; the drain after it,
    # while both served (make before break)
    assert host.calls == [("fork", mv.model, mv.dst, mv.src, [mv.src]), ("cold", mv.model, mv.src, None, [0, 1])]
    assert serving(rig, "a") == [mv.dst] and serving(rig, "b") == [mv.dst]
    assert rig.core.instance(mv.model, mv.src).state is S.COLD
    done = ctl.view(rig.now)["steady"]["recent"]
    assert done[0]["outcome"] == "ok" and done[0]["up"]["path"] == "d2d" and done[0]["kind"] == "migrate"
    assert ctl.room.in_flight == {}
    slow_tick(ctl, rig)  # settled: the next plan has nothing to do
    assert ctl.room.steady.plan.moves == () and len(host.calls) == 2


def test_a_new_replica_forks_from_a_live_one_and_a_lone_model_loads():
    """A model whose load grows past one device gets a second instance, by a D2D fork from
    the live one; a model with nothing serving (keep-alive sent it Warm) is not placed."""
    rig = Rig(devices=3)
    managed(rig, "big", 0)
    managed(rig, "resting")
    host = Host(rig, ControlConfig(managed=True), {"big": (0.5, 0.35, 0.1), "resting": (0.5, 0.1, 0.1)})
    host.pred.per_rps.add("big")
    ctl = Controller(host, clock=lambda: rig.now)
    for _ in range(2):
        rig.submit("big", max_tokens=2)
    slow_tick(ctl, rig)  # 2 rps: compute 0.7, fits one device
    assert host.calls == [] and ctl.room.steady.plan.bins_used == 1
    for _ in range(2):
        rig.submit("big", max_tokens=2)
    slow_tick(ctl, rig)  # 4 rps: compute 1.4, two replicas at 2 rps each
    assert [c[:4] for c in host.calls] == [("fork", "big", 1, 0)]
    assert serving(rig, "big") == [0, 1] and serving(rig, "resting") == []
    assert sorted(a.key for a in ctl.room.steady.plan.assignment) == ["big", "big#1"]


def test_the_migration_budget_bounds_optional_moves_per_plan():
    rig = Rig(devices=4)
    for k in range(4):
        managed(rig, f"m{k}", k)
    vec = {f"m{k}": (0.2, 0.2, 0.2) for k in range(4)}  # all fit one device: 3 migrations wanted
    host = Host(rig, ControlConfig(managed=True, placement=PlacementConfig(migration_budget=1)), vec)
    ctl = Controller(host, clock=lambda: rig.now)
    used = []
    for _ in range(4):
        slow_tick(ctl, rig)
        p = ctl.room.steady.plan
        assert p is not None and p.migrations <= 1
        assert sum(1 for m in p.moves if m.kind == "migrate" and not m.forced) <= 1
        used.append(len({d for k in range(4) for d in serving(rig, f"m{k}")}))
    assert used == [3, 2, 1, 1]


def test_a_failed_move_leaves_the_source_serving_and_is_planned_again():
    rig = Rig(devices=2)
    managed(rig, "a", 0)
    managed(rig, "b", 1)
    host = Host(rig, ControlConfig(managed=True), {"a": (0.3, 0.2, 0.2), "b": (0.3, 0.3, 0.1)})
    host.fail |= {("a", 1), ("b", 0)}
    ctl = Controller(host, clock=lambda: rig.now)
    slow_tick(ctl, rig)
    v = ctl.view(rig.now)["steady"]
    assert v["recent"][0]["outcome"].startswith("ValueError") and v["failed_plans"] == 1
    # never half done: the source still serves, no drain was sent
    assert serving(rig, "a") == [0] and serving(rig, "b") == [1]
    assert [c[0] for c in host.calls] == ["fork"] and not ctl.room.steady.busy and ctl.room.in_flight == {}
    host.fail.clear()
    slow_tick(ctl, rig)  # the next period plans the move again, and it goes through
    assert serving(rig, "a") == serving(rig, "b") and [c[0] for c in host.calls] == ["fork", "fork", "cold"]


def test_transfers_per_device_are_bounded():
    """Three models packed onto one device: two migrations into the same target. With
    one transfer per device the second waits for the first; with two, both run at once."""
    for limit in (1, 2):
        rig = Rig(devices=3)
        for k, n in enumerate("abc"):
            managed(rig, n, k)
        host = Host(rig, ControlConfig(managed=True, max_transfers_per_device=limit),
                    {n: (0.3, 0.3, 0.3) for n in "abc"})
        ctl = Controller(host, clock=lambda: rig.now)
        peak = 0

        async def go() -> None:
            nonlocal peak
            host.gate = asyncio.Event()  # activations wait here while we look
            ctl.start(ctl.plan_slow(rig.now))
            for _ in range(10):
                await asyncio.sleep(0)
            dst = {m.dst for m in ctl.room.steady.plan.moves}
            assert len(dst) == 1 and [m.kind for m in ctl.room.steady.plan.moves] == ["migrate", "migrate"]
            peak = ctl.room.steady.transfers[dst.pop()]
            host.gate.set()
            while ctl._tasks:
                await asyncio.gather(*list(ctl._tasks))

        asyncio.run(go())
        assert peak == limit
        assert len({d for n in "abc" for d in serving(rig, n)}) == 1
        assert [r["outcome"] for r in ctl.view(rig.now)["steady"]["recent"]] == ["ok", "ok"]


def test_pinned_models_never_move_and_count_on_their_device():
    rig = Rig(devices=3)
    rig.model("pinned", [2], pool="steady")
    rig.activate("pinned", 2)
    managed(rig, "a", 0)
    managed(rig, "b", 1)
    host = Host(rig, ControlConfig(managed=True),
                {"pinned": (0.5, 0.5, 0.5), "a": (0.3, 0.3, 0.3), "b": (0.3, 0.3, 0.3)})
    ctl = Controller(host, clock=lambda: rig.now)
    slow_tick(ctl, rig)
    assert host.calls and all(c[1] != "pinned" for c in host.calls)
    assert serving(rig, "pinned") == [2]
    p = ctl.room.steady.plan
    assert p is not None and p.bins_used == 2 and 2 in {d.device for d in p.devices}
    # the pinned vector counts: device 2 never holds more than one of a and b besides it
    assert all(max(d.load) <= 1.0 + 1e-9 for d in p.devices)


def test_a_model_the_oracle_cannot_size_stays_where_it_is():
    rig = Rig(devices=2)
    managed(rig, "a", 0)
    managed(rig, "unknown", 1)
    host = Host(rig, ControlConfig(managed=True), {"a": (0.3, 0.3, 0.3)})
    ctl = Controller(host, clock=lambda: rig.now)
    snap, notes = placement_snapshot(ctl.snapshot(rig.now), host.cfg.control.demand, [], {})
    assert [(i.key, i.pinned_device) for i in snap.items] == [("a", None), ("unknown@1", 1)]
    assert notes and "unknown" in notes[0]
    slow_tick(ctl, rig)
    assert serving(rig, "unknown") == [1]


def test_the_elastic_budget_is_what_the_steady_pool_leaves():
    """An elastic model pinned to devices 0-3 with m* = 4; a managed steady model serves
    on device 3 (placement keeps it there): the elastic budget is 3, not 4, and the
    elastic model's instance on device 3 is the first to go."""
    rig = Rig(devices=4)
    rig.model("hot", [0, 1, 2, 3], pool="elastic")
    for d in range(4):
        rig.activate("hot", d)
    managed(rig, "s", 3)
    host = Host(rig, ControlConfig(managed=True), {"s": (0.3, 0.3, 0.3), "hot": (0.2, 0.2, 0.2)})
    ctl = Controller(host, clock=lambda: rig.now)
    slow_tick(ctl, rig)
    assert ctl.room.steady.managed_devices() == {3}
    for _ in range(8):  # 8 requests now: 8 rps -> m* = 4
        rig.submit("hot", max_tokens=2)
    ops = ctl.plan_fast(rig.now)
    sp = ctl.room.last_scaling
    assert sp is not None and sp.budget == 3 and sp.apps[0].demand == 4 and sp.apps[0].count == 3
    assert [(o.device, o.target) for o in ops] == [(3, "warm")]


def test_config_pool_devices_and_placement_section():
    import pytest

    from janusd.config import ConfigError, parse_config

    cfg = parse_config("[devices]\ncount = 4\n[control]\nmanaged = true\npool_devices = [1, 2]\n"
                       "max_transfers_per_device = 2\n[control.placement]\nmigration_budget = 3\n")
    assert cfg.control.pool_devices == [1, 2] and cfg.control.max_transfers_per_device == 2
    assert cfg.control.placement.migration_budget == 3
    with pytest.raises(ConfigError, match=r"control.pool_devices: device 4 does not exist"):
        parse_config("[devices]\ncount = 4\n[control]\npool_devices = [4]\n")
    with pytest.raises(ConfigError, match="max_transfers_per_device"):
        parse_config("[control]\nmax_transfers_per_device = 0\n")
    with pytest.raises(ConfigError, match="migration_budgt"):
        parse_config("[control.placement]\nmigration_budgt = 3\n")


def test_ctl_plan_prints_the_steady_placement(capsys):
    """`janus ctl plan` (tables): device vectors and Phi, the moves with their reasons and
    timings, next to the elastic and keep-alive tables."""
    from janusd import ctl_cli

    rig = Rig(devices=2)
    managed(rig, "a", 0)
    managed(rig, "b", 1)
    host = Host(rig, ControlConfig(managed=True), {"a": (0.3, 0.2, 0.2), "b": (0.3, 0.3, 0.1)})
    ctl = Controller(host, clock=lambda: rig.now)
    slow_tick(ctl, rig)
    view = ctl.view(rig.now)
    st = view["steady"]
    assert st["bins_used"] == 1 and st["phi"] >= 0.0 and len(st["devices"]) == 1
    assert st["devices"][0]["load"] == [0.6, 0.5, 0.3] and sorted(st["devices"][0]["items"]) == ["a", "b"]
    assert st["moves"][0]["reason"] and st["recent"][0]["seconds"] >= 0.0
    ctl_cli._print("plan", {"plan": view})
    out = capsys.readouterr().out
    for title in ("steady placement", "steady devices", "steady moves (last plan)", "steady moves done", "elastic"):
        assert title in out
    assert "migrate" in out


def _extras_rig(devices: int = 4):
    """`hot` pinned elastic with its steady instance on device 0 beside `s` (placed, steady),
    the other devices free; `fast()` runs one fast tick and its operations."""
    rig = Rig(devices=devices)
    rig.core.add_model(ModelConfig(name="hot", checkpoint="demo:llama-tiny", pool="elastic"))
    rig.activate("hot", 0)
    managed(rig, "s", 0)
    host = Host(rig, ControlConfig(managed=True), {"hot": (0.3, 0.3, 0.3), "s": (0.3, 0.3, 0.3)})
    ctl = Controller(host, clock=lambda: rig.now)

    def fast() -> list:
        async def go() -> list:
            ops = ctl.plan_fast(rig.now)
            ctl.start(ops)
            await asyncio.gather(*ctl._tasks)
            return ops
        return asyncio.run(go())

    return rig, host, ctl, fast


def test_a_placed_elastic_model_gets_replicas_of_its_own_and_hands_its_steady_instance_over():
    """A model without `devices` in the elastic pool is isolated (PAPER.md §2): m* replicas
    of its own are forked onto the devices the steady pool leaves; its steady instance
    (beside `s`) serves until one of them is Active, then drains to Cold (make before
    break); the placement never moves the replicas; when m* falls (past the hold time) they
    drain to Warm, never below one, and go Cold after keep-alive's Warm time."""
    rig, host, ctl, fast = _extras_rig()
    slow_tick(ctl, rig)
    assert ctl.room.steady.plan is not None and ctl.room.steady.plan_devices() == [0]
    for _ in range(6):  # 6 rps: m* = 3, three free devices: three replicas of its own
        rig.submit("hot", max_tokens=2)
    ops = fast()
    assert [(o.device, o.target) for o in ops] == [(1, "active"), (2, "active"), (3, "active")]
    assert [c[:4] for c in host.calls] == [("fork", "hot", d, 0) for d in (1, 2, 3)]
    assert ctl.room.extras == {"hot": {1, 2, 3}} and serving(rig, "hot") == [0, 1, 2, 3]
    assert ctl.room.last_scaling is not None and ctl.room.last_scaling.budget == 3
    for _ in range(6):
        rig.submit("hot", max_tokens=2)
    ops = fast()  # its replicas serve: the steady instance beside `s` goes
    assert [(o.device, o.target) for o in ops] == [(0, "cold")] and "handed over" in ops[0].reason
    assert serving(rig, "hot") == [1, 2, 3] and serving(rig, "s") == [0]
    n = len(host.calls)
    slow_tick(ctl, rig)  # the placement leaves the replicas alone
    assert len(host.calls) == n and ctl.room.steady.plan.moves == ()
    rig.now += 60.0  # the window empties but for new arrivals: 1 request, m* = 1 (past the hold)
    rig.submit("hot", max_tokens=2)
    fast()
    assert serving(rig, "hot") == [1] and ctl.room.extras == {"hot": {1}}
    assert {rig.core.instance("hot", d).state for d in (2, 3)} == {S.WARM}  # a scale-out again restores
    k = host.cfg.control.keepalive
    rig.now += k.cold_after_s - k.warm_after_s  # Warm as long as keep-alive keeps an idle model Warm
    rig.submit("hot", max_tokens=2)
    ops = fast()
    assert sorted((o.device, o.target) for o in ops) == [(2, "cold"), (3, "cold")]
    assert {rig.core.instance("hot", d).state for d in (2, 3)} == {S.COLD} and serving(rig, "hot") == [1]


def test_extra_replicas_go_when_their_model_leaves_the_elastic_pool():
    """Extras are shrunk by elastic scaling only and the steady snapshot leaves their
    devices out: a model that left the elastic pool (here its pin changes; the classifier's
    hysteresis does the same for `auto`) must not keep them serving in no plan."""
    import msgspec

    rig, host, ctl, fast = _extras_rig()
    slow_tick(ctl, rig)
    for _ in range(6):  # m* = 3: two extra replicas
        rig.submit("hot", max_tokens=2)
    fast()
    assert ctl.room.extras == {"hot": {1, 2, 3}} and serving(rig, "hot") == [0, 1, 2, 3]
    m = rig.core.registry.models["hot"]
    m.cfg = msgspec.structs.replace(m.cfg, pool="steady")
    for _ in range(6):  # the same traffic: only the pool changed
        rig.submit("hot", max_tokens=2)
    ops = fast()
    assert sorted((o.device, o.target) for o in ops) == [(1, "warm"), (2, "warm"), (3, "warm")]
    assert all("back in the steady pool" in o.reason for o in ops)
    assert serving(rig, "hot") == [0] and ctl.room.extras == {}
    assert ctl.room.steady.plan is not None and 0 in ctl.room.steady.plan_devices()


def test_an_extra_replica_coming_up_counts_as_one():
    """While a scale-out is in flight the next fast tick sees it: no second replica for
    the same demand, before its instance exists and while it forks, and the steady
    snapshot does not take the forking instance for a steady one."""
    rig, host, ctl, _fast = _extras_rig(devices=5)
    slow_tick(ctl, rig)
    for _ in range(6):  # m* = 3: three replicas of its own on the three free devices
        rig.submit("hot", max_tokens=2)
    host.gate = asyncio.Event()

    async def go() -> tuple[list, list, list, Any]:
        first = ctl.plan_fast(rig.now)
        ctl.start(first)
        again = ctl.plan_fast(rig.now)  # the forks have not started yet
        for _ in range(3):
            await asyncio.sleep(0)
        assert {rig.core.instance("hot", d).state for d in (1, 2, 3)} == {S.FORKING}
        forking = ctl.plan_fast(rig.now)  # they fork, waiting at the gate
        snap, _ = placement_snapshot(ctl.snapshot(rig.now), host.cfg.control.demand, ["hot"], {},
                                     extras=ctl.room.extras)
        host.gate.set()
        await asyncio.gather(*ctl._tasks)
        return first, again, forking, snap

    first, again, forking, snap = asyncio.run(go())
    assert [(o.device, o.target) for o in first] == [(1, "active"), (2, "active"), (3, "active")]  # m* = 3
    assert again == [] and forking == []
    assert [a.device for a in snap.current if a.key.startswith("hot")] == []  # the elastic pool's
    assert set(snap.elastic_devices) >= {0, 1, 2, 3}
    assert ctl.room.extras == {"hot": {1, 2, 3}} and serving(rig, "hot") == [0, 1, 2, 3]


def test_a_failed_scale_out_is_no_extra_and_is_planned_again():
    """An extra counts from the start of its scale-out; if the fork fails it is no extra
    any more (at once, not at the next tick) and the next fast tick starts it again."""
    rig, host, ctl, fast = _extras_rig()
    slow_tick(ctl, rig)
    for _ in range(6):  # m* = 3: three replicas of its own
        rig.submit("hot", max_tokens=2)
    host.fail = {("hot", 2)}
    ops = fast()
    assert [(o.device, o.target) for o in ops] == [(1, "active"), (2, "active"), (3, "active")]
    assert ctl.room.extras == {"hot": {1, 3}} and serving(rig, "hot") == [0, 1, 3]
    assert [d.outcome == "ok" for d in ctl.room.recent] == [True, False, True]
    host.fail = set()
    for _ in range(6):
        rig.submit("hot", max_tokens=2)
    ops = fast()  # again on device 2; its replicas serve, so the steady instance goes
    assert [(o.device, o.target) for o in ops] == [(2, "active"), (0, "cold")]
    assert ctl.room.extras == {"hot": {1, 2, 3}} and serving(rig, "hot") == [1, 2, 3]


def test_an_extra_coming_up_is_drained_only_once_it_is_up():
    """m* falls while an extra replica forks: the fork is not cut short and no other
    replica is drained for it; the next ticks drain it once it serves."""
    rig, host, ctl, fast = _extras_rig()
    undone: list[str] = []
    ctl.room.on_undone = undone.append
    slow_tick(ctl, rig)
    for _ in range(6):  # m* = 3: three replicas of its own
        rig.submit("hot", max_tokens=2)
    host.gate = asyncio.Event()

    async def go() -> list:
        ctl.start(ctl.plan_fast(rig.now))
        for _ in range(3):
            await asyncio.sleep(0)
        rig.now += 60.0  # the window empties but for new arrivals: 1 request, m* = 1
        rig.submit("hot", max_tokens=2)
        falls = ctl.plan_fast(rig.now) + ctl.plan_fast(rig.now)  # the debounce: two low demands
        host.gate.set()
        await asyncio.gather(*ctl._tasks)
        return falls

    assert asyncio.run(go()) == []
    assert ctl.room.extras == {"hot": {1, 2, 3}} and serving(rig, "hot") == [0, 1, 2, 3]
    ops = fast()  # m* = 1: two replicas drained, and the steady instance handed over
    assert sorted((o.device, o.target) for o in ops) == [(0, "cold"), (2, "warm"), (3, "warm")]
    assert serving(rig, "hot") == [1] and ctl.room.extras == {"hot": {1}}
    assert undone == ["hot", "hot"]  # up and down within the hold time: counted (janusd_controller_scale_outs_undone)
