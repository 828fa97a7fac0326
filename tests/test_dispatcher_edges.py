"""Dispatcher edge cases found in review: the wake-up at a pre-pull window edge that float
rounding used to miss, cancel at a known time, and ints too large for the binding's types.

Each test failed before its fix (see the docstring or comment of each)."""

from __future__ import annotations

import math

import pytest

from janusd._native import Dispatcher


def test_wakeup_at_the_window_edge_finds_the_instance() -> None:
    # busy - (busy - window) > window in floats here: the tick at the wake-up instant used
    # to see the instance outside its window, and the next wake-up was the job's latest
    # start (1e6 s on), so a job that fits was left waiting (and, with a real SLO, rejected).
    busy, window = 38.04812224562878, 0.03
    d = Dispatcher(prepull_window_s=window)
    d.add_instance(1, "m")
    d.submit(1, "m", 0.0, 1e6, busy)
    assert d.tick(0.0) == [(1, 1)]
    d.submit(2, "m", 0.0, 1e6, 0.001)
    assert d.tick(0.0) == []
    wake = d.next_wakeup(0.0)
    assert wake == busy - window
    assert d.tick(wake) == [(2, 1)]


def test_cancel_at_a_time_charges_the_time_the_job_ran() -> None:
    d = Dispatcher(plan="window")  # both jobs at once
    d.add_instance(1, "m")
    d.submit(1, "m", 0.0, 10.0, 1.0)
    d.submit(2, "m", 0.0, 10.0, 1.0)
    assert d.tick(0.0) == [(1, 1), (2, 1)]
    assert d.cancel(1, 0.5)  # ran half its estimate: job 2 starts at 0.5, done at 1.5
    assert d.epdt(1, 0.5) == pytest.approx(1.5)
    assert not d.cancel(1, 0.5)
    with pytest.raises(ValueError, match="now"):
        d.cancel(2, math.nan)
    assert d.stats()["in_flight"] == 1


def test_ints_too_large_raise_value_error() -> None:
    from janusd._native import lst_imh, moore_hodgson

    huge = 10**400
    d = Dispatcher()
    d.add_instance(1, "m")
    calls = [
        lambda: lst_imh([huge], [1.0], [0.0]),
        lambda: lst_imh([1.0], [huge], [0.0]),
        lambda: moore_hodgson([1.0], [1.0], huge),
        lambda: d.submit(2**63, "m", 0.0, 1.0, 0.1),
        lambda: d.submit(1, "m", huge, 1.0, 0.1),
        lambda: d.add_instance(-(2**63) - 1, "m"),
        lambda: d.remove_instance(2**64),
        lambda: d.set_instance_ready(2**64, True),
        lambda: d.complete(2**64, 0.0),
        lambda: d.cancel(2**64),
        lambda: d.cancel(1, huge),
        lambda: d.tick(huge),
        lambda: d.next_wakeup(huge),
        lambda: d.epdt(1, huge),
        lambda: Dispatcher(max_relax=2**64),
        lambda: Dispatcher(prepull_window_s=huge),
    ]
    for call in calls:
        with pytest.raises(ValueError):
            call()
    assert d.stats()["submitted"] == 0
