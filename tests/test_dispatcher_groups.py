"""The Dispatcher binding's device groups, plan option and check_integrity: one EPDT per
group across models, the global plan's late binding (vs plan="window"), and the
integrity check through Python."""

from __future__ import annotations

import pytest

from janusd._native import Dispatcher


def test_plan_option_and_defaults() -> None:
    assert Dispatcher().plan == "global"
    assert Dispatcher(plan="window").plan == "window"
    assert "plan='global'" in repr(Dispatcher())
    with pytest.raises(ValueError, match="plan must be"):
        Dispatcher(plan="lazy")


def test_a_group_shares_one_epdt_across_models() -> None:
    d = Dispatcher(prepull_window_s=1.0)
    d.add_instance(1, "a", group=0)
    d.add_instance(2, "b", 0)
    d.add_instance(3, "b")  # group=None: a group of its own (id 3)
    d.submit(10, "a", 0.0, 10.0, 0.3)
    d.submit(11, "a", 0.0, 10.0, 0.3)
    assert d.tick(0.0) == [(10, 1), (11, 1)]
    assert d.epdt(2, 0.0) == pytest.approx(0.6)  # model a's work, same device
    assert d.epdt(3, 0.0) == 0.0
    d.check_integrity()
    # Removing instance 1 hands its jobs back and takes their work off the group.
    assert d.remove_instance(1) == [10, 11]
    assert d.epdt(2, 0.0) == 0.0
    d.check_integrity()


def test_the_urgent_model_gets_a_shared_group_first() -> None:
    d = Dispatcher(prepull_window_s=0.02)
    d.add_instance(1, "a", group=0)
    d.add_instance(2, "b", group=0)
    d.submit(10, "a", 0.0, 1.0, 0.1)
    d.submit(20, "b", 0.0, 0.5, 0.1)  # b's deadline is earlier: b goes first
    assert d.tick(0.0) == [(20, 2)]
    wake = d.next_wakeup(0.0)
    assert wake == pytest.approx(0.08)
    assert d.tick(wake) == [(10, 1)]
    d.check_integrity()


def _loose_backlog(plan: str) -> Dispatcher:
    d = Dispatcher(prepull_window_s=0.02, plan=plan)
    for i in (1, 2, 3):
        d.add_instance(i, "m")
    for r in range(30):
        d.submit(r, "m", 0.0, 1.0, 0.01)
    return d


def test_global_plan_spreads_and_late_binds_a_loose_backlog() -> None:
    d = _loose_backlog("global")
    first = d.tick(0.0)
    assert sorted(i for _, i in first) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    # Run it out: ticks only at next_wakeup, each job completing at its estimate
    # (an instance runs its jobs back to back in the order given).
    busy: dict[int, float] = {1: 0.0, 2: 0.0, 3: 0.0}
    finish: dict[int, float] = {}
    for rid, i in first:
        busy[i] += 0.01
        finish[rid] = busy[i]
    count = {1: 3, 2: 3, 3: 3}
    now = 0.0
    for _ in range(1000):
        wake = d.next_wakeup(now)
        nxt = min([wake if wake is not None else float("inf")] + list(finish.values()))
        if nxt == float("inf"):
            break
        now = max(now, nxt)
        for r in [r for r, f in finish.items() if f <= now]:
            d.complete(r, now)
            del finish[r]
        wake = d.next_wakeup(now)
        if wake is not None and wake <= now:
            for r, i in d.tick(now):
                busy[i] = max(busy[i], now) + 0.01
                finish[r] = busy[i]
                count[i] += 1
        d.check_integrity()
    assert sum(count.values()) == 30 and all(9 <= n <= 11 for n in count.values()), count
    s = d.stats()
    assert (s["completed"], s["pending"], s["rejected"]) == (30, 0, 0)


def test_window_plan_gives_a_loose_backlog_to_one_instance() -> None:
    d = _loose_backlog("window")
    assert d.tick(0.0) == [(r, 1) for r in range(30)]
    d.check_integrity()
