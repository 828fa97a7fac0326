"""server/controller.py's plans, driven by the real ServingCore with a fake clock and fake
workers (tests/core_fakes.py) and a closed-form predictor behind oracle/types.py's
Protocol (fakes at the edge only); execution against a recording host."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import msgspec
import pytest

from janusd.config import ControlConfig, DevicesConfig, JanusConfig
from janusd.lifecycle.states import InstanceState
from janusd.oracle.types import AttainmentEstimate, LoadFeatures, MinInstances, ResourceEstimate
from janusd.policy.policy_config import KeepAliveConfig, ScalingConfig
from janusd.server.controller import Controller, Op

from core_fakes import Rig

S = InstanceState


class PerTwoRps:
    """m* = ceil(request rate / 2): one instance per 2 requests per second."""

    def attainment(self, model: str, load: LoadFeatures, instances: int) -> AttainmentEstimate:
        return AttainmentEstimate(1.0 if instances * 2 >= load.request_rate else 0.5, 0.0, "test")

    def min_instances(self, model: str, load: LoadFeatures, target: float, margin: float, limit: int) -> MinInstances:
        m = max(1, math.ceil(load.request_rate / 2))
        return MinInstances(m if m <= limit else None, None, f"{load.request_rate:.1f} rps / 2")

    def capacity(self, model: str, load: LoadFeatures) -> ResourceEstimate:
        """The same machine seen as device time: one instance carries 2 rps."""
        return ResourceEstimate((0.1, load.request_rate / 2, 0.1), (0.0, 0.0, 0.0), "test")


class Host:
    def __init__(self, rig: Rig, control: ControlConfig) -> None:
        self.core = rig.core
        self._cfg = JanusConfig(control=control)
        self.rig = rig
        self.calls: list[tuple[str, int, str]] = []
        self.roles: list[tuple[str, int, str]] = []  # activations with a role: (model, device, role)

    @property
    def cfg(self) -> JanusConfig:
        return self._cfg

    def predictor(self) -> Any:
        return PerTwoRps()

    async def set_state(self, name: str, device: int, target: str, probe: bool = True,
                        role: str | None = None) -> dict[str, Any]:
        self.calls.append((name, device, target))
        inst = self.core.instance(name, device)
        now = self.rig.now
        if target == "active":
            if role is not None:
                self.roles.append((name, device, role))
                self.core.set_role(inst, role, now)
            self.core.set_state(inst, S.RESTORING, now)
            self.core.loaded(inst, now, 2048, 0.01)
        else:
            self.core.set_state(inst, S.DRAINING, now)
            self.core.set_state(inst, S.WARM if target == "warm" else S.COLD, now)
        return {"phases": {"transfer": 0.01}}


def _hot(rig: Rig, devices: int = 4, pool: str = "elastic") -> None:
    rig.model("hot", list(range(devices)), pool=pool, warm_devices=list(range(1, devices)))
    rig.activate("hot", 0)
    for d in range(1, devices):
        inst = rig.core.instance("hot", d)
        rig.core.set_state(inst, S.LOADING, rig.now)
        rig.core.set_state(inst, S.WARM, rig.now)


def _burst(rig: Rig, n: int) -> None:
    for _ in range(n):
        rig.submit("hot", max_tokens=2)


def test_a_burst_activates_warm_instances_at_once_and_never_twice():
    """The first plan of an app has nothing to debounce against: a burst scales out on
    the first fast tick (the 2 s goal); an operation in flight is not planned again."""
    rig = Rig(devices=4)
    _hot(rig)
    host = Host(rig, ControlConfig(managed=True))
    ctl = Controller(host, clock=lambda: rig.now)
    assert ctl.plan_fast(rig.now) == []  # no traffic: keep-alive's, not scaling's
    _burst(rig, 6)  # 6 requests in the first second of the window: 6 rps -> m* = 3
    ops = ctl.plan_fast(rig.now)
    assert [(o.device, o.target) for o in ops] == [(1, "active"), (2, "active")]
    assert ops[0].reason.startswith("scale out: m*=3")
    assert ctl.room.demands["hot"][0] == 3
    for o in ops:  # still in flight: not planned again
        ctl.room.in_flight[("hot", o.device)] = (o, rig.now)
    rig.now += 0.5
    assert ctl.plan_fast(rig.now) == []


def test_the_debounce_holds_a_one_tick_dip():
    rig = Rig(devices=4)
    _hot(rig)
    host = Host(rig, ControlConfig(managed=True))
    ctl = Controller(host, clock=lambda: rig.now)
    _burst(rig, 6)
    asyncio.run(_execute(ctl, ctl.plan_fast(rig.now)))
    rig.now += 2.0  # 6 arrivals over 3 s of window: 2 rps -> m* = 1, once
    assert ctl.plan_fast(rig.now) == [], "one low demand does not scale in"
    assert ctl.room.last_scaling is not None and ctl.room.last_scaling.apps[0].count == 3


def test_scale_in_drains_the_idlest_active_instance_and_keeps_one():
    rig = Rig(devices=4)
    _hot(rig)
    host = Host(rig, ControlConfig(managed=True, scaling=ScalingConfig(debounce_plans=1)))
    ctl = Controller(host, clock=lambda: rig.now)
    _burst(rig, 8)  # m* = 4
    ops = ctl.plan_fast(rig.now)
    asyncio.run(_execute(ctl, ops))
    assert sorted(host.calls) == [("hot", 1, "active"), ("hot", 2, "active"), ("hot", 3, "active")]
    rig.tick()  # the queued requests go out, spread over the four
    busy = {d: len(rig.core.requests.on_device(d)) for d in range(4)}
    # the load falls: a window of 60 s with 8 arrivals is 0.13 rps later on -> m* = 1
    rig.now += 59.0
    ops = ctl.plan_fast(rig.now)
    assert len(ops) == 3 and {o.target for o in ops} == {"warm"}
    kept = ({0, 1, 2, 3} - {o.device for o in ops}).pop()
    assert busy[kept] == max(busy.values())  # the busiest stays; the idlest drain first


async def _execute(ctl: Controller, ops: list[Op]) -> None:
    ctl.start(ops)
    await asyncio.gather(*ctl._tasks)


def test_two_elastic_models_sharing_their_devices_each_count_their_own_instances():
    """The budget of models with `devices` is their instance slots, not the devices: `a`
    and `b` share devices 0 and 1, so each may have both of its instances (4 seats). Until
    [W] the budget was the 2 devices, `a`'s base instance took one, and `b`'s burst got no
    second instance (measured on a real daemon)."""
    rig = Rig(devices=2)
    rig.model("a", [0, 1], pool="elastic", warm_devices=[1])
    rig.model("b", [0, 1], pool="elastic", warm_devices=[1])
    for name in ("a", "b"):
        rig.activate(name, 0)
        inst = rig.core.instance(name, 1)
        rig.core.set_state(inst, S.LOADING, rig.now)
        rig.core.set_state(inst, S.WARM, rig.now)
    host = Host(rig, ControlConfig(managed=True, scaling=ScalingConfig(debounce_plans=1)))
    ctl = Controller(host, clock=lambda: rig.now)
    for _ in range(8):
        rig.submit("a", max_tokens=2)
        rig.submit("b", max_tokens=2)
    ops = ctl.plan_fast(rig.now)
    plan = ctl.room.last_scaling
    assert plan is not None and plan.budget == 4 and plan.given == 4 and not plan.compressed
    assert [a.count for a in plan.apps] == [2, 2]
    assert sorted((o.model, o.device, o.target) for o in ops) == [("a", 1, "active"), ("b", 1, "active")]


def test_keepalive_sends_an_idle_elastic_model_warm_then_cold_and_leaves_steady_ones():
    rig = Rig(devices=2)
    rig.model("idle", [0], pool="elastic")
    rig.model("pinned", [1], pool="steady")
    rig.activate("idle", 0)
    rig.activate("pinned", 1)
    ka = KeepAliveConfig(warm_after_s=10.0, cold_after_s=30.0)
    host = Host(rig, ControlConfig(managed=True, keepalive=ka))
    ctl = Controller(host, clock=lambda: rig.now)
    rig.submit("idle", max_tokens=1)
    r = next(iter(rig.core.requests.by_id))
    rig.tick()
    rig.token(0, r, finished=True)
    assert ctl.plan_slow(rig.now) == []
    rig.now += 11.0
    ops = ctl.plan_slow(rig.now)
    assert [(o.model, o.device, o.target) for o in ops] == [("idle", 0, "warm")]
    asyncio.run(_execute(ctl, ops))
    rig.now += 20.0
    ops = ctl.plan_slow(rig.now)
    assert [(o.model, o.device, o.target) for o in ops] == [("idle", 0, "cold")]
    view = ctl.view(rig.now)
    assert view["recent"][0]["target"] == "warm" and view["recent"][0]["outcome"] == "ok"
    assert {k["model"] for k in view["keepalive"]} == {"idle", "pinned"}
    assert rig.core.instance("pinned", 1).state is S.ACTIVE


def test_a_failed_operation_is_recorded_and_planned_again():
    rig = Rig(devices=2)
    _hot(rig, devices=2)
    host = Host(rig, ControlConfig(managed=True, scaling=ScalingConfig(debounce_plans=1)))

    async def refuse(name: str, device: int, target: str, probe: bool = True, role: str | None = None) -> dict[str, Any]:
        raise ValueError("out of device memory")

    host.set_state = refuse  # type: ignore[method-assign]
    ctl = Controller(host, clock=lambda: rig.now)
    _burst(rig, 4)
    ops = ctl.plan_fast(rig.now)
    asyncio.run(_execute(ctl, ops))
    assert ctl.view(rig.now)["recent"][0]["outcome"] == "ValueError: out of device memory"
    assert ctl.room.in_flight == {} and ctl.plan_fast(rig.now) == ops


def test_config_managed_section_parses_and_refuses_typos():
    from janusd.config import ConfigError, parse_config

    cfg = parse_config("[control]\nmanaged = true\n[control.scaling]\ndebounce_plans = 3\n")
    assert cfg.control.managed and cfg.control.scaling.debounce_plans == 3
    with pytest.raises(ConfigError, match="debounce_plan"):
        parse_config("[control.scaling]\ndebounce_plan = 3\n")
    with pytest.raises(ConfigError):
        parse_config('[[models]]\nname = "m"\ncheckpoint = "demo:llama-tiny"\npool = "bursty"\n')
    assert msgspec.convert({}, ControlConfig).managed is False


def test_an_auto_model_goes_elastic_on_a_burst_and_is_scaled_only_then():
    """pool = "auto": a trickle (1 request every 2 s) is steady, so the controller leaves
    the model alone; a burst of 40 within a second is bursty (peak over 5 s / mean over the
    window), the model turns elastic and scales out in the same tick, sized by the burst's
    own rate (40 arrivals in the last second, far beyond the window's 4.5 rps: m* = 4, one
    per device; the window's mean alone said 3)."""
    from janusd.policy.policy_config import ClassifyConfig

    rig = Rig(devices=4)
    _hot(rig, pool="auto")
    cfg = ControlConfig(managed=True, window_s=30.0, classify=ClassifyConfig(elastic_rate=50.0, steady_rate=10.0))
    host = Host(rig, cfg)
    ctl = Controller(host, clock=lambda: rig.now)
    for _ in range(20):  # 10 s of trickle, a fast tick every 0.5 s
        if int(rig.now * 2) % 4 == 0:
            rig.submit("hot", max_tokens=1)
        assert ctl.plan_fast(rig.now) == []
        rig.now += 0.5
    assert ctl.room.last_pools[0]["pool"] == "steady"
    _burst(rig, 40)
    ops = ctl.plan_fast(rig.now)
    assert ctl.room.last_pools[0] == {"model": "hot", "pool": "elastic", "changed": True,
                                 "reason": ctl.room.last_pools[0]["reason"]}
    assert ctl.room.last_pools[0]["reason"].startswith("bursty")
    assert [(o.device, o.target) for o in ops] == [(1, "active"), (2, "active"), (3, "active")]
    assert "burst: 40.0 req/s" in ops[0].reason
    assert ctl.view(rig.now)["pools"][0]["pool"] == "elastic"


def test_absent_device_slots_are_left_out_of_the_pool_the_room_places_on():
    """A slot no Ray node offers (server/node_joins.py) has no worker: the room must not
    place there; it comes back into the pool once its node joined."""
    rig = Rig(devices=4)
    host = Host(rig, ControlConfig(managed=True))
    host._cfg = JanusConfig(control=ControlConfig(managed=True), devices=DevicesConfig(count=4))
    absent: list[int] = [1, 3]
    ctl = Controller(host, clock=lambda: rig.now, absent=lambda: absent)
    assert ctl.snapshot(rig.now).pool == (0, 2)
    absent[:] = [3]
    assert ctl.snapshot(rig.now).pool == (0, 1, 2)
    host._cfg = JanusConfig(control=ControlConfig(managed=True, pool_devices=[1, 2]), devices=DevicesConfig(count=4))
    assert ctl.snapshot(rig.now).pool == (1, 2)  # the configured pool less the absent ones
    absent[:] = []
    assert ctl.snapshot(rig.now).pool == (1, 2)
