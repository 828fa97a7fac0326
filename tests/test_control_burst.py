"""control/burst.py through the daemon's control shell on the real ServingCore with a fake
clock and fake workers (tests/core_fakes.py; the predictor is test_controller.py's
closed form: one instance per 2 rps). What [W] asks of the fast loop: a burst's second
instance is asked for within one fast tick of the burst being visible, a demand dip
shorter than the hold time undoes nothing, a longer one scales in to Warm once, and a
model that refuses requests asks for one more instance."""

from __future__ import annotations

import asyncio

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from janusd.config import ControlConfig
from janusd.control.burst import BurstWatch, burst_rate
from janusd.control.ops import SCALE_IN, SCALE_OUT, Activate, Rest
from janusd.lifecycle.states import InstanceState
from janusd.policy.policy_config import KeepAliveConfig, ScalingConfig
from janusd.server.controller import Controller
from janusd.telemetry.telemetry import Telemetry

from core_fakes import Rig
from test_controller import Host, _execute, _hot

S = InstanceState
TICK = 0.5


def _steady_then(rig: Rig, ctl: Controller, seconds: float, per_tick: int) -> list:
    """`per_tick` arrivals before each fast tick for `seconds`; the ops of every tick."""
    out = []
    for _ in range(int(seconds / TICK)):
        for _ in range(per_tick):
            rig.submit("hot", max_tokens=1)
        ops = ctl.plan_fast(rig.now)
        asyncio.run(_execute(ctl, ops))
        out.append(ops)
        rig.now += TICK
    return out


def _rig(hold_s: float = 20.0, window_s: float = 60.0) -> tuple[Rig, Controller, list[str]]:
    rig = Rig(devices=4)
    rig.core.telemetry = Telemetry(window_s=window_s)  # the daemon's core reads control.window_s too
    _hot(rig)
    undone: list[str] = []
    cfg = ControlConfig(managed=True, window_s=window_s, scaling=ScalingConfig(scale_in_hold_s=hold_s),
                        keepalive=KeepAliveConfig(warm_after_s=300.0, cold_after_s=3600.0))
    ctl = Controller(Host(rig, cfg), clock=lambda: rig.now)
    ctl.room.on_undone = undone.append
    return rig, ctl, undone


def test_a_bursts_second_instance_is_asked_for_at_the_first_tick_that_sees_it():
    """1 rps for 20 s (m* = 1 on the window), then 16 rps: the first tick after half a
    second of it (8 arrivals in the last second, where the mean expects 1) asks for
    instances: 8 rps, m* = 4, one per device. The window's mean alone then reads 28
    arrivals over 20 s = 1.4 rps, m* = 1: only the burst rule sees it."""
    rig, ctl, _ = _rig()
    quiet = []
    for _ in range(40):  # one arrival every other tick: 1 rps
        if int(rig.now / TICK) % 2 == 0:
            rig.submit("hot", max_tokens=1)
        quiet.append(ctl.plan_fast(rig.now))
        rig.now += TICK
    assert all(ops == [] for ops in quiet)
    assert ctl.room.demands["hot"][0] == 1
    for _ in range(8):  # the burst's first half second
        rig.submit("hot", max_tokens=1)
    ops = ctl.plan_fast(rig.now)
    assert [(o.device, o.target) for o in ops] == [(1, "active"), (2, "active"), (3, "active")]
    assert "burst: 8.0 req/s" in ctl.room.demands["hot"][1]


