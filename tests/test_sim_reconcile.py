"""The simulated controller keeps the instances to its plans: an instance that no plan
wants stops (make before break), however the plans changed while a move was under way.

The placement policy is scripted here (the one fake: which plans come, in what order);
the executor, the cluster and the core are the real ones. The script is the sequence
that left the 62-app day with instances serving unplanned to the end of the run
(bench/RESULTS.md "sim, fifth pass"): a model's migration target waits for memory, then
the plan moves the model on from that target to a third device."""

from __future__ import annotations

import numpy as np
import pytest

from janusd.lifecycle.states import InstanceState as S
from janusd.policy import placement
from janusd.policy.snapshot import Assignment, Move, PlacementPlan
from janusd.sim import controller as ctl
from janusd.sim.run import simulate
from janusd.sim.specs import resolve
from janusd.trace.formats import Trace


def _plan(where: dict[str, int], moves: list[tuple[str, str, int | None, int | None]]) -> PlacementPlan:
    return PlacementPlan(assignment=tuple(Assignment(key=k, device=d) for k, d in sorted(where.items())),
                         moves=tuple(Move(kind=kind, key=m, model=m, src=src, dst=dst, reason="script", forced=True)
                                     for kind, m, src, dst in moves),
                         unplaced=(), devices=(), bins_used=len(set(where.values())), phi=0.0, migrations=0)


# three qwen3-8b fill one 64 GB die (a fourth's weights do not fit: its load waits)
SCRIPT = [
    _plan({"a": 0, "b": 1, "c": 1, "d": 1},
          [("place", "a", None, 0), ("place", "b", None, 1), ("place", "c", None, 1), ("place", "d", None, 1)]),
    _plan({"a": 1, "b": 1, "c": 1, "d": 1}, [("migrate", "a", 0, 1)]),  # device 1 is full: a's load waits
    _plan({"a": 2, "b": 1, "c": 1, "d": 1}, [("migrate", "a", 1, 2)]),  # the plan moves on before it came
]


def _trace() -> Trace:
    rng = np.random.default_rng(3)
    n = 160
    t = np.sort(rng.uniform(0, 40, n))
    apps = [("a", "b", "c", "d")[i % 4] for i in range(n)]
    return Trace.build(t, apps, ["qwen3-8b"] * n, rng.integers(100, 400, n), rng.integers(20, 60, n))


@pytest.fixture
def scripted_run(monkeypatch):
    calls = []

    def plan(snap, cfg, *, consolidate, migrations_left=None):
        calls.append(snap)
        return SCRIPT[min(len(calls) - 1, len(SCRIPT) - 1)]

    monkeypatch.setattr(placement, "plan", plan)
    seen: list[tuple[float, dict[int, str]]] = []
    tick = ctl.Controller._fast_tick

    def record(self, now):
        tick(self, now)
        insts = self.c.core.registry.models["a"].instances.values()
        seen.append((now, {i.device: i.state.name for i in insts if i.state is not S.UNLOADED}))

    monkeypatch.setattr(ctl.Controller, "_fast_tick", record)
    tr = _trace()
    cluster, summ = simulate(tr, resolve(tr.models), 3, "janus")
    return calls, seen, cluster, summ


def test_a_replaced_instance_stops_once_its_successor_is_active(scripted_run):
    calls, seen, cluster, summ = scripted_run
    assert len(calls) >= 3  # the script ran to its last plan
    # a served from device 0 until its instance on device 2 was Active, then device 0 drained
    active2 = [t for t, s in seen if s.get(2) == "ACTIVE"]
    assert active2, "a never came up on device 2"
    t2 = active2[0]
    before = [s for t, s in seen if t < t2]
    assert all(s.get(0) == "ACTIVE" for s in before[1:]), "a had no Active instance before its successor was up"
    after = [s for t, s in seen if t >= t2 + 0.5]
    assert after and all(0 not in s or s[0] == "DRAINING" for s in after[:4])
    assert all(0 not in s for s in after[4:]), "the replaced instance on device 0 kept serving"
    # nothing waited for the device that never had room
    assert all(1 not in s for _, s in seen)
    assert summ["outcomes"].get("ok") == len(cluster.trace.arrival_s)
