"""The policies composed the way the controller's shell will run them (DESIGN.md
"Controller policies"), on a 16-device pool with 8 apps and the closed-form predictors
of policy_fakes.py: one app bursts, goes elastic, gets its m* while the steady pool
repacks without it, and comes back to the steady pool after quiet_s. Pure: time is a
counter, plans are fed back as the next snapshot, as an execution that always succeeds."""

from __future__ import annotations

import math

from janusd.policy.classify import classify
from janusd.policy.demand import SteadyModel, elastic_demand, steady_items
from janusd.policy.placement import plan
from janusd.policy.policy_config import ControllerConfig
from janusd.policy.scaling import scale
from janusd.policy.snapshot import AppTraffic, Assignment, ElasticApp, PlacementSnapshot, ScalingState
from policy_fakes import LinearCapacity, LogisticAttainment, load

CFG = ControllerConfig()
POOL = tuple(range(16))
BASE = {f"app{k}": 0.5 + 0.25 * k for k in range(8)}  # requests/s: all below elastic_rate


def rate_at(app: str, t: float) -> float:
    """app3 bursts 10x from t=60 s to t=180 s."""
    return BASE[app] * (10.0 if app == "app3" and 60.0 <= t < 180.0 else 1.0)


def test_a_burst_goes_elastic_and_comes_back_after_quiet_s():
    cap, ela = LinearCapacity(), LogisticAttainment()
    pools: tuple = ()
    current: tuple[Assignment, ...] = ()
    scaling = ScalingState()
    history = []
    steady_bins = 0
    for tick in range(0, 2 * 420):  # fast ticks every 0.5 s, a slow tick every 30 s
        now = tick * 0.5
        if tick % 60 == 0:
            traffic = [AppTraffic(app=a, rate=rate_at(a, now), peak_rate=rate_at(a, now)) for a in sorted(BASE)]
            c = classify(traffic, pools, now, CFG.classify)
            pools = c.state
            steady = [SteadyModel(model=p.app, load=load(rate_at(p.app, now))) for p in pools if p.pool == "steady"]
            items = tuple(i for d in steady_items(steady, cap, CFG.demand) for i in d.items)
            p = plan(PlacementSnapshot(pool=POOL, items=items, current=current), CFG.placement, consolidate=True)
            assert not p.unplaced and all(max(d.load) <= 1 + 1e-9 for d in p.devices)
            assert p.migrations <= CFG.placement.migration_budget
            current = p.assignment
            steady_bins = p.bins_used
        elastic = [e.app for e in pools if e.pool == "elastic"]
        demands = [ElasticApp(app=a, demand=elastic_demand(a, load(rate_at(a, now)), ela, CFG.demand)[0])
                   for a in elastic]
        s = scale(demands, len(POOL) - steady_bins, scaling, CFG.scaling)
        scaling = s.state
        assert s.given <= len(POOL) - steady_bins
        counts = {a.app: a.count for a in s.apps}
        history.append((now, "app3" in elastic, counts.get("app3", 0), {a.key for a in current}))
    # steady before the burst; elastic from the first slow tick that sees it (t = 60 s)
    assert all(not el for t, el, _, _ in history if t < 60.0)
    assert all(el for t, el, _, _ in history if 60.0 <= t < 180.0)
    # while elastic it is not in the steady pool, and it gets m* once the debounce lets it
    m_star = elastic_demand("app3", load(BASE["app3"] * 10), ela, CFG.demand)[0]
    assert m_star > 1
    during = [(t, n, keys) for t, el, n, keys in history if 60.0 <= t < 180.0]
    assert all("app3" not in keys for _, _, keys in during)
    assert [n for t, n, _ in during if t >= 61.0] == [m_star] * len([t for t, _, _ in during if t >= 61.0])
    # the burst ends at 180 s: quiet from the 180 s tick, back after quiet_s (at 300 s)
    back = min(t for t, el, _, _ in history if t >= 180.0 and not el)
    assert back == 180.0 + math.ceil(CFG.classify.quiet_s / 30.0) * 30.0
    assert all("app3" in keys for t, el, _, keys in history if t >= back)
