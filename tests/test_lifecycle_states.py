"""The instance state table (lifecycle/states.py) and the restore path choice
(lifecycle/restore_path.py): pure, so checked exhaustively."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, strategies as st

from janusd.lifecycle.restore_path import Bandwidths, choose, options_for
from janusd.lifecycle.states import TRANSITIONS, IllegalTransition, InstanceState, check_transition

S = InstanceState


def test_every_state_has_a_row_and_no_self_loops():
    assert set(TRANSITIONS) == set(S)
    assert all(s not in TRANSITIONS[s] for s in S)


@pytest.mark.parametrize("current,target", list(itertools.product(S, S)))
def test_every_illegal_edge_is_refused_naming_the_current_state(current, target):
    if target in TRANSITIONS[current]:
        check_transition(current, target)
        return
    with pytest.raises(IllegalTransition) as e:
        check_transition(current, target, "m on device 0")
    assert f"m on device 0 is {current.value}: cannot go {target.value}" in str(e.value)


def test_lifecycle_edges_of_the_issue():
    for a, b in [(S.ACTIVE, S.DRAINING), (S.DRAINING, S.WARM), (S.DRAINING, S.COLD), (S.WARM, S.RESTORING),
                 (S.COLD, S.RESTORING), (S.WARM, S.FORKING), (S.COLD, S.FORKING), (S.RESTORING, S.ACTIVE),
                 (S.FORKING, S.ACTIVE), (S.RESTORING, S.WARM), (S.RESTORING, S.COLD), (S.FORKING, S.WARM),
                 (S.WARM, S.COLD), (S.COLD, S.WARM)]:
        assert b in TRANSITIONS[a], (a, b)
    # never straight from a resting state to serving, nor from Active to a resting state
    for a in (S.WARM, S.COLD, S.UNLOADED):
        assert S.ACTIVE not in TRANSITIONS[a]
    assert not {S.WARM, S.COLD, S.UNLOADED} & TRANSITIONS[S.ACTIVE]


def test_every_state_reaches_active_and_unloaded():
    def reach(start):
        seen, todo = {start}, [start]
        while todo:
            for n in TRANSITIONS[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return seen

    for s in S:
        assert {S.ACTIVE, S.UNLOADED} <= reach(s) | {s}, s  # no state is a trap


def test_cpu_machine_restores_warm_by_h2d_and_a_supernode_forks():
    cpu = Bandwidths(memcpy=8e9)  # loopback tcp ~7x slower than memcpy
    assert choose(options_for("warm", True), 500 << 20, cpu) == "h2d"
    sn = Bandwidths(memcpy=59e9, measured={"d2d": 163.6e9, "h2d": 59e9})  # PAPER.md §8's links
    assert choose(options_for("warm", True), 16 << 30, sn) == "d2d"  # a shard of a large model
    # a Cold instance with a serving peer forks on cpu too: reading the checkpoint is slower still
    assert choose(options_for("cold", True), 500 << 20, cpu) == "d2d"
    assert choose(options_for("cold", False), 500 << 20, cpu) == "checkpoint"


@given(st.lists(st.tuples(st.integers(1, 1 << 30), st.floats(1e-4, 10.0)), min_size=1, max_size=20))
def test_observed_bandwidth_stays_within_what_was_seen(obs):
    bw = Bandwidths()
    for n, s in obs:
        bw.observe("h2d", n, s)
    rates = [n / s for n, s in obs]
    assert min(rates) * (1 - 1e-9) <= bw.of("h2d") <= max(rates) * (1 + 1e-9)


def test_transfer_protocol_by_device_kind():
    from janusd.lifecycle.transfer import protocol_for

    assert [protocol_for(k) for k in ("cpu", "cuda", "npu")] == ["tcp", "rdma", "ascend"]
    assert protocol_for("cuda", "nvlink") == "nvlink"
    with pytest.raises(ValueError, match="not one of"):
        protocol_for("cpu", "carrier-pigeon")


def _ctl_args(argv):
    import argparse

    from janusd import ctl_cli

    p = argparse.ArgumentParser()
    ctl_cli.add_arguments(p)
    return ctl_cli._request(p.parse_args(argv))


def test_ctl_state_and_fork_requests():
    from janusd.wire import admin_msgs as am

    assert _ctl_args(["state", "m", "warm", "--device", "2"]) == am.StateReq("m", 2, "warm")
    assert _ctl_args(["fork", "m", "--from", "0", "--to", "1"]) == am.ForkReq("m", 0, 1)
    for argv, msg in [(["state", "m", "--device", "1"], "needs a target"),
                      (["state", "m", "cold"], "exactly one --device"),
                      (["fork", "m", "--from", "0"], "--from N and --to M"),
                      (["unload", "m", "warm"], "takes no state argument")]:
        with pytest.raises(ValueError, match=msg):
            _ctl_args(argv)
