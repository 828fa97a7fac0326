"""Tensor parallelism in the control room and the simulator ([P]): an instance of a tp-N
model is an aligned group of N devices (control/groups.py), held whole.

Checked: the room's group rules (scale-out onto free groups, the steady count of a tp > 1
model, the start groups) never put two instances' groups on one device, never a group on
a device that serves anything else, and the steady packing of the tp-1 models around them
never exceeds a device; the elastic budget counts N devices per tp-N instance
(policy/scaling.py, the BlitzScale allocator); the oracle's prior of a shard divides the
work and adds the all-reduce (0 at tp 1), as the performance model does; a small
simulated day with a tp 2 model under janus serves it on whole groups."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd.control.baselines import first_come
from janusd.control.extras import free_elastic_devices, meet_extras
from janusd.control.groups import free_groups, steady_group_ops
from janusd.control.ops import group
from janusd.control.start import start_groups
from janusd.control.ops import Activate
from janusd.control.snapshot import ControlSnapshot, InstanceView, ModelView
from janusd.control.steady_snapshot import placement_snapshot
from janusd.hw.devices import device_spec
from janusd.hw.spec import allreduce_s, tp_comm_s
from janusd.lifecycle.states import InstanceState
from janusd.oracle.prior import RooflinePrior
from janusd.oracle.types import AttainmentEstimate, LoadFeatures, MinInstances, ResourceEstimate
from janusd.policy.bins import FIT_EPS
from janusd.policy.placement import plan as placement_plan
from janusd.policy.policy_config import DemandConfig, PlacementConfig, ScalingConfig
from janusd.policy.scaling import scale
from janusd.policy.snapshot import ElasticApp, ScalingState
from janusd.sim.perfmodel import PerfModel
from janusd.sim.run import per_app, simulate
from janusd.sim.specs import presets, resolve
from janusd.telemetry.telemetry import ModelWindow

sys.path.insert(0, str(Path(__file__).parent))
from sim_fixtures import poisson_trace  # noqa: E402

S = InstanceState


class Table:
    """Capacity vectors from a table scaled by the request rate (hbm fixed), m* = rate."""

    def __init__(self, vectors: dict[str, tuple[float, float, float]]) -> None:
        self.vectors = vectors

    def capacity(self, model: str, load: LoadFeatures) -> ResourceEstimate:
        h, c, b = self.vectors[model]
        r = max(load.request_rate, 0.1)
        return ResourceEstimate((h, c * r, b * r), (0.0, 0.0, 0.0), "table")

    def attainment(self, model: str, load: LoadFeatures, instances: int) -> AttainmentEstimate:
        return AttainmentEstimate(1.0, 0.0, "table")

    def min_instances(self, model: str, load: LoadFeatures, target: float, margin: float, limit: int) -> MinInstances:
        return MinInstances(max(1, min(limit, round(load.request_rate))), None, "table")


def _window(name: str, rate: float) -> ModelWindow:
    return ModelWindow(name, 10.0, rate, rate * 500, rate * 100, 500.0, 100.0, 100.0, 100.0, 0, 0, 0, 0.0, 0, 0)


def _world(draw_models: list[tuple[int, float, int]], n_devices: int) -> tuple[ControlSnapshot, Table]:
    """Models m0.. with (tp, rate, count of serving instances): each placed where
    start_groups / the lowest free devices put it, so the world itself is valid."""
    free = list(range(n_devices))
    models: dict[str, ModelView] = {}
    vectors: dict[str, tuple[float, float, float]] = {}
    for k, (tp, rate, count) in enumerate(draw_models):
        name = f"m{k}"
        insts: dict[int, InstanceView] = {}
        for lead in free_groups(free, tp)[:count]:
            for d in group(lead, tp):
                free.remove(d)
            insts[lead] = InstanceView(device=lead, state=S.ACTIVE)
        models[name] = ModelView(name=name, instances=insts, window=_window(name, rate), tp=tp)
        vectors[name] = (0.2 + 0.1 * (tp > 1), 0.05, 0.05)
    pred = Table(vectors)
    return ControlSnapshot(models=models, n_devices=n_devices, pool=tuple(range(n_devices)), predictor=pred), pred


def _taken(snap: ControlSnapshot) -> dict[int, str]:
    out: dict[int, str] = {}
    for m in snap.models.values():
        for lead in m.serving_devices():
            for d in group(lead, m.tp):
                assert d not in out, f"device {d}: {out[d]} and {m.name}"
                out[d] = m.name
    return out


MODELS = st.lists(st.tuples(st.sampled_from([1, 1, 2, 4]), st.floats(0.0, 6.0), st.integers(0, 2)),
                  min_size=1, max_size=6)


@given(MODELS, st.integers(4, 24), st.lists(st.integers(0, 5), min_size=6, max_size=6))
def test_groups_are_aligned_disjoint_and_never_on_a_busy_device(models, n_devices, counts):
    snap, pred = _world(models, n_devices)
    taken = _taken(snap)
    free = free_elastic_devices(snap.pool, [], {}, snap.models.values())
    assert not set(free) & set(taken)
    new: dict[int, str] = {}
    for k, m in enumerate(snap.models.values()):  # scale-out of each as an elastic model
        for op in meet_extras(m, counts[k], free, "test", {}, {}, lambda d: 0):
            assert isinstance(op, Activate) and op.device % m.tp == 0
            for d in group(op.device, m.tp):
                assert d < n_devices and d not in taken and d not in new, (op, taken, new)
                new[d] = m.name
    free = free_elastic_devices(snap.pool, [], {}, snap.models.values())
    for op in steady_group_ops(snap, set(), free, DemandConfig(), {}, lambda d: 0):  # the steady count
        m = snap.models[op.model]
        if op.target == "active":
            assert op.device % m.tp == 0
            for d in group(op.device, m.tp):
                assert d < n_devices and d not in taken, (op, taken)
        else:
            assert op.device in m.serving_devices() and len(m.serving_devices()) > 1
    # the tp-1 packing around the groups: never on a group's device, never over a device
    ps, _ = placement_snapshot(snap, DemandConfig(), [], {})
    group_devs = {d for d, name in taken.items() if snap.models[name].tp > 1}
    assert not set(ps.pool) & group_devs
    p = placement_plan(ps, PlacementConfig(), consolidate=True)
    assert not {a.device for a in p.assignment} & group_devs
    for dl in p.devices:
        assert all(x <= 1.0 + FIT_EPS for x in dl.load)


@given(st.dictionaries(st.sampled_from("abcdef"), st.sampled_from([1, 2, 4, 8]), min_size=1),
       st.integers(1, 32), st.sets(st.integers(0, 31)))
def test_start_groups_take_aligned_free_groups(tps, n_devices, taken):
    leads, _ = start_groups(tps, list(range(n_devices)), taken)
    used: set[int] = set()
    for name, lead in leads.items():
        assert tps[name] > 1 and lead % tps[name] == 0
        for d in group(lead, tps[name]):
            assert d < n_devices and d not in taken and d not in used
            used.add(d)


def test_the_elastic_budget_counts_n_devices_per_tp_n_instance():
    apps = [ElasticApp(app="big", demand=3, devices=4), ElasticApp(app="small", demand=4)]
    plan = scale(apps, 12, ScalingState(), ScalingConfig())
    counts = {a.app: a.count for a in plan.apps}
    assert plan.asked == 16 and plan.compressed
    assert counts["big"] * 4 + counts["small"] <= 12 and plan.given == counts["big"] * 4 + counts["small"]
    assert counts["big"] >= 1 and counts["small"] >= 1
    # enough devices: each its own
    plan = scale(apps, 16, ScalingState(), ScalingConfig())
    assert {a.app: a.count for a in plan.apps} == {"big": 3, "small": 4} and plan.given == 16
    # tp 1 everywhere: the instance rule as before (budget = instances)
    plan = scale([ElasticApp(app="x", demand=5), ElasticApp(app="y", demand=5)], 6, ScalingState(), ScalingConfig())
    assert sum(a.count for a in plan.apps) == 6
    # BlitzScale's first come: by name, a tp-4 instance takes four devices
    fc = first_come(apps, 10, ScalingState())
    assert {a.app: a.count for a in fc.apps} == {"big": 2, "small": 2} and fc.given == 10


def test_the_room_budget_holds_groups_of_devices():
    """m0 (tp 4) asks 3 instances, m1 (tp 1) 4, on 12 devices: what is given fits them."""
    from janusd.config import ControlConfig
    from janusd.control.room import ControlRoom

    snap, _ = _world([(4, 3.0, 1), (1, 4.0, 1)], 12)
    room = ControlRoom(ControlConfig(managed=True))
    views = {n: ModelView(name=m.name, instances=m.instances, window=m.window, tp=m.tp, pool="elastic")
             for n, m in snap.models.items()}  # both pinned elastic
    snap = ControlSnapshot(models=views, n_devices=12, pool=snap.pool, predictor=snap.predictor)
    ops = room.plan_fast(snap, 1.0)
    ops += room.plan_fast(snap, 1.5)  # the debounce's second plan
    plan = room.last_scaling
    assert plan is not None and plan.budget <= 12
    counts = {a.app: a.count for a in plan.apps}
    assert counts["m0"] * 4 + counts["m1"] <= 12
    used: set[int] = set()
    for m in snap.models.values():
        for lead in m.serving_devices():
            used.update(group(lead, m.tp))
    for op in ops:
        tp = snap.models[op.model].tp
        if op.target == "active":
            assert op.device % tp == 0 and not set(group(op.device, tp)) & used
            used.update(group(op.device, tp))


def test_the_prior_of_a_shard_divides_the_work_and_adds_the_all_reduce():
    spec = presets()["qwen3-32b"].spec
    assert spec is not None
    dev = device_spec("ascend-910c-die")
    z = LoadFeatures(request_rate=2.0, input_token_rate=2000.0, output_token_rate=400.0, input_len_mean=1000.0,
                     input_len_var=0.0, output_len_mean=200.0, output_len_var=0.0)
    one, two = RooflinePrior(spec, dev, 3.0, 0.1), RooflinePrior(spec, dev, 3.0, 0.1, tp=2)
    v1, v2 = one.capacity("m", z).mean, two.capacity("m", z).mean
    assert v2[0] < v1[0] / 1.9  # a shard holds half the weights and KV
    assert one._comm(100.0) == 0.0
    nbytes = 100 * spec.allreduce_bytes_per_token
    latency = spec.tp_collectives_per_step * 2 * dev.link_latency_s  # a ring of 2 hops per collective at tp 2
    assert spec.tp_collectives_per_step == 2 * 64 + 3 and latency > 0
    assert two._comm(100.0) == tp_comm_s(dev, 2, nbytes, spec.tp_collectives_per_step)
    assert two._comm(100.0) == pytest.approx(latency + allreduce_s(nbytes, 2, dev.d2d_bw), rel=1e-12)
    # the performance model charges the same collectives
    arch = presets()["qwen3-32b"]
    perf = PerfModel(dev)
    assert perf.comm_s(arch, 100) == two._comm(100.0)
    assert (arch.allreduce_bytes_per_token, arch.collectives_per_step) == (spec.allreduce_bytes_per_token,
                                                                          spec.tp_collectives_per_step)


def test_a_small_day_with_a_tp_2_model_runs_under_janus_on_whole_groups(monkeypatch):
    from janusd.lifecycle.states import holds_device_memory
    from janusd.sim.cluster import Cluster

    checked = []
    count = Cluster._count_devices

    def check(self, now):  # the devices held are the union of the holding instances' groups
        devs = {d for m in self.core.models().values() for lead, i in m.instances.items()
                if holds_device_memory(i.state) for d in group(lead, m.cfg.tp)}
        assert self._held_now == len(devs), (now, self._held_now, sorted(devs))
        checked.append(len(devs))
        return count(self, now)

    monkeypatch.setattr(Cluster, "_count_devices", check)
    tr = poisson_trace(400, 60.0, {"big": "qwen3-32b", "a": "qwen3-8b", "b": "qwen3-1.7b"}, seed=3,
                       weights=[2, 1, 1], max_in=1500, max_out=200)
    archs = resolve(tr.models)
    cluster, out = simulate(tr, archs, 8, "janus")
    assert out["token_attainment"] > 0.5
    big = tr.apps.index("big")
    assert float(per_app(cluster)["token_attainment"][big]) > 0.5
    # every instance of the tp 2 model sat on an aligned pair nobody else held
    leads = [d for d, i in cluster.core.models()["big"].instances.items()]
    assert leads and all(d % 2 == 0 for d in leads)
    assert all(sum(1 for n in spans.values() if n) <= 1 for spans in cluster._spans.values())
    assert checked and max(checked) <= 8
    assert np.isfinite(out["device_hours"]) and out["device_hours"] > 0


def test_a_pool_without_a_free_group_for_a_tp_model_is_refused_by_name():
    import pytest

    tr = poisson_trace(20, 10.0, {"big": "llama3-70b", "a": "qwen3-8b"}, seed=1, max_in=500, max_out=50)
    with pytest.raises(ValueError, match="no free aligned group of 4 devices"):
        simulate(tr, resolve(tr.models), 3, "janus")


def test_a_draining_group_keeps_its_devices_from_others():
    snap, _ = _world([(2, 1.0, 0), (1, 1.0, 1)], 6)
    m0 = snap.models["m0"]
    views = dict(snap.models)
    views["m0"] = ModelView(name="m0", instances={2: InstanceView(device=2, state=S.DRAINING)}, window=m0.window, tp=2)
    snap = ControlSnapshot(models=views, n_devices=6, pool=snap.pool, predictor=snap.predictor)
    free = free_elastic_devices(snap.pool, [], {}, snap.models.values())
    assert 2 not in free and 3 not in free and free == [1, 4, 5]  # m1 serves on 0
    ps, _ = placement_snapshot(snap, DemandConfig(), [], {})
    assert 2 not in ps.pool and 3 not in ps.pool
