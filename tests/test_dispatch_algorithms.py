"""Moore-Hodgson and LST-IMH: optimality against brute force, the paper's worked example,
feasibility, the 2-approximation, and Rust == pure-Python reference, ties included."""

from __future__ import annotations

import math
import random
from functools import lru_cache

import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd import _native
from janusd.policy import dispatch as ref

IMPLS = [pytest.param(_native, id="rust"), pytest.param(ref, id="python")]

# Integer-valued times keep every sum exact, so "feasible" and "optimal" are exact too.
small_int = st.integers(0, 12).map(float)
int_jobs = st.lists(st.tuples(small_int, st.integers(0, 40).map(float)), max_size=8)
# Arbitrary floats, many ties when drawn from the small grid.
any_time = st.one_of(
    st.floats(0.0, 50.0, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]),
)


def edd(deadline: list[float]) -> list[int]:
    return sorted(range(len(deadline)), key=lambda j: (deadline[j], j))


def completion_ok(seq: list[int], proc: list[float], deadline: list[float], start: float, tol: float = 0.0) -> bool:
    """Recomputes completion times of `seq` run back to back from `start`."""
    t = start
    for j in seq:
        t += proc[j]
        if t > deadline[j] + tol:
            return False
    return True


def feasible_mask(mask: int, proc: list[float], deadline: list[float], start: float) -> bool:
    return completion_ok([j for j in edd(deadline) if mask >> j & 1], proc, deadline, start)


def brute_one(proc: list[float], deadline: list[float], start: float) -> int:
    n = len(proc)
    return max(bin(m).count("1") for m in range(1 << n) if feasible_mask(m, proc, deadline, start))


def brute_many(proc: list[float], deadline: list[float], avail: list[float]) -> int:
    """Optimum over every assignment of jobs to a machine or none (DP over subsets)."""
    n = len(proc)
    ok = [[feasible_mask(m, proc, deadline, a) for m in range(1 << n)] for a in avail]

    @lru_cache(maxsize=None)
    def best(k: int, mask: int) -> int:
        if k == len(avail):
            return 0
        top = best(k + 1, mask)
        sub = mask
        while sub:
            if ok[k][sub]:
                top = max(top, bin(sub).count("1") + best(k + 1, mask & ~sub))
            sub = (sub - 1) & mask
        return top

    return best(0, (1 << n) - 1)


def check_schedule(plan: list[list[int]], proc, deadline, avail, tol: float = 0.0) -> int:
    """Every machine's sequence is on time, in EDD order, and no job runs twice."""
    seen: set[int] = set()
    for i, seq in enumerate(plan):
        assert completion_ok(seq, proc, deadline, avail[i], tol), (i, seq)
        assert seq == sorted(seq, key=lambda j: (deadline[j], j))
        assert seen.isdisjoint(seq)
        seen.update(seq)
    return len(seen)


@pytest.mark.parametrize("impl", IMPLS)
def test_worked_example(impl) -> None:
    # A (p=4, d=5), B (2, 6), C (2, 7); T1 = 3, T2 = 0: machine 1 takes B, C; machine 2 A.
    assert impl.lst_imh([4.0, 2.0, 2.0], [5.0, 6.0, 7.0], [3.0, 0.0]) == [[1, 2], [0]]
    assert impl.moore_hodgson([4.0, 2.0, 2.0], [5.0, 6.0, 7.0], 3.0) == [1, 2]


@pytest.mark.parametrize("impl", IMPLS)
def test_documented_tie_breaking(impl) -> None:
    # Equal deadlines run in index order; of equal lengths the higher index is dropped.
    assert impl.moore_hodgson([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], 0.0) == [0, 1]
    assert impl.moore_hodgson([1.0, 1.0, 1.0], [2.5, 1.0, 2.0], 0.0) == [1, 0]
    # Equal free times: the lower machine index chooses first.
    assert impl.lst_imh([1.0, 1.0, 1.0], [1.0, 1.0, 2.0], [0.0, 0.0]) == [[0, 2], [1]]
    # A job that fits nowhere is simply absent; machines without work get [].
    assert impl.lst_imh([5.0, 1.0], [1.0, 9.0], [0.0, 0.0, 0.0]) == [[1], [], []]


@given(jobs=int_jobs, start=st.integers(0, 8).map(float))
def test_moore_hodgson_is_optimal(jobs, start) -> None:
    proc = [p for p, _ in jobs]
    deadline = [d for _, d in jobs]
    got = _native.moore_hodgson(proc, deadline, start)
    assert check_schedule([got], proc, deadline, [start]) == len(got)
    assert len(got) == brute_one(proc, deadline, start)
    assert got == ref.moore_hodgson(proc, deadline, start)


@given(
    jobs=st.lists(st.tuples(st.integers(0, 8).map(float), st.integers(0, 25).map(float)), max_size=7),
    avail=st.lists(st.integers(0, 10).map(float), min_size=1, max_size=3),
)
def test_lst_imh_is_at_least_half_optimal(jobs, avail) -> None:
    proc = [p for p, _ in jobs]
    deadline = [d for _, d in jobs]
    plan = _native.lst_imh(proc, deadline, avail)
    assert len(plan) == len(avail)
    taken = check_schedule(plan, proc, deadline, avail)
    assert 2 * taken >= brute_many(proc, deadline, avail)
    assert plan == ref.lst_imh(proc, deadline, avail)


