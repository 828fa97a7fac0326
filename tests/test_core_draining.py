"""[U] One drain, in the core (core/draining.py): an instance leaving Active lets its
requests finish, bounded; the rest end with the shell's Failure, aborted on the worker.
The daemon and the simulator both call ServingCore.drain. Fake workers, hand clock."""

from __future__ import annotations

import pytest

from janusd.core.requests import Failure
from janusd.lifecycle.states import InstanceState

from core_fakes import Rig

S = InstanceState
GONE = Failure(503, "went warm", code="model_deactivated")


def _serving(rig: Rig, n: int) -> list[int]:
    rig.model("m", [0, 1])
    rig.activate("m", 0)
    rids = [rig.submit("m", max_tokens=8) for _ in range(n)]
    rig.tick()
    return rids


def test_a_drain_ends_at_the_tick_after_its_last_request_and_new_work_goes_elsewhere():
    rig = Rig()
    rids = _serving(rig, 2)
    rig.activate("m", 1)
    done: list[tuple[float, int]] = []
    inst = rig.core.instance("m", 0)
    rig.core.drain(inst, rig.now, 30.0, GONE, lambda t, n: done.append((t, n)))
    assert inst.state is S.DRAINING and done == [] and rig.core.draining()
    later = rig.submit("m")
    assert rig.tick() == pytest.approx(rig.now + 30.0) or rig.core.draining()
    assert later in rig.workers[1].generates()
    rig.now += 0.5
    for rid in rids:
        rig.token(0, rid, finished=True)
    assert done == []  # seen at the next tick
    rig.tick()
    assert done == [(rig.now, 0)] and not rig.core.draining() and rig.workers[0].aborts() == []


def test_a_drain_past_its_bound_ends_what_still_runs_with_the_shells_failure():
    rig = Rig()
    rids = _serving(rig, 3)
    sent = rig.workers[0].generates()  # the rest waits in the queue: held once the model drains
    assert len(sent) >= 2
    done: list[tuple[float, int]] = []
    rig.core.drain(rig.core.instance("m", 0), rig.now, 2.0, GONE, lambda t, n: done.append((t, n)))
    rig.token(0, sent[0], finished=True)
    assert rig.tick() == pytest.approx(rig.now + 2.0)
    rig.now += 2.0
    rig.tick()
    assert done == [(rig.now, len(sent) - 1)]
    for rid in sent[1:]:
        f = rig.events[rid][-1]
        assert isinstance(f, Failure) and f.code == "model_deactivated"
    assert sorted(rig.workers[0].aborts()) == sorted(sent[1:])
    assert all(rig.events[r] == [] for r in rids if r not in sent)  # held, not cut


def test_an_idle_instance_drains_at_once_and_a_second_drain_joins_the_first():
    rig = Rig()
    rig.model("m", [0])
    rig.activate("m", 0)
    done: list[str] = []
    rig.core.drain(rig.core.instance("m", 0), rig.now, 5.0, GONE, lambda t, n: done.append("idle"))
    assert done == ["idle"]
    rig2 = Rig()
    rids = _serving(rig2, 1)
    inst = rig2.core.instance("m", 0)
    rig2.core.drain(inst, rig2.now, 5.0, GONE, lambda t, n: done.append("first"))
    rig2.core.drain(inst, rig2.now, 60.0, Failure(500, "other"), lambda t, n: done.append("second"))
    rig2.now += 5.0
    rig2.tick()  # the first drain's bound and failure hold
    assert done == ["idle", "first", "second"] and rig2.events[rids[0]][-1].code == "model_deactivated"
