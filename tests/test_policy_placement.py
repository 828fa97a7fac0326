"""Steady placement (policy/placement.py): PAPER.md's example vectors, feasibility and
budget properties over random snapshots, the Phi choice against a brute-force scan, and
the bin count against the exact optimum (scipy HiGHS MILP, policy/placement_exact.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.policy.bins import FIT_EPS
from janusd.policy.placement import PlacementError, pack, plan
from janusd.policy.placement_exact import lower_bound, min_bins
from janusd.policy.policy_config import PlacementConfig
from janusd.policy.snapshot import Assignment, PlacementPlan, PlacementSnapshot, SteadyItem

A = (0.65, 0.15, 0.20)
B = (0.20, 0.55, 0.30)
CFG = PlacementConfig()


def item(key: str, v, pinned: int | None = None) -> SteadyItem:
    return SteadyItem(key=key, model=key.split("#")[0], vector=tuple(map(float, v)), pinned_device=pinned)


def phi(x) -> float:
    m = sum(x) / 3
    return sum((a - m) ** 2 for a in x)


def where(p: PlacementPlan) -> dict[str, int]:
    return {a.key: a.device for a in p.assignment}


# ---- PAPER.md's example -----------------------------------------------------------

def test_paper_example_a_and_b_share_one_device():
    p = plan(PlacementSnapshot(pool=(0, 1), items=(item("A", A), item("B", B))), CFG, consolidate=False)
    assert where(p) == {"A": 0, "B": 0}
    assert p.bins_used == 1
    (d,) = p.devices
    assert d.load == pytest.approx((0.85, 0.70, 0.50))
    assert d.phi == pytest.approx(phi((0.85, 0.70, 0.50)))


def test_hbm_over_one_never_fits_however_little_compute():
    c = (0.40, 0.01, 0.01)  # A + C: hbm 1.05
    p = plan(PlacementSnapshot(pool=(0, 1), items=(item("A", A), item("C", c))), CFG, consolidate=False)
    assert where(p)["A"] != where(p)["C"]
    assert p.bins_used == 2


def test_new_model_goes_where_phi_changes_least_and_opens_a_device_only_when_none_fits():
    # device 0 holds A (hbm-heavy), device 1 holds C (compute-heavy); B is compute-heavy
    c = (0.10, 0.40, 0.10)
    cur = (Assignment(key="A", device=0), Assignment(key="C", device=1))
    items = (item("A", A), item("C", c), item("B", (0.1, 0.3, 0.2)))
    p = plan(PlacementSnapshot(pool=(0, 1, 2), items=items, current=cur), CFG, consolidate=False)
    dphi = {0: phi((0.75, 0.45, 0.40)) - phi(A), 1: phi((0.2, 0.7, 0.3)) - phi(c)}
    assert where(p)["B"] == min(dphi, key=dphi.get) == 0
    (mv,) = p.moves
    assert (mv.kind, mv.key, mv.src, mv.dst, mv.forced) == ("place", "B", None, 0, True)
    assert "least Phi change" in mv.reason
    big = item("D", (0.95, 0.1, 0.1))  # A + D and C + D: hbm > 1
    p2 = plan(PlacementSnapshot(pool=(0, 1, 2), items=items[:2] + (big,), current=cur), CFG, consolidate=False)
    assert where(p2)["D"] == 2 and "opened a device" in p2.moves[0].reason


def test_a_new_device_is_a_free_one_before_one_elastic_instances_hold():
    items = (item("A", A), item("D", (0.95, 0.1, 0.1)))
    p = plan(PlacementSnapshot(pool=(0, 1, 2, 3), items=items, current=(Assignment(key="A", device=0),),
                               elastic_devices=(1, 2)), CFG, consolidate=False)
    assert where(p)["D"] == 3
    p = plan(PlacementSnapshot(pool=(0, 1, 2), items=items, current=(Assignment(key="A", device=0),),
                               elastic_devices=(1, 2)), CFG, consolidate=False)
    assert where(p)["D"] == 1  # steady has priority: it takes an elastic device when no free one is left


def test_a_vector_over_one_device_is_unplaced_with_its_reason():
    p = plan(PlacementSnapshot(pool=(0,), items=(item("X", (1.2, 0.1, 0.1)),)), CFG, consolidate=False)
    assert p.assignment == ()
    assert p.unplaced[0].key == "X" and "hbm 1.20" in p.unplaced[0].reason


def test_bad_snapshots_are_refused_by_name():
    with pytest.raises(PlacementError, match="'A' appears twice"):
        plan(PlacementSnapshot(pool=(0,), items=(item("A", A), item("A", B))), CFG, consolidate=False)
    with pytest.raises(PlacementError, match="'A': vector"):
        plan(PlacementSnapshot(pool=(0,), items=(item("A", (float("nan"), 0, 0)),)), CFG, consolidate=False)
    with pytest.raises(PlacementError, match="'A': vector"):
        plan(PlacementSnapshot(pool=(0,), items=(item("A", (-0.1, 0, 0)),)), CFG, consolidate=False)


# ---- departures, overload, consolidation ---------------------------------------------

def test_a_departure_that_frees_a_device_repacks_it():
    x = (0.3, 0.3, 0.3)
    items = (item("P", (0.5, 0.1, 0.1)), item("Q", (0.3, 0.1, 0.1)))
    cur = (Assignment(key="P", device=0), Assignment(key="Q", device=1), Assignment(key="X", device=1, vector=x))
    p = plan(PlacementSnapshot(pool=(0, 1), items=items, current=cur), CFG, consolidate=False)
    assert [(m.kind, m.key, m.src, m.dst, m.forced, m.bins_freed) for m in p.moves] == [
        ("remove", "X", 1, None, True, 0), ("migrate", "Q", 1, 0, False, 1)]
    assert "repack after X left" in p.moves[1].reason
    assert p.bins_used == 1 and p.migrations == 1
    # with no budget left, the departure alone
    p0 = plan(PlacementSnapshot(pool=(0, 1), items=items, current=cur), CFG, consolidate=False, migrations_left=0)
    assert [m.kind for m in p0.moves] == ["remove"] and p0.bins_used == 2


def test_a_small_departure_below_the_threshold_moves_nothing():
    items = (item("P", (0.6, 0.2, 0.1)), item("Q", (0.2, 0.6, 0.1)), item("R", (0.3, 0.3, 0.8)))
    cur = (Assignment(key="P", device=0), Assignment(key="Q", device=0), Assignment(key="R", device=1),
           Assignment(key="S", device=1, vector=(0.01, 0.01, 0.02)))
    p = plan(PlacementSnapshot(pool=(0, 1), items=items, current=cur), CFG, consolidate=False)
    assert [m.kind for m in p.moves] == ["remove"]


def test_a_grown_vector_evicts_the_largest_in_the_overfull_dimension():
    items = (item("P", (0.5, 0.2, 0.1)), item("Q", (0.3, 0.7, 0.1)), item("R", (0.1, 0.2, 0.1)))
    cur = (Assignment(key="P", device=0), Assignment(key="Q", device=0), Assignment(key="R", device=0))
    p = plan(PlacementSnapshot(pool=(0, 1), items=items, current=cur), CFG, consolidate=False)
    forced = [m for m in p.moves if m.forced]
    assert [(m.key, m.src, m.dst) for m in forced] == [("Q", 0, 1)]
    assert "over capacity in compute (1.10)" in forced[0].reason


def test_consolidation_frees_the_device_that_costs_fewest_moves():
    items = (item("P", (0.4, 0.1, 0.1)), item("Q", (0.1, 0.4, 0.1)), item("R", (0.1, 0.1, 0.4)),
             item("S", (0.2, 0.2, 0.2)))
    cur = tuple(Assignment(key=k, device=d) for k, d in (("P", 0), ("Q", 0), ("R", 1), ("S", 2)))
    snap = PlacementSnapshot(pool=(0, 1, 2), items=items, current=cur)
    p = plan(snap, CFG, consolidate=True)
    assert p.bins_used == 1 and p.migrations == 2
    assert all(not m.forced and m.reason.startswith("consolidation") for m in p.moves)
    assert sum(m.bins_freed for m in p.moves) == 2
    assert plan(snap, CFG, consolidate=True, migrations_left=1).migrations == 1
    assert plan(snap, CFG, consolidate=False).moves == ()


def test_a_device_leaving_the_pool_moves_its_models_and_pinned_ones_stay():
    items = (item("P", (0.3, 0.3, 0.3)), item("K", (0.5, 0.5, 0.5), pinned=0))
    cur = (Assignment(key="P", device=3),)
    p = plan(PlacementSnapshot(pool=(0, 1), items=items, current=cur), CFG, consolidate=True)
    assert where(p) == {"K": 0, "P": 0}
    assert p.moves[0].reason.startswith("device 3 left the steady pool")


def test_pinned_items_overfilling_a_device_are_reported_and_nothing_is_added():
    items = (item("K1", (0.7, 0.1, 0.1), pinned=0), item("K2", (0.6, 0.1, 0.1), pinned=0), item("P", (0.1, 0.1, 0.1)))
    p = plan(PlacementSnapshot(pool=(0, 1), items=items), CFG, consolidate=True)
    assert p.overloaded == (0,)
    assert where(p)["P"] == 1


# ---- properties ----------------------------------------------------------------------

_val = st.integers(0, 16).map(lambda k: k * 0.05)
_vec = st.tuples(_val, _val, _val)


@st.composite
def snapshots(draw):
    n_dev = draw(st.integers(1, 10))
    pool = tuple(sorted(draw(st.sets(st.integers(0, 11), min_size=1, max_size=n_dev))))
    n = draw(st.integers(0, 14))
    items, current = [], []
    for k in range(n):
        v = draw(_vec)
        pinned = draw(st.one_of(st.none(), st.integers(0, 11))) if draw(st.integers(0, 5)) == 0 else None
        items.append(item(f"m{k}", v, pinned))
        if pinned is None and draw(st.booleans()):
            current.append(Assignment(key=f"m{k}", device=draw(st.integers(0, 11))))
    for k in range(draw(st.integers(0, 3))):  # leavers
        current.append(Assignment(key=f"gone{k}", device=draw(st.sampled_from(pool)), vector=draw(_vec)))
    return PlacementSnapshot(pool=pool, items=tuple(items), current=tuple(current))


def replay(snap: PlacementSnapshot, p: PlacementPlan) -> None:
    """Execute the moves in order from the snapshot's state: forced moves first reach a
    feasible pool, every optional move keeps it feasible, and the end is the plan."""
    items = {i.key: i for i in snap.items}
    load: dict[int, np.ndarray] = {}
    pos: dict[str, int] = {}

    def put(k, d, v):
        pos[k] = d
        load[d] = load.get(d, np.zeros(3)) + np.asarray(v)

    for it in snap.items:
        if it.pinned_device is not None:
            put(it.key, it.pinned_device, it.vector)
    vec = {k: it.vector for k, it in items.items()}
    for a in snap.current:
        if a.key in items and items[a.key].pinned_device is None:
            put(a.key, a.device, vec[a.key])
    pinned_only = {d for d in load if all(items[k].pinned_device is not None for k in pos if pos[k] == d)}

    def feasible():
        return all((x <= 1 + FIT_EPS).all() for d, x in load.items() if d not in p.overloaded)

    seen_optional = False
    for m in p.moves:
        if m.key in items and items[m.key].pinned_device is not None:
            assert m.forced and m.dst == items[m.key].pinned_device
            continue
        if m.src is not None and m.key in pos:
            load[m.src] = load[m.src] - np.asarray(vec[m.key])
            del pos[m.key]
        if not m.forced:  # an optional move never opens a device
            assert m.dst in pos.values() and m.dst != m.src
        if m.dst is not None:
            put(m.key, m.dst, vec[m.key])
        if not m.forced:
            seen_optional = True
            assert feasible()
        else:
            assert not seen_optional, "forced moves come first"
    assert feasible()
    assert pos == where(p)
    assert all(d in snap.pool or d in pinned_only or any(items[k].pinned_device == d for k in pos)
               for d in set(pos.values()))


@given(snapshots(), st.booleans(), st.integers(0, 6))
@settings(max_examples=150)
def test_every_plan_is_feasible_within_budget_and_replays(snap, consolidate, budget):
    p = plan(snap, CFG, consolidate=consolidate, migrations_left=budget)
    for d in p.devices:
        if d.device in p.overloaded:
            assert all(next(i for i in snap.items if i.key == k).pinned_device == d.device for k in d.keys)
        else:
            assert all(x <= 1 + FIT_EPS for x in d.load)
    optional = [m for m in p.moves if not m.forced]
    assert len(optional) == p.migrations <= budget
    placed = where(p)
    unplaced = {u.key for u in p.unplaced}
    for it in snap.items:
        if it.pinned_device is not None:
            assert placed[it.key] == it.pinned_device  # a pinned model never moves
        else:
            assert (it.key in placed) != (it.key in unplaced)
            if it.key in placed:
                assert placed[it.key] in snap.pool
    replay(snap, p)


@given(snapshots(), st.booleans(), st.randoms(use_true_random=False))
@settings(max_examples=60)
def test_plan_is_deterministic_whatever_the_input_order(snap, consolidate, rnd):
    p1 = plan(snap, CFG, consolidate=consolidate)
    items, cur = list(snap.items), list(snap.current)
    rnd.shuffle(items)
    rnd.shuffle(cur)
    p2 = plan(PlacementSnapshot(pool=snap.pool[::-1], items=tuple(items), current=tuple(cur)), CFG,
              consolidate=consolidate)
    assert p1 == p2


@given(snapshots())
@settings(max_examples=40)
def test_repeated_consolidation_settles_without_ping_pong(snap):
    """Fed its own output every period, consolidation reaches a plan with no optional
    move: every move frees a device or lowers the summed Phi by min_phi_gain."""
    cur = snap
    for _ in range(60):
        p = plan(cur, CFG, consolidate=True)
        if p.migrations == 0 and all(m.kind != "migrate" or m.forced for m in p.moves):
            break
        for m in p.moves:  # a step of emptying a device, or a balancing move worth min_phi_gain
            assert m.forced or "freed" in m.reason or "fits on used devices" in m.reason or \
                m.phi_gain >= CFG.min_phi_gain - 1e-9
        managed = tuple(a for a in p.assignment if next(i for i in cur.items if i.key == a.key).pinned_device is None)
        cur = PlacementSnapshot(pool=cur.pool, items=cur.items, current=managed)
    else:
        pytest.fail("consolidation never settled")


@given(st.lists(_vec, min_size=1, max_size=6), _vec)
@settings(max_examples=100)
def test_a_single_new_model_takes_the_brute_force_phi_minimum(existing, new):
    """Each existing vector alone on device i; the new one goes to the used device that
    fits with the least Phi change (lowest id on a tie), else the first empty device."""
    existing = [v for v in existing if max(v) <= 1.0]
    items = tuple(item(f"e{i}", v) for i, v in enumerate(existing)) + (item("new", new),)
    cur = tuple(Assignment(key=f"e{i}", device=i) for i in range(len(existing)))
    pool = tuple(range(len(existing) + 1))
    p = plan(PlacementSnapshot(pool=pool, items=items, current=cur), CFG, consolidate=False, migrations_left=0)
    scan = []
    for i, v in enumerate(existing):
        s = tuple(a + b for a, b in zip(v, new))
        if max(s) <= 1 + FIT_EPS:
            scan.append((phi(s) - phi(v), i))
    if max(new) > 1:
        assert "new" not in where(p)
    elif scan:
        best = min(scan)
        chosen = where(p)["new"]
        assert chosen < len(existing)
        got = phi(tuple(a + b for a, b in zip(existing[chosen], new))) - phi(existing[chosen])
        assert got == pytest.approx(best[0], abs=1e-12)
        assert chosen == min(i for d, i in scan if abs(d - best[0]) <= 1e-12 or i == chosen)
    else:
        assert where(p)["new"] == len(existing)


# ---- against the exact optimum ------------------------------------------------------

def _instance(rng: random.Random, n: int, kind: int) -> list[tuple[float, float, float]]:
    out = []
    for _ in range(n):
        if kind == 0:  # uniform
            v = (rng.uniform(0.05, 0.7), rng.uniform(0.05, 0.7), rng.uniform(0.05, 0.7))
        elif kind == 1:  # on a 0.01 grid: exact fills are common
            v = tuple(round(rng.uniform(0.05, 0.6), 2) for _ in range(3))
        else:  # complementary: HBM-heavy or compute-heavy, like PAPER.md's A and B
            a = rng.uniform(0.4, 0.8)
            v = (a, rng.uniform(0.05, 0.4), rng.uniform(0.05, 0.4)) if rng.random() < 0.5 else \
                (rng.uniform(0.05, 0.3), a, rng.uniform(0.1, 0.5))
        out.append(v)
    return out


def test_bins_are_within_one_of_the_exact_optimum_and_usually_equal():
    """300 random instances of 2..12 vectors: the heuristic's device count against the
    HiGHS MILP optimum. Measured when written: 299/300 equal, 1 one device over (plain
    first-fit decreasing with the Phi rule alone: 293/300)."""
    rng = random.Random(2)
    gaps = []
    for t in range(300):
        vs = _instance(rng, rng.randint(2, 12), t % 3)
        heuristic = len(set(pack(vs)))
        exact = min_bins(vs, upper=heuristic)
        assert lower_bound(vs) <= exact <= heuristic
        gaps.append(heuristic - exact)
    assert max(gaps) <= 1
    assert sum(g == 0 for g in gaps) >= 0.99 * len(gaps)


def test_exact_solver_agrees_with_brute_force_on_tiny_instances():
    rng = random.Random(5)
    for _ in range(40):
        vs = _instance(rng, rng.randint(1, 6), rng.randint(0, 2))
        best = len(vs)
        # brute force: every assignment of vector i to a device <= i (restricted growth)
        def go(i, loads):
            nonlocal best
            if len(loads) >= best:
                return
            if i == len(vs):
                best = len(loads)
                return
            for j in range(len(loads) + 1):
                if j == len(loads):
                    go(i + 1, loads + [vs[i]])
                else:
                    s = tuple(a + b for a, b in zip(loads[j], vs[i]))
                    if max(s) <= 1 + FIT_EPS:
                        go(i + 1, loads[:j] + [s] + loads[j + 1:])
        go(0, [])
        assert min_bins(vs) == best


def test_at_paper_size_a_slow_tick_frees_one_device_per_migration():
    """768 devices, 300 instances one per device (a spread-out pool): the 30 s tick spends
    its 8 migrations on emptying 8 single-instance devices, and stays feasible."""
    rng = random.Random(3)
    items = tuple(item(f"app{k % 62:02d}#{k}", tuple(rng.uniform(0.02, 0.3) for _ in range(3))) for k in range(300))
    cur = tuple(Assignment(key=it.key, device=k) for k, it in enumerate(items))
    p = plan(PlacementSnapshot(pool=tuple(range(768)), items=items, current=cur), CFG, consolidate=True)
    assert p.migrations == CFG.migration_budget == 8
    assert p.bins_used == 300 - 8
    assert all(m.bins_freed == 1 and m.reason.startswith("consolidation") for m in p.moves)
    assert all(max(d.load) <= 1 + FIT_EPS for d in p.devices)
