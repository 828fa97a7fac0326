"""The daemon's and each worker's own lifecycles (server/process_states.py): one table of
moves each, every state in it, and a move outside it refused by name; the words are the
ones `ctl status` and /health always showed."""

from __future__ import annotations

import pytest

from janusd.server.process_states import (DAEMON_MOVES, WORKER_MOVES, DaemonState, ProcessMoveError, WorkerState,
                                          moved)


def test_every_state_has_its_row_and_moves_stay_inside_the_enum():
    for enum_, table in ((DaemonState, DAEMON_MOVES), (WorkerState, WORKER_MOVES)):
        assert set(table) == set(enum_)
        assert all(t <= set(enum_) for t in table.values())


def test_the_words_are_the_old_ones():
    assert [s.value for s in DaemonState] == ["starting", "running", "draining", "stopped"]
    assert [s.value for s in WorkerState] == ["stopped", "starting", "ready", "stopping", "dead", "failed",
                                             "absent"]
    assert WorkerState.READY == "ready" and f"{DaemonState.RUNNING}" == "running"


def test_a_worker_goes_through_its_life_and_nothing_else():
    W = WorkerState
    life = [W.STARTING, W.READY, W.DEAD, W.STARTING, W.DEAD, W.FAILED, W.STOPPING, W.STOPPED]
    s = W.STOPPED
    for t in life:
        s = moved(s, t, WORKER_MOVES, "worker for device 0")
    assert s is W.STOPPED
    with pytest.raises(ProcessMoveError, match="worker for device 0 is stopped: cannot go ready"):
        moved(W.STOPPED, W.READY, WORKER_MOVES, "worker for device 0")
    with pytest.raises(ProcessMoveError, match="is failed: cannot go starting"):
        moved(W.FAILED, W.STARTING, WORKER_MOVES, "worker for device 0")  # a given-up device stays given up
    assert moved(W.READY, W.READY, WORKER_MOVES, "w") is W.READY  # no move


def test_a_slot_without_a_node_waits_absent_and_starts_when_a_node_joins():
    W = WorkerState
    s = W.STOPPED
    # no node at start; one joins; it leaves (the restart finds it gone); another joins
    for t in [W.ABSENT, W.STARTING, W.READY, W.DEAD, W.STARTING, W.DEAD, W.ABSENT, W.STARTING, W.READY]:
        s = moved(s, t, WORKER_MOVES, "worker for device 1")
    assert s is W.READY
    with pytest.raises(ProcessMoveError, match="is absent: cannot go ready"):
        moved(W.ABSENT, W.READY, WORKER_MOVES, "worker for device 1")  # only through a start


def test_the_daemon_never_serves_again_after_it_drained():
    D = DaemonState
    with pytest.raises(ProcessMoveError, match="the daemon is draining: cannot go running"):
        moved(D.DRAINING, D.RUNNING, DAEMON_MOVES, "the daemon")
    assert moved(D.STARTING, D.STOPPED, DAEMON_MOVES, "the daemon") is D.STOPPED  # shutdown during start