@given(
    jobs=st.lists(st.tuples(any_time, any_time), max_size=60),
    avail=st.lists(any_time, max_size=6),
)
def test_rust_equals_reference_on_arbitrary_floats(jobs, avail) -> None:
    proc = [p for p, _ in jobs]
    deadline = [d for _, d in jobs]
    plan = _native.lst_imh(proc, deadline, avail)
    assert plan == ref.lst_imh(proc, deadline, avail)
    # Running sums may round differently from a fresh sum by an ulp or so.
    check_schedule(plan, proc, deadline, avail, tol=1e-9)
    for a in avail[:2]:
        assert _native.moore_hodgson(proc, deadline, a) == ref.moore_hodgson(proc, deadline, a)


@given(
    jobs=st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0]), st.integers(0, 6).map(float)), max_size=14),
    avail=st.lists(st.sampled_from([0.0, 1.0, 2.0]), max_size=4),
)
def test_rust_equals_reference_with_many_ties(jobs, avail) -> None:
    proc = [p for p, _ in jobs]
    deadline = [d for _, d in jobs]
    plan = _native.lst_imh(proc, deadline, avail)
    assert plan == ref.lst_imh(proc, deadline, avail)
    check_schedule(plan, proc, deadline, avail)


def test_rust_equals_reference_on_a_large_backlog() -> None:
    rng = random.Random(7)
    n, m = 3000, 16
    arrival = [rng.uniform(0.0, 2.0) for _ in range(n)]
    proc = [rng.choice([0.01, 0.02, 0.05]) * rng.randint(1, 4) for _ in range(n)]
    deadline = [a + 0.5 for a in arrival]
    avail = [rng.uniform(0.0, 0.1) for _ in range(m)]
    plan = _native.lst_imh(proc, deadline, avail)
    assert plan == ref.lst_imh(proc, deadline, avail)
    taken = check_schedule(plan, proc, deadline, avail, tol=1e-9)
    # An overloaded backlog: every machine is used and most jobs cannot be taken.
    assert all(plan) and 0 < taken < n


BAD = [math.nan, math.inf, -math.inf, -1.0, -1e-300]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("bad", BAD)
def test_bad_times_raise_value_error(impl, bad) -> None:
    with pytest.raises(ValueError, match="proc"):
        impl.moore_hodgson([1.0, bad], [1.0, 2.0], 0.0)
    with pytest.raises(ValueError, match="deadline"):
        impl.moore_hodgson([1.0], [bad], 0.0)
    with pytest.raises(ValueError, match="start"):
        impl.moore_hodgson([1.0], [1.0], bad)
    with pytest.raises(ValueError, match="avail"):
        impl.lst_imh([1.0], [1.0], [0.0, bad])


@pytest.mark.parametrize("impl", IMPLS)
def test_ints_too_large_for_a_float_raise_value_error(impl) -> None:
    # float(10**400) raises OverflowError; to a caller it is a bad time like NaN.
    huge = 10**400
    with pytest.raises(ValueError, match="proc"):
        impl.moore_hodgson([1.0, huge], [1.0, 2.0], 0.0)
    with pytest.raises(ValueError, match="deadline"):
        impl.lst_imh((1.0,), (huge,), (0.0,))
    with pytest.raises(ValueError):
        impl.moore_hodgson([1.0], [1.0], huge)
    with pytest.raises(ValueError):
        impl.lst_imh([1.0], [1.0], [huge])


@pytest.mark.parametrize("impl", IMPLS)
def test_length_mismatch_raises_value_error(impl) -> None:
    with pytest.raises(ValueError, match="same length"):
        impl.moore_hodgson([1.0, 2.0], [1.0], 0.0)
    with pytest.raises(ValueError, match="same length"):
        impl.lst_imh([1.0], [], [0.0])


def test_non_numbers_are_type_errors_not_crashes() -> None:
    with pytest.raises(TypeError):
        _native.lst_imh(["a"], [1.0], [0.0])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        _native.moore_hodgson(None, [1.0], 0.0)  # type: ignore[arg-type]


def test_benchmark_reports_matching_plans_and_a_speedup() -> None:
    import argparse

    from janusd.bench import dispatch as bench

    out = bench.run(argparse.Namespace(seed=3, max_jobs=100))
    assert [(c["jobs"], c["machines"]) for c in out["cases"]] == [(100, 8), (100, 64)]
    for case in out["cases"]:
        assert case["rust_us"] > 0 and case["python_us"] > 0
        assert case["speedup"] == pytest.approx(case["python_us"] / case["rust_us"], rel=0.05)
        assert case["speedup"] > 1.0
        # Wall-clock medians of the same samples: never below the thread's CPU time by more
        # than clock granularity (a thread cannot run longer than the wall time it spans).
        assert case["rust_wall_us"] >= 0.9 * case["rust_us"] and case["python_wall_us"] >= 0.9 * case["python_us"]
        assert case["speedup_wall"] == pytest.approx(case["python_wall_us"] / case["rust_wall_us"], rel=0.05)
