"""The core's side of Active / Warm / Cold (core/serving.py set_state with the [L] states),
driven by fake workers and a hand clock: a Warm or Cold model's requests are held and
served once an instance is Active again (or fail with 503 + Retry-After at the bound),
a worker's death turns Warm into Cold and a restore into a reload, and a failed device
leaves nothing in a resting state."""

from __future__ import annotations

from janusd.core.requests import Failure
from janusd.core.serving import Limits
from janusd.lifecycle.states import InstanceState

from core_fakes import Rig

S = InstanceState


def _to(rig: Rig, model: str, device: int, *states: InstanceState) -> None:
    inst = rig.core.instance(model, device)
    for s in states:
        rig.core.set_state(inst, s, rig.now)


def test_requests_for_a_warm_model_are_held_then_served_after_a_restore():
    rig = Rig(limits=Limits(model_wait_timeout_s=5.0))
    rig.model("m", [0])
    rig.activate("m", 0)
    _to(rig, "m", 0, S.DRAINING, S.WARM)
    rid = rig.submit("m", ttft_ms=100)
    rig.now += 1.0
    rig.tick()
    assert rig.events[rid] == [] and [r.rid for r in rig.core.held][0] == rid
    _to(rig, "m", 0, S.RESTORING)
    rig.tick()
    assert rig.workers[0].generates() == []  # Restoring takes no work
    rig.core.loaded(rig.core.instance("m", 0), rig.now, 2048, 0.05)
    rig.tick()
    assert rig.workers[0].generates() == [rid]


def test_a_cold_model_request_fails_with_retry_after_at_the_bound():
    rig = Rig(limits=Limits(model_wait_timeout_s=2.0))
    rig.model("m", [0])
    _to(rig, "m", 0, S.COLD)
    rid = rig.submit("m")
    rig.now += 2.0
    rig.tick()
    (f,) = rig.events[rid]
    assert isinstance(f, Failure) and f.status == 503 and f.retry_after_s == 1.0


def test_queued_requests_of_an_instance_going_warm_are_held_not_rejected():
    rig = Rig()
    rig.model("m", [0])
    rig.activate("m", 0)
    rig.core.dispatch.set_ready(rig.core.instance("m", 0), False)  # queued, not yet assigned
    rid = rig.submit("m")
    _to(rig, "m", 0, S.DRAINING, S.WARM)
    assert [r.rid for r in rig.core.held][0] == rid and rig.events[rid] == []
    rig.core.check_integrity()


def test_worker_death_turns_warm_into_cold_and_a_restore_into_a_reload():
    rig = Rig()
    rig.model("a", [0])
    rig.model("b", [0])
    rig.model("c", [0])
    rig.activate("a", 0)
    _to(rig, "a", 0, S.DRAINING, S.WARM)
    _to(rig, "b", 0, S.COLD, S.RESTORING)
    _to(rig, "c", 0, S.FORKING)
    rig.core.on_worker_death(0, rig.now)
    got = {n: rig.core.instance(n, 0).state for n in "abc"}
    assert got == {"a": S.COLD, "b": S.LOADING, "c": S.LOADING}
    rig.core.on_device_failed(0, rig.now)
    assert {rig.core.instance(n, 0).state for n in "abc"} == {S.UNLOADED}


def test_a_reply_after_the_instance_left_restoring_is_ignored():
    rig = Rig()
    rig.model("m", [0])
    _to(rig, "m", 0, S.COLD, S.RESTORING, S.UNLOADED)
    rig.core.loaded(rig.core.instance("m", 0), rig.now, 2048, 0.1)
    assert rig.core.instance("m", 0).state is S.UNLOADED
    rid = rig.submit("m")
    rig.tick()
    assert rig.workers[0].generates() == [] and [r.rid for r in rig.core.held][0] == rid
