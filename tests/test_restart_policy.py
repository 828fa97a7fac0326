"""server/restart_policy.py: back-off, the budget per window, the reset after a stable period."""

from __future__ import annotations

import pytest

from janusd.server.restart_policy import RestartBudget


def test_back_off_doubles_up_to_the_cap_and_the_budget_gives_up():
    b = RestartBudget(budget=4, window_s=60.0, first_delay_s=0.2, max_delay_s=1.0)
    assert [b.on_death(t) for t in (0.0, 1.0, 2.0, 3.0)] == [0.2, 0.4, 0.8, 1.0]
    assert b.on_death(4.0) is None  # a fifth death within 60 s: the device is failed


def test_a_stable_period_resets_budget_and_back_off():
    b = RestartBudget(budget=2, window_s=10.0, first_delay_s=0.5)
    assert b.on_death(0.0) == 0.5 and b.on_death(1.0) == 1.0
    assert b.recent(5.0) == 2
    assert b.on_death(11.5) == 0.5  # both earlier deaths are out of the window
    assert b.recent(11.5) == 1


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_the_budget_is_exact(budget):
    b = RestartBudget(budget=budget, window_s=100.0)
    delays = [b.on_death(float(t)) for t in range(budget + 1)]
    assert all(d is not None for d in delays[:budget]) and delays[budget] is None
