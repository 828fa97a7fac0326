"""The simulated Janus controller: the daemon's policy functions (no copies), a burst that
Janus absorbs and a static split does not, the baselines' defining rules."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import janusd.sim as sim_pkg
from janusd.policy import classify, demand, placement, scaling
from janusd.sim import sim_oracle as ctl
from janusd.sim.run import per_app, simulate
from janusd.sim.specs import resolve
from janusd.trace.formats import Trace


def burst_trace(seed: int = 0) -> Trace:
    """Four qwen3-8b apps over 60 s: three at 1 req/s, `hot` at 2 req/s with a 20 s burst
    to 60 req/s from t = 20 s."""
    rng = np.random.default_rng(seed)
    times, apps = [], []
    for app, rate in (("a", 1.0), ("b", 1.0), ("c", 1.0), ("hot", 2.0)):
        t = np.sort(rng.uniform(0, 60, rng.poisson(rate * 60)))
        times.append(t)
        apps += [app] * len(t)
    burst = np.sort(rng.uniform(20, 40, rng.poisson(58 * 20)))
    times.append(burst)
    apps += ["hot"] * len(burst)
    t = np.concatenate(times)
    order = np.argsort(t, kind="stable")
    n = len(t)
    return Trace.build(t[order], [apps[i] for i in order], ["qwen3-8b"] * n, rng.integers(100, 1000, n)[order],
                       rng.integers(50, 250, n)[order])


@pytest.fixture(scope="module")
def burst_runs():
    tr = burst_trace()
    return tr, {p: simulate(tr, resolve(tr.models), 8, p) for p in ("janus", "static")}


def test_a_burst_is_absorbed_by_janus_not_by_static(burst_runs):
    tr, runs = burst_runs
    hot = tr.apps.index("hot")
    att = {p: float(per_app(c)["token_attainment"][hot]) for p, (c, _) in runs.items()}
    assert att["static"] < 0.88  # its two devices cannot carry 60 req/s
    assert att["janus"] > 0.92 and att["janus"] > att["static"] + 0.07
    assert runs["janus"][1]["token_attainment"] > runs["static"][1]["token_attainment"] + 0.06
    # and Janus held fewer device-hours than the static split, which holds all 8 throughout
    assert runs["janus"][1]["device_hours"] < runs["static"][1]["device_hours"]


def test_the_controller_calls_the_daemons_policy_functions(monkeypatch):
    from janusd.control import room, steady, steady_snapshot

    assert room.classify_apps is classify.classify and room.scale is scaling.scale
    assert room.elastic_demand is demand.elastic_demand and steady.placement_plan is placement.plan
    calls = {"classify": 0, "plan": 0, "scale": 0, "elastic_demand": 0, "steady_items": 0}

    def spy(mod, name, where=()):
        real = getattr(mod, name)

        def wrapped(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        monkeypatch.setattr(mod, name, wrapped)
        for m, attr in where:  # the room imported the function by name
            monkeypatch.setattr(m, attr, wrapped)

    spy(classify, "classify", [(room, "classify_apps")])
    spy(placement, "plan", [(steady, "placement_plan")])
    spy(scaling, "scale", [(room, "scale")])
    spy(demand, "elastic_demand", [(room, "elastic_demand")])
    spy(demand, "steady_items", [(steady_snapshot, "steady_items")])
    tr = burst_trace(1)
    simulate(tr, resolve(tr.models), 8, "janus")
    assert all(v > 0 for v in calls.values()), calls
    # and no module of the simulator defines a function by a policy's name
    policy_names = {"classify", "plan", "scale", "elastic_demand", "steady_items", "residency", "debounce",
                    "quota_method", "apportion", "traffic_from_counts", "pack"}
    for f in Path(sim_pkg.__file__).parent.glob("*.py"):
        defined = {n.name for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.FunctionDef)}
        assert not (defined & policy_names), f"{f.name} defines {defined & policy_names}"


def test_baselines_keep_their_rules(burst_runs):
    tr = burst_trace()
    archs = resolve(tr.models)
    steady, s_steady = simulate(tr, archs, 8, "steady-only")
    elastic, s_elastic = simulate(tr, archs, 8, "elastic-only")
    # steady-only pins every app steady (no extra replica ever), elastic-only every app
    # elastic (the classifier's pin: its steady instance plus extras, the daemon's rule)
    for c in (steady, elastic):
        assert c.outcome_counts.get("ok", 0) > 0
    assert all(m.cfg.pool == "steady" for m in steady.core.registry.models.values())
    assert all(m.cfg.pool == "elastic" for m in elastic.core.registry.models.values())
    assert s_steady["device_hours"] < burst_runs[1]["static"][1]["device_hours"]


def test_deepseek_v3_runs_under_janus_as_tp16_groups():
    """The MoE preset has a spec now (hw/model_spec.py counts its experts and MLA), so the
    controller plans it: 32 devices hold two aligned tp 16 groups, and the requests are served."""
    n = 6
    tr = Trace.build(np.arange(n, dtype=float) * 0.5, ["a"] * n, ["deepseek-v3"] * n, np.full(n, 200), np.full(n, 20))
    cluster, summary = simulate(tr, resolve(tr.models), 32, "janus")
    assert cluster.outcome_counts.get("ok", 0) == n, cluster.outcome_counts
    assert summary["token_attainment"] == 1.0
