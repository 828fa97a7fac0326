"""server/tp_groups.py's rules on a real ServingCore (fake workers at the edge): which
workers die with a dead one (the group's, while its instance holds something on them) and
which tp instances wait for a worker that comes back (led elsewhere, still Loading)."""

from __future__ import annotations

from core_fakes import Rig
from janusd.lifecycle.states import InstanceState
from janusd.server.tp_groups import group_peers, waiting_on

S = InstanceState


def rig() -> Rig:
    """tp 4 on 0-3, tp 2 on 4-5 and 6-7, tp 1 on 8."""
    r = Rig(devices=9)
    r.model("big", [0], tp=4)
    r.model("mid", [4, 6], tp=2)
    r.model("one", [8])
    for name, lead in (("big", 0), ("mid", 4), ("mid", 6), ("one", 8)):
        r.activate(name, lead)
    return r


def test_a_dead_worker_takes_exactly_its_groups_workers_with_it():
    r = rig()
    assert group_peers(r.core, 2) == {0, 1, 3}  # a follower: the lead and the other followers
    assert group_peers(r.core, 0) == {1, 2, 3}  # the lead: its followers
    assert group_peers(r.core, 5) == {4}
    assert group_peers(r.core, 8) == set()  # tp 1: nobody else
    # a group that holds nothing on its workers (Cold, Unloaded) takes nobody with it
    inst = r.core.instance("mid", 6)
    for s in (S.DRAINING, S.COLD):
        r.core.set_state(inst, s, r.now)
    assert group_peers(r.core, 7) == set()
    for s in (S.RESTORING, S.ACTIVE, S.DRAINING, S.WARM):  # a Warm group's host copies live on every worker
        r.core.set_state(inst, s, r.now)
    assert group_peers(r.core, 7) == {6}


def test_a_group_waits_for_the_worker_that_comes_back_last():
    r = rig()
    for d in range(4):
        r.core.on_worker_death(d, r.now)  # the group died whole: its instance Loading again
    big = r.core.instance("big", 0)
    assert big.state is S.LOADING
    assert [i.model for i in waiting_on(r.core, 3)] == ["big"]  # a follower's return may load it
    assert waiting_on(r.core, 0) == []  # the lead's return loads it as its own instance
    assert waiting_on(r.core, 5) == []  # mid is Active
    r.core.load_failed(big, r.now, "device 3 of its tp group failed")
    assert big.state is S.UNLOADED and waiting_on(r.core, 3) == []
