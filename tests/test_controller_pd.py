"""server/controller.py executing an elastic P/D app's prefill / decode split (scaling.py
counts, policy/roles.py operations) on the real ServingCore with a fake clock and fake
workers; the recording host of test_controller.py applies each activation's role through
the core as lifecycle_ops does."""

from __future__ import annotations

import asyncio

import pytest

from core_fakes import Rig
from janusd.config import ControlConfig
from janusd.lifecycle.states import InstanceState
from janusd.oracle.decode_estimate import DecodeStepEstimator
from janusd.oracle.prefill_estimate import PrefillEstimator
from janusd.oracle.types import LoadFeatures
from janusd.policy.demand import prefill_share
from janusd.policy.policy_config import ScalingConfig
from janusd.control.observe import measured_prefill_share
from janusd.server.controller import Controller
from test_controller import Host, _execute

S = InstanceState


def _pd(rig: Rig, devices: int, warm: list[int], **kw) -> None:
    rig.model("pd", list(range(devices)), prefill_devices=[0], pool="elastic", warm_devices=warm, **kw)
    for d in range(devices):
        inst = rig.core.instance("pd", d)
        if d in warm:
            rig.core.set_state(inst, S.LOADING, rig.now)
            rig.core.set_state(inst, S.WARM, rig.now)
        else:
            rig.activate("pd", d)


def _roles(rig: Rig) -> dict[int, tuple[str, str]]:
    return {d: (i.role, i.state.value) for d, i in sorted(rig.core.registry.models["pd"].instances.items())}


def test_a_burst_splits_a_pd_app_and_a_resting_instance_comes_up_in_the_short_role():
    """8 requests -> m* 4; short prompts and outputs of 2 give prefill 2 of 4 by the
    estimators' priors (checked below); decode 1 is kept, Warm 2 comes up as decode (its
    own role) and Warm 3 (copied as decode) as prefill: one activation per missing
    instance, the role chosen at activation."""
    rig = Rig(devices=4)
    _pd(rig, 4, warm=[2, 3])
    host = Host(rig, ControlConfig(managed=True))
    ctl = Controller(host, clock=lambda: rig.now)
    for _ in range(8):
        rig.submit("pd", tokens=10, max_tokens=2)
    ops = ctl.plan_fast(rig.now)
    a = ctl.room.last_scaling.apps[0]
    assert (a.count, a.prefill, a.decode) == (4, 2, 2)
    assert [(o.device, o.target, o.role, o.reassign) for o in ops] == [(2, "active", "decode", False),
                                                                      (3, "active", "prefill", False)]
    asyncio.run(_execute(ctl, ops))
    assert _roles(rig) == {0: ("prefill", "active"), 1: ("decode", "active"), 2: ("decode", "active"),
                           3: ("prefill", "active")}
    core = rig.core
    assert core.dispatch.member(core.instance("pd", 3).instance_id) is not None  # a prefill instance dispatches
    assert core.dispatch.member(core.instance("pd", 2).instance_id) is None
    rig.now += 0.5
    assert ctl.plan_fast(rig.now) == []  # met: nothing more to do
    view = ctl.view(rig.now)["elastic"]["apps"][0]
    assert (view["prefill"], view["decode"]) == (2, 2)
    assert [(i["device"], i["role"]) for i in view["instances"]] == [(0, "prefill"), (1, "decode"), (2, "decode"),
                                                                     (3, "prefill")]
    assert [r["role"] for r in ctl.view(rig.now)["recent"]] == ["decode", "prefill"]


def test_an_active_surplus_instance_is_reassigned_when_none_rests():
    """Long prompts, one output token: prefill is most of the work, so of 3 instances 2
    prefill; decode 2 is surplus and nothing rests: it drains to Warm and comes back as
    prefill (one operation), while prefill 0 + decode 1 keep serving."""
    rig = Rig(devices=3)
    _pd(rig, 3, warm=[])
    host = Host(rig, ControlConfig(managed=True, scaling=ScalingConfig(debounce_plans=1)))
    ctl = Controller(host, clock=lambda: rig.now)
    for _ in range(6):  # m* 3
        rig.submit("pd", tokens=200, max_tokens=1)
    ops = ctl.plan_fast(rig.now)
    a = ctl.room.last_scaling.apps[0]
    assert (a.count, a.prefill, a.decode) == (3, 2, 1)
    assert [(o.device, o.target, o.role, o.reassign) for o in ops] == [(2, "active", "prefill", True)]
    asyncio.run(_execute(ctl, ops))
    assert host.calls == [("pd", 2, "warm"), ("pd", 2, "active")] and host.roles == [("pd", 2, "prefill")]
    assert _roles(rig) == {0: ("prefill", "active"), 1: ("decode", "active"), 2: ("prefill", "active")}
    assert rig.core.registry.models["pd"].serving


def test_an_operation_in_flight_counts_where_it_goes():
    """A reassignment in flight counts as its new role coming up: the next tick plans
    nothing for that device and nothing twice."""
    rig = Rig(devices=3)
    _pd(rig, 3, warm=[])
    host = Host(rig, ControlConfig(managed=True, scaling=ScalingConfig(debounce_plans=1)))
    ctl = Controller(host, clock=lambda: rig.now)
    for _ in range(6):
        rig.submit("pd", tokens=200, max_tokens=1)
    ops = ctl.plan_fast(rig.now)
    for o in ops:
        ctl.room.in_flight[("pd", o.device)] = (o, rig.now)
    rig.now += 0.25
    assert ctl.plan_fast(rig.now) == []
    assert ctl.room.roles["pd"].target == ((0, "prefill"), (1, "decode"), (2, "prefill"))


