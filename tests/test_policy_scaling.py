"""Elastic scaling (policy/scaling.py): largest remainder sums to the budget and keeps
the quota rule, the debounce stops flapping on oscillating demands, P/D splits."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.policy.policy_config import ScalingConfig
from janusd.policy.scaling import ScalingError, debounce, largest_remainder, scale
from janusd.policy.snapshot import ElasticApp, ScalingState

CFG = ScalingConfig()


def apps(*demands: int, share: float = 0.5) -> list[ElasticApp]:
    return [ElasticApp(app=f"a{i:02d}", demand=d, prefill_share=share) for i, d in enumerate(demands)]


def counts(plan) -> list[int]:
    return [a.count for a in plan.apps]


def test_demands_within_budget_are_given_as_asked():
    p = scale(apps(3, 1, 4), 10, ScalingState(), CFG)
    assert counts(p) == [3, 1, 4] and p.given == p.asked == 8 and not p.compressed


def test_compression_is_proportional_with_largest_remainders():
    # budget 7 over 6, 3, 3 (min 1 each): extra 5, 2, 2 share 4 seats: quotas 2.22, 0.89, 0.89
    p = scale(apps(6, 3, 3), 7, ScalingState(), CFG)
    assert counts(p) == [3, 2, 2] and p.given == 7 and p.compressed
    assert "compressed to 3 (budget 7 < asked 12)" in p.apps[0].reason


def test_equal_remainders_go_to_the_app_holding_more_instances_then_the_name():
    a = [ElasticApp(app="x", demand=2, current=0), ElasticApp(app="y", demand=2, current=2)]
    assert counts(scale(a, 3, ScalingState(), CFG)) == [1, 2]
    b = [ElasticApp(app="x", demand=2), ElasticApp(app="y", demand=2)]
    assert counts(scale(b, 3, ScalingState(), CFG)) == [2, 1]


def test_the_alabama_paradox_is_real_and_documented():
    """Hamilton's method is not monotone per app in the budget: classic instance."""
    w = [6, 6, 2]
    assert largest_remainder(w, 10) == [4, 4, 2]
    assert largest_remainder(w, 11) == [5, 5, 1]


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(0, 120), st.integers(0, 3))
@settings(max_examples=300)
def test_counts_sum_to_the_budget_and_keep_the_quota(demands, budget, floor):
    cfg = ScalingConfig(min_instances_per_app=floor)
    p = scale(apps(*demands), budget, ScalingState(), cfg)
    c = counts(p)
    assert all(0 <= x <= d for x, d in zip(c, demands))
    if sum(demands) <= budget:
        assert c == demands and p.given == sum(demands)
    else:
        assert p.given == sum(c) == budget  # exactly the budget
        base = [min(floor, d) for d in demands] if budget >= floor * len(demands) else [0] * len(demands)
        extra = [d - b for d, b in zip(demands, base)]
        seats = budget - sum(base)
        for x, b, e in zip(c, base, extra):
            q = Fraction(e * seats, sum(extra)) if sum(extra) else Fraction(0)
            assert math.floor(q) <= x - b <= math.ceil(q)  # the quota rule
    # total given is monotone in the budget
    assert scale(apps(*demands), budget + 1, ScalingState(), cfg).given >= p.given


@given(st.lists(st.integers(0, 30), min_size=1, max_size=8), st.integers(0, 80))
@settings(max_examples=100)
def test_scaling_is_deterministic_whatever_the_input_order(demands, budget):
    a = apps(*demands)
    assert scale(a, budget, ScalingState(), CFG) == scale(a[::-1], budget, ScalingState(), CFG)


def run(seq: list[int], k: int = 2, budget: int = 1000) -> list[int]:
    cfg = ScalingConfig(debounce_plans=k)
    state, out = ScalingState(), []
    for d in seq:
        p = scale([ElasticApp(app="a", demand=d)], budget, state, cfg)
        state = p.state
        out.append(p.apps[0].count)
    return out


def test_debounce_holds_a_count_that_flips_around_a_threshold():
    assert run([3, 4, 3, 4, 3, 4, 3]) == [3] * 7
    assert run([3, 4, 3, 4, 3, 4, 3], k=1) == [3, 4, 3, 4, 3, 4, 3]  # debounce off: flaps
    # a real change passes after one tick
    assert run([3, 3, 8, 8, 8, 2, 2]) == [3, 3, 3, 8, 8, 8, 2]


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50), st.integers(4, 40))
@settings(max_examples=200)
def test_debounce_changes_at_most_once_on_any_two_value_oscillation(start, a, b, n):
    """Adversarial input: any first value, then a, b, a, b, ... The count may move once
    (into [min(a, b), max(a, b)]) and then never again."""
    out = run([start] + [a, b] * n)
    changes = sum(x != y for x, y in zip(out[1:], out[2:]))
    assert changes <= 1
    assert min(a, b) <= out[-1] <= max(a, b)


@given(st.lists(st.integers(0, 20), min_size=2, max_size=30))
@settings(max_examples=200)
def test_debounced_count_moves_only_when_both_last_demands_agree(seq):
    out = run(seq)
    assert out[0] == seq[0]
    for t in range(1, len(seq)):
        lo, hi = sorted(seq[t - 1 : t + 1])
        if out[t] != out[t - 1]:
            assert out[t] in (lo, hi) and not lo <= out[t - 1] <= hi
        else:
            assert lo <= out[t] <= hi or out[t] == out[t - 1]


def test_debounce_helper():
    assert debounce(None, [5]) == 5
    assert debounce(3, [3, 4]) == 3
    assert debounce(3, [5, 4]) == 4
    assert debounce(6, [5, 4]) == 5


@pytest.mark.parametrize("count,share,expect", [(1, 0.5, (0, 1)), (2, 0.9, (1, 1)), (3, 0.5, (2, 1)),
                                                 (4, 0.3, (1, 3)), (10, 0.34, (3, 7)), (5, 0.0, (1, 4)),
                                                 (5, 1.0, (4, 1))])
def test_pd_split(count, share, expect):
    p = scale([ElasticApp(app="a", demand=count, prefill_share=share)], 100, ScalingState(), CFG)
    a = p.apps[0]
    assert (a.prefill, a.decode) == expect and a.prefill + a.decode == a.count


def test_state_forgets_apps_that_left_and_bad_input_is_refused():
    s = scale(apps(2, 3), 10, ScalingState(), CFG).state
    assert [a for a, _ in scale(apps(2), 10, s, CFG).state.debounced] == ["a00"]
    with pytest.raises(ScalingError, match="budget"):
        scale(apps(1), -1, ScalingState(), CFG)
    with pytest.raises(ScalingError, match="'a00' appears twice"):
        scale(apps(1) + apps(1), 3, ScalingState(), CFG)
    with pytest.raises(ScalingError, match="prefill_share"):
        scale(apps(1, share=1.5), 3, ScalingState(), CFG)