def test_a_dip_shorter_than_the_hold_undoes_nothing_and_a_longer_one_scales_in_to_warm_once():
    """A 5 s window, so that m* follows the traffic within seconds: 6 rps (m* = 3), a 15 s
    lull (m* = 1 after ~5 s), 6 rps again, then a lull that lasts: the count stays 3
    through the first lull and falls to 1 once m* stayed at 1 for the 20 s hold."""
    rig, ctl, undone = _rig(hold_s=20.0, window_s=5.0)
    up = _steady_then(rig, ctl, 10.0, 3)  # 6 rps: m* = 3
    assert ctl.room.burst._asked["hot"][-1][1] >= 3  # 6 rps (the telemetry's buckets read a little more)
    active = sorted(d for d, i in rig.core.registry.models["hot"].instances.items() if i.state is S.ACTIVE)
    assert len(active) >= 3  # (the window's first seconds read a higher rate: the hold keeps that too)
    dip = _steady_then(rig, ctl, 15.0, 0)
    assert ctl.room.burst._asked["hot"][-1][1] == 1, "m* fell during the lull"
    assert all(ops == [] for ops in dip), "a dip within the hold time scales nothing in"
    back = _steady_then(rig, ctl, 5.0, 3)
    assert all(ops == [] for ops in back)
    low = _steady_then(rig, ctl, 40.0, 0)
    downs = [(k * TICK, o.device, o.target) for k, ops in enumerate(low) for o in ops]
    assert sorted((d, t) for _, d, t in downs) == [(d, "warm") for d in active if d != 0], downs
    assert 20.0 <= downs[0][0] <= 20.0 + 6.0  # the hold after the last m* = 3 (the window lags ~5 s)
    assert undone == [], "no scale-out undone within the hold time"


def test_a_scale_in_within_the_hold_of_its_scale_out_is_counted():
    w = BurstWatch(hold_s=20.0)
    w.scaled_out("m", 1, 100.0)
    w.scaled_out("m", 2, 100.0)
    assert w.undone("m", 1, 110.0) is True
    assert w.undone("m", 2, 121.0) is False
    assert w.undone("m", 3, 110.0) is False  # never scaled out


def test_refusals_ask_for_one_instance_more_than_serves():
    """The predictor says 1 (1 rps), but the model refused requests since the last tick."""
    rig, ctl, _ = _rig()
    for _ in range(4):
        rig.submit("hot", max_tokens=1)
        ctl.plan_fast(rig.now)
        rig.now += 1.0
    assert ctl.room.demands["hot"][0] == 1
    w = rig.core.telemetry.model("hot", rig.now)
    snap = ctl.snapshot(rig.now)
    m = snap.models["hot"]
    refused = msgspec.structs.replace(m.window, failed=w.failed + 2)
    snap.models["hot"].__dict__["window"] = refused  # the snapshot as a refusing model shows it
    ops = ctl.room.plan_fast(snap, rig.now)
    assert [(o.device, o.target) for o in ops] == [(1, "active")]
    assert "2 request(s) refused" in ctl.room.demands["hot"][1]


@given(rate=st.floats(0.0, 50.0), extra=st.integers(0, 200))
def test_a_short_count_is_a_burst_only_beyond_three_sigmas_of_the_mean(rate: float, extra: int) -> None:
    expected = rate * 1.0
    count = int(expected) + extra
    got = burst_rate(rate, float(count), 1.0)
    beyond = count > expected + 3.0 * expected ** 0.5 + 1.0
    assert (got is not None) == beyond
    if got is not None:
        assert got == count


def test_the_undone_counter_is_on_metrics():
    from janusd.server.metrics import Metrics

    rig, ctl, _ = _rig()
    metrics = Metrics(lambda: {**rig.core.snapshot(rig.now), "workers": {}, "pools": {}})
    ctl.room.on_undone = metrics.controller_undone
    up = Activate(model="hot", device=1, reason=f"{SCALE_OUT}: m*=2")
    ctl.room.finished(up, "ok", rig.now, ctl.snapshot(rig.now))  # the scale-out ended now
    down = Rest(model="hot", device=1, reason=f"{SCALE_IN}: m*=1", target="warm")
    assert ctl.room._issue(ctl.snapshot(rig.now + 5.0), [down], rig.now + 5.0) == [down]  # within the hold
    assert 'janusd_controller_scale_outs_undone_total{model="hot"} 1.0' in metrics.render().decode()
