"""One controller for both shells ([U]): the daemon's control shell (server/controller.py)
and the simulator's (sim/control_shell.py) issue the same Op sequence for the same world.

The simulator runs a scripted burst on its virtual clock; beside it, a daemon Controller
whose host is the simulated cluster (its core, the simulator's oracle as predictor) plans
at every one of the simulator's ticks, reading the core through its own shell, and hears
every outcome the simulator's moves report. A rule added to either shell alone (an op
filtered, added or reordered, a snapshot read differently) makes the sequences differ."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from janusd.config import DispatchConfig, JanusConfig
from janusd.control.ops import Op
from janusd.hw import device_spec
from janusd.server.controller import Controller
from janusd.sim.cluster import Cluster
from janusd.sim.served import served_models
from janusd.sim.control_shell import SimControl
from janusd.sim.perfmodel import PerfModel
from janusd.sim.specs import resolve
from test_sim_controller import burst_trace


class _Host:
    """The daemon's view of the simulated cluster: its core and its oracle (moves are the
    simulator's, so the daemon shell only plans here)."""

    def __init__(self, sim: SimControl) -> None:
        self.core = sim.c.core
        cfg = JanusConfig(control=sim.room.cfg)
        self._cfg = msgspec.structs.replace(cfg, devices=msgspec.structs.replace(cfg.devices,
                                                                                 count=sim.c.n_devices))
        self._pred = sim.oracle

    @property
    def cfg(self) -> JanusConfig:
        return self._cfg

    def predictor(self) -> Any:
        return self._pred

    async def set_state(self, *a: Any, **k: Any) -> dict[str, Any]:  # pragma: no cover - never carried out here
        raise AssertionError("the daemon shell only plans in this test")

    async def fork(self, *a: Any, **k: Any) -> dict[str, Any]:  # pragma: no cover
        raise AssertionError("the daemon shell only plans in this test")


def _key(op: Op) -> bytes:
    """The whole op as its wire form (kind tag, every field, a migration's second half)."""
    return msgspec.json.encode(op)


@pytest.mark.parametrize("mode", ["janus", "blitzscale"])
def test_the_daemon_shell_and_the_simulator_issue_the_same_ops(mode):
    tr = burst_trace(3)
    served, req_model = served_models(tr, resolve(tr.models))
    cluster = Cluster(tr, served, req_model, PerfModel(device_spec("ascend-910c-die")), 8, DispatchConfig())
    sim = SimControl(cluster, served, mode)
    daemon = Controller(_Host(sim))
    daemon.room.allocator = sim.room.allocator  # the baseline's allocator swap, as `janus sim` makes it
    daemon_ops: list[tuple[float, tuple]] = []
    room_finished = sim.room.finished
    _twin: dict[int, Op] = {}  # the simulator's op -> the daemon room's op for the same decision

    def _pair(a: Op, b: Op) -> None:
        _twin[id(a)] = b

    def finished(op: Op, outcome: str, now: float, snap: Any, phases: Any = None, detail: Any = None) -> list[Op]:
        # the daemon's room hears the same outcome, read through its own shell, and must release the same ops
        theirs = daemon.room.finished(_twin[id(op)], outcome, now, daemon.snapshot(now))
        ours = room_finished(op, outcome, now, snap)
        assert [_key(o) for o in theirs] == [_key(o) for o in ours]
        for a, b in zip(ours, theirs):
            _pair(a, b)
        daemon_ops.extend((now, _key(o)) for o in theirs)
        return ours

    sim.room.finished = finished  # type: ignore[method-assign]
    plan_fast, plan_slow = sim.room.plan_fast, sim.room.plan_slow

    def both(plan, theirs_plan):  # type: ignore[no-untyped-def]
        def go(snap: Any, now: float) -> list[Op]:
            theirs = theirs_plan(now)
            ours = plan(snap, now)
            for a, b in zip(ours, theirs):
                _pair(a, b)
            daemon_ops.extend((now, _key(o)) for o in theirs)
            return ours
        return go

    sim.room.plan_fast = both(plan_fast, daemon.plan_fast)  # type: ignore[method-assign]
    sim.room.plan_slow = both(plan_slow, daemon.plan_slow)  # type: ignore[method-assign]
    sim.start()
    cluster.run()
    sim_ops = [(t, _key(o)) for t, o in sim.ops]
    assert len(sim_ops) >= 3, sim_ops  # the burst scaled out and back in
    assert any(b'"op":"activate"' in k and b'scale out' in k for _, k in sim_ops)
    assert daemon_ops == sim_ops
