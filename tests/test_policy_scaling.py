"""Elastic scaling (policy/scaling.py): the quota method sums to the budget, keeps the
quota rule and is monotone in the budget for every app, the debounce stops flapping on
oscillating demands, P/D splits."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.policy.policy_config import ScalingConfig
from janusd.policy.scaling import ScalingError, apportion, debounce, quota_method, scale
from janusd.policy.snapshot import ElasticApp, ScalingState

CFG = ScalingConfig()


def apps(*demands: int, share: float = 0.5) -> list[ElasticApp]:
    return [ElasticApp(app=f"a{i:02d}", demand=d, prefill_share=share) for i, d in enumerate(demands)]


def counts(plan) -> list[int]:
    return [a.count for a in plan.apps]


def test_demands_within_budget_are_given_as_asked():
    p = scale(apps(3, 1, 4), 10, ScalingState(), CFG)
    assert counts(p) == [3, 1, 4] and p.given == p.asked == 8 and not p.compressed


def test_compression_is_proportional_within_quota():
    # budget 7 over 6, 3, 3 (min 1 each): extra 5, 2, 2 share 4 seats: quotas 2.22, 0.89, 0.89
    p = scale(apps(6, 3, 3), 7, ScalingState(), CFG)
    assert counts(p) == [3, 2, 2] and p.given == 7 and p.compressed
    assert "compressed to 3 (budget 7 < asked 12)" in p.apps[0].reason


def test_equal_priorities_go_to_the_app_holding_more_instances_then_the_name():
    a = [ElasticApp(app="x", demand=2, current=0), ElasticApp(app="y", demand=2, current=2)]
    assert counts(scale(a, 3, ScalingState(), CFG)) == [1, 2]
    b = [ElasticApp(app="x", demand=2), ElasticApp(app="y", demand=2)]
    assert counts(scale(b, 3, ScalingState(), CFG)) == [2, 1]


def test_no_alabama_paradox():
    """Hamilton's method gives weights 6, 6, 2 the counts 4, 4, 2 of 10 seats and 5, 5, 1
    of 11 (the third app loses one as the house grows); the quota method does not."""
    w = [6, 6, 2]
    ten, eleven = quota_method(w, 10), quota_method(w, 11)
    assert sum(ten) == 10 and sum(eleven) == 11
    assert all(b >= a for a, b in zip(ten, eleven)), (ten, eleven)
    assert ten == [5, 4, 1] and eleven == [5, 5, 1]  # quotas 4.29 4.29 1.43; 4.71 4.71 1.57


def _hamilton(w: list[int], seats: int) -> list[int]:
    q = [Fraction(x * seats, sum(w)) for x in w]
    out = [math.floor(x) for x in q]
    for i in sorted(range(len(w)), key=lambda i: (-(q[i] - out[i]), i))[: seats - sum(out)]:
        out[i] += 1
    return out


@given(st.lists(st.integers(0, 60), min_size=1, max_size=12), st.data())
@settings(max_examples=300)
def test_quota_method_keeps_quota_and_is_house_monotone(weights, data):
    if sum(weights) == 0:
        weights = weights[:-1] + [1]
    total = sum(weights)
    seats = data.draw(st.integers(0, total - 1))
    c, bigger = quota_method(weights, seats), quota_method(weights, seats + 1)
    for house, counts_ in ((seats, c), (seats + 1, bigger)):
        assert sum(counts_) == house
        for x, w in zip(counts_, weights):
            q = Fraction(w * house, total)
            assert math.floor(q) <= x <= math.ceil(q)  # the quota rule, both sides
    assert all(b >= a for a, b in zip(c, bigger))  # no app loses a seat as the house grows
    assert quota_method(weights, total) == weights  # the whole house is the weights themselves


def test_hamilton_would_fail_the_monotone_property():
    """The property above can fail: Hamilton violates it on the classic instance."""
    assert _hamilton([6, 6, 2], 10) == [4, 4, 2] and _hamilton([6, 6, 2], 11) == [5, 5, 1]


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
        base = [min(floor, d) for d in demands]
        if budget < sum(base):  # the floor rounds alone: nobody above the floor
            assert all(x <= b for x, b in zip(c, base))
        else:
            extra = [d - b for d, b in zip(demands, base)]
            seats = budget - sum(base)
            for x, b, e in zip(c, base, extra):
                q = Fraction(e * seats, sum(extra)) if sum(extra) else Fraction(0)
                assert math.floor(q) <= x - b <= math.ceil(q)  # the quota rule


@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(0, 3),
       st.lists(st.integers(0, 5), min_size=12, max_size=12), st.data())
@settings(max_examples=300)
def test_every_apps_count_is_monotone_in_the_budget(demands, floor, current, data):
    """The issue's property: one more device in the budget never gives any app fewer
    instances (and the counts sum to the budget)."""
    cfg = ScalingConfig(min_instances_per_app=floor)
    a = [ElasticApp(app=f"a{i:02d}", demand=d, current=c) for i, (d, c) in enumerate(zip(demands, current))]
    budget = data.draw(st.integers(0, sum(demands) + 1))
    c = counts(scale(a, budget, ScalingState(), cfg))
    more = counts(scale(a, budget + 1, ScalingState(), cfg))
    assert sum(c) == min(budget, sum(demands)) and sum(more) == min(budget + 1, sum(demands))
    assert all(y >= x for x, y in zip(c, more)), (budget, c, more)


def test_apportion_floor_rounds_go_to_the_largest_demands_first():
    assert apportion([1, 5, 3], 2, 1) == [0, 1, 1]
    assert apportion([1, 5, 3], 4, 1) == [1, 2, 1]


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