def test_one_instance_wanted_runs_mixed_and_the_decode_drain_waits_for_the_handoff():
    """m* 1 on a P/D pair: one mixed instance is wanted. Nothing rests, so the idle one
    (decode 1) is reassigned to mixed and the busy prefill 0 drains. Decode 1 is then the
    model's last decode instance, so its drain (core/draining.py draining_requests) also
    waits for the request still prefilling on 0: that request's KV must find it at its
    handoff."""
    rig = Rig(devices=2)
    _pd(rig, 2, warm=[])
    host = Host(rig, ControlConfig(managed=True, scaling=ScalingConfig(debounce_plans=1)))
    ctl = Controller(host, clock=lambda: rig.now)
    rid = rig.submit("pd", tokens=10, max_tokens=2)  # 1 request: m* 1
    rig.tick()
    assert [len(rig.core.requests.on_device(d)) for d in (0, 1)] == [1, 0]  # on the prefill instance
    ops = ctl.plan_fast(rig.now)
    assert [(o.device, o.target, o.role, o.reassign) for o in ops] == [(1, "active", "mixed", True),
                                                                      (0, "warm", None, False)]
    assert ops[0].reason.startswith("reassign: mixed short")
    core = rig.core
    assert [r.rid for r in core.draining_requests(core.instance("pd", 1))] == [rid]
    assert [r.rid for r in core.draining_requests(core.instance("pd", 0))] == [rid]  # its own only
    rig.token(0, rid)  # first token, then the handoff to decode 1
    req = core.requests.by_id[rid]
    req.decode_inst, req.device = core.instance("pd", 1), 1
    assert [r.rid for r in core.draining_requests(core.instance("pd", 1))] == [rid]  # now its own
    assert core.draining_requests(core.instance("pd", 0)) == []


def test_prefill_share_comes_from_the_measured_per_token_costs():
    rig = Rig(devices=2)
    _pd(rig, 2, warm=[])
    ctl = Controller(Host(rig, ControlConfig(managed=True)), clock=lambda: rig.now)
    load = LoadFeatures(request_rate=2.0, input_token_rate=200.0, output_token_rate=40.0, input_len_mean=100.0,
                        input_len_var=0.0, output_len_mean=20.0, output_len_var=0.0)
    # no samples: the estimators' priors
    want = prefill_share(load, PrefillEstimator().estimate(100) / 100, DecodeStepEstimator().step_s(1))
    assert measured_prefill_share(rig.core, rig.core.registry.models["pd"], load) == pytest.approx(want)
    # measured: 0.05 s per 100-token prefill on device 0; 20 ms steps with 4 sequences on device 1
    est = rig.core.dispatch.estimators[("pd", 0)]
    for n, t in ((50, 0.03), (100, 0.05), (150, 0.07)):
        est.observe(n, t)
    rig.core.guard.decoding[1] = 4
    for _ in range(3):
        rig.core.guard.fit.setdefault(1, DecodeStepEstimator()).observe(4, 0.02)
    p, d = 0.05 / 100, 0.02 / 4
    assert measured_prefill_share(rig.core, rig.core.registry.models["pd"], load) == pytest.approx(200 * p / (200 * p + 40 * d),
                                                                                     rel=1e-6)


def test_keep_alive_rests_an_elastic_pd_model_but_leaves_a_steady_one_as_configured():
    """Idle past warm_after_s: the elastic P/D model goes Warm on every instance (its
    next request wakes one mixed instance); a steady one keeps its configured roles."""
    from janusd.policy.policy_config import KeepAliveConfig

    rig = Rig(devices=4)
    rig.model("pd", [0, 1], prefill_devices=[0], pool="elastic")
    rig.model("fixed", [2, 3], prefill_devices=[2], pool="steady")
    for name, devs in (("pd", (0, 1)), ("fixed", (2, 3))):
        for d in devs:
            rig.activate(name, d)
    host = Host(rig, ControlConfig(managed=True, keepalive=KeepAliveConfig(warm_after_s=5.0, cold_after_s=600.0,
                                                                           demote_pinned=True)))
    ctl = Controller(host, clock=lambda: rig.now)
    ctl.plan_fast(rig.now)  # the classifier: pd elastic, fixed steady
    ctl.plan_slow(rig.now)
    rig.now += 6.0
    ops = ctl.plan_slow(rig.now)
    assert sorted((o.model, o.device, o.target) for o in ops) == [("pd", 0, "warm"), ("pd", 1, "warm")]


def test_lifecycle_ops_takes_a_role_only_at_activation():
    """lifecycle_ops.set_state(role=...): a role goes with an activation only; an Active
    instance keeps its role (the controller drains it first); asking for the role it has
    changes nothing. All refused before any worker is asked."""
    from types import SimpleNamespace

    from janusd.server.lifecycle_ops import LifecycleOps

    rig = Rig(devices=2)
    _pd(rig, 2, warm=[])
    ops = SimpleNamespace(core=rig.core, workers=[None, None], clock=lambda: rig.now)
    life = LifecycleOps(ops, SimpleNamespace())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a role is chosen at activation, not when going warm"):
        asyncio.run(life.set_state("pd", 1, "warm", role="prefill"))
    with pytest.raises(ValueError, match="is active as decode: it takes the role prefill only when it comes back"):
        asyncio.run(life.set_state("pd", 1, "active", role="prefill"))
    assert asyncio.run(life.set_state("pd", 1, "active", role="decode"))["unchanged"] is True
    assert rig.core.instance("pd", 1).role == "decode"
