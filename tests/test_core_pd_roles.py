"""An instance's P/D role in the core (core/serving.py set_role, core/registry.py): set
only while it rests, the Dispatcher and the KV handoff following it on activation, and a
prefill instance taking work only while an Active decode instance can take its KV (its
requests wait, held, instead of failing at the handoff). Real core, fake workers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core_fakes import Rig
from janusd.config import DispatchConfig
from janusd.core.requests import Failure
from janusd.lifecycle.states import InstanceState
from janusd.wire import worker_msgs as wm

S = InstanceState


def _rest(rig: Rig, name: str, device: int, state: InstanceState = S.WARM) -> None:
    inst = rig.core.instance(name, device)
    rig.core.set_state(inst, S.DRAINING, rig.now)
    rig.core.set_state(inst, state, rig.now)


def _up(rig: Rig, name: str, device: int) -> None:
    inst = rig.core.instance(name, device)
    rig.core.set_state(inst, S.RESTORING, rig.now)
    rig.core.loaded(inst, rig.now, 2048, 0.01)


def _pd(devices: int = 3) -> Rig:
    rig = Rig(devices=devices, dispatch=DispatchConfig(plan="window"))  # one tick assigns a whole burst
    rig.model("m", list(range(devices)), prefill_devices=[0])
    for d in range(devices):
        rig.activate("m", d)
    return rig


def test_a_role_changes_only_while_the_instance_rests():
    rig = _pd()
    inst = rig.core.instance("m", 1)
    with pytest.raises(ValueError, match="active: its role changes only while it rests"):
        rig.core.set_role(inst, "prefill", rig.now)
    with pytest.raises(ValueError, match="role must be one of"):
        rig.core.set_role(inst, "both", rig.now)
    _rest(rig, "m", 1)
    rig.core.set_role(inst, "prefill", rig.now)
    assert inst.role == "prefill" and rig.core.registry.models["m"].engine_cfg(1).role == "prefill"
    rig.model("plain", [2])
    with pytest.raises(ValueError, match="not a P/D model"):
        rig.core.set_role(rig.core.instance("plain", 2), "decode", rig.now)


def test_the_dispatcher_and_the_handoff_follow_a_role_change_on_activation():
    rig = _pd()
    core = rig.core
    d1, p0 = core.instance("m", 1), core.instance("m", 0)
    assert core.dispatch.member(d1.instance_id) is None and core.dispatch.member(p0.instance_id) is p0
    # decode 1 -> prefill: it joins the Dispatcher when it comes back
    _rest(rig, "m", 1)
    core.set_role(d1, "prefill", rig.now)
    assert core.dispatch.member(d1.instance_id) is None  # resting: out of dispatch whatever its role
    _up(rig, "m", 1)
    assert core.dispatch.member(d1.instance_id) is d1
    # prefill 0 -> decode: leaves the Dispatcher for good and becomes the handoff's target
    _rest(rig, "m", 0)
    core.set_role(p0, "decode", rig.now)
    _up(rig, "m", 0)
    assert core.dispatch.member(p0.instance_id) is None
    assert {core._decode_target("m").device for _ in range(2)} <= {0, 2}
    for _ in range(4):
        rig.submit("m", ttft_ms=100_000)
    rig.tick()
    assert len(rig.workers[1].generates()) == 4 and rig.workers[0].generates() == []
    core.check_integrity()


def test_a_prefill_instance_without_an_active_decode_instance_takes_no_work_its_requests_wait():
    rig = _pd(devices=2)
    core = rig.core
    _rest(rig, "m", 1)  # the only decode instance goes Warm
    p0 = core.instance("m", 0)
    assert not p0.paired and not core.registry.models["m"].serving
    rid = rig.submit("m", ttft_ms=100_000)
    rig.tick()
    assert rig.workers[0].generates() == [] and core.held.count("m") == 1  # held, not sent to fail at handoff
    core.guard.mark_all()
    rig.tick()  # the decode guard never makes it ready again on its own
    assert rig.workers[0].generates() == []
    _up(rig, "m", 1)  # a decode partner: the held request goes to the prefill instance
    assert p0.paired and core.held.count("m") == 0
    rig.tick()
    assert rig.workers[0].generates() == [rid]
    assert not core.requests.by_id[rid].done


def test_a_mixed_instance_serves_a_pd_model_alone():
    rig = _pd(devices=2)
    core = rig.core
    for d in (0, 1):
        _rest(rig, "m", d, S.COLD)
    m1 = core.instance("m", 1)
    core.set_role(m1, "mixed", rig.now)
    _up(rig, "m", 1)
    assert core.registry.models["m"].serving and core.dispatch.member(m1.instance_id) is m1
    rid = rig.submit("m", ttft_ms=100_000)
    rig.tick()
    assert rig.workers[1].generates() == [rid]
    assert core.registry.models["m"].engine_cfg(1).role == "mixed"
    rig.token(1, rid, finished=True)
    assert core.requests.by_id.get(rid) is None and rig.events[rid][-1] is not None
    assert not any(isinstance(m, wm.Abort) for m in rig.workers[1].sent)


def test_a_handed_off_request_counts_as_decoding_on_the_decode_device():
    """After the handoff the decode guard (and the controller's per-token decode cost)
    sees the request decoding where it decodes, not on the prefill device it left."""
    rig = _pd(devices=2)
    core = rig.core
    rid = rig.submit("m", tokens=3, max_tokens=8, ttft_ms=100_000)
    rig.tick()
    rig.token(0, rid)
    assert core.guard.decoding.get(0) == 1
    kv = wm.KVExport(req_id=str(rid), model="m", block_size=16, block_bytes=4096, dtype="float32", block_ids=[3],
                     global_offsets=[[(12288, 4096)]], num_cached_tokens=3, prompt_len=3, token_ids=[5, 6, 7, 9])
    core.on_kv(0, wm.KVReady(rid, kv, "127.0.0.1:1", 1 << 30), rig.now)
    assert (core.guard.decoding.get(0), core.guard.decoding.get(1)) == (0, 1)
    rig.now += 0.01
    rig.token(1, rid)  # a later token from the decode worker is a gap sample of device 1
    assert core.guard.fit[1].n == 1 and 0 not in core.guard.fit
    rig.token(1, rid, finished=True)
    assert core.guard.decoding.get(1) == 0


_STEP = st.tuples(st.integers(0, 2), st.sampled_from(["rest", "up", "prefill", "decode", "mixed"]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=25))
def test_work_goes_only_to_an_active_instance_that_can_finish_it(steps):
    """Any sequence of rests, activations and role changes on a P/D model's 3 instances:
    after each, a new request is sent only to an Active mixed instance, or an Active
    prefill instance while an Active decode instance exists; otherwise it waits, held.
    `paired` and Model.serving say exactly that, and the core's integrity holds."""
    rig = _pd()
    core = rig.core
    m = core.registry.models["m"]
    for device, action in steps:
        inst = core.instance("m", device)
        if action == "rest" and inst.state is S.ACTIVE:
            _rest(rig, "m", device)
        elif action == "up" and inst.state in (S.WARM, S.COLD):
            _up(rig, "m", device)
        elif action in ("prefill", "decode", "mixed") and inst.state in (S.WARM, S.COLD):
            core.set_role(inst, action, rig.now)
        active = {i.role for i in m.instances.values() if i.state is S.ACTIVE}
        decode_up = "decode" in active
        assert all(i.paired == (decode_up or i.role != "prefill") for i in m.instances.values())
        assert m.serving == ("mixed" in active or {"prefill", "decode"} <= active)
        before = {d: len(w.generates()) for d, w in rig.workers.items()}
        rid = rig.submit("m", ttft_ms=1e9)
        rig.now += 0.01
        rig.tick()
        sent = [d for d, w in rig.workers.items() if len(w.generates()) > before[d]]
        if m.serving:
            assert len(sent) == 1, (sent, steps)
            to = core.instance("m", sent[0])
            assert to.state is S.ACTIVE and (to.role == "mixed" or (to.role == "prefill" and decode_up))
            core.requests.fail(rid, Failure(499, "done here"))
        else:
            assert sent == [] and core.held.count("m") == 1
            core.requests.fail(rid, Failure(499, "done here"))
        core.check_integrity()
