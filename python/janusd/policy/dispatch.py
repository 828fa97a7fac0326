"""Pure-Python reference of Moore-Hodgson and LST-IMH (PAPER.md §6).

The daemon and the simulator use the Rust versions (`janusd._native.moore_hodgson`,
`lst_imh`, `Dispatcher`); this module exists so that tests can check the Rust code
against an independent, readable implementation and the benchmark has a baseline. It
makes the same floating-point operations in the same order as the Rust core, so the two
return identical results, ties included:

- jobs are taken in earliest-deadline order, equal deadlines by lower job index;
- when a job must be dropped, the longest goes, equal lengths the higher index;
- LST-IMH visits machines by descending free time, equal free times by lower index.

Same algorithm as the Rust core, shortcuts included (jobs late even on the earliest
machine are left out up front; a late job replaces the longest kept one or is skipped,
never added and dropped), but none of its data-layout work (packed keys, eight-job
blocks), so `janus bench dispatch` compares implementations, not algorithms.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

__all__ = ["lst_imh", "moore_hodgson"]


def _float(name: str, x: float) -> float:
    """float(x), with an int too large for a float a ValueError like any other bad time
    (float() raises OverflowError; the Rust binding turns that into ValueError too)."""
    try:
        return float(x)
    except OverflowError as e:
        raise ValueError(f"{name} out of range: {e}") from None


def _time(name: str, x: float) -> float:
    """Validated time: finite and >= 0, with -0.0 turned into 0.0 (as the Rust core does)."""
    x = _float(name, x)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    if x < 0.0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return x + 0.0


def _times(name: str, xs: Sequence[float]) -> list[float]:
    """Validated copy of a list of times; the message names the first bad element."""
    out = [_float(f"{name}[{i}]", x) + 0.0 for i, x in enumerate(xs)]
    for i, x in enumerate(out):
        if not (x >= 0.0 and x != math.inf):  # also false for NaN
            _time(f"{name}[{i}]", x)
    return out


def _check_lengths(proc: Sequence[float], deadline: Sequence[float]) -> None:
    if len(proc) != len(deadline):
        raise ValueError(f"proc and deadline must have the same length, got {len(proc)} and {len(deadline)}")


def _select(order: list[int], proc: list[float], deadline: list[float], start: float) -> set[int]:
    """Moore-Hodgson over `order` (EDD) from `start`: the set of kept job indices.

    Heap entries are (-p, -j) so that the top is the longest job, higher index first
    among equal lengths. A late job either replaces a longer kept job or is skipped.
    """
    heap: list[tuple[float, int]] = []
    t = start
    for j in order:
        p = proc[j]
        done = t + p
        if done <= deadline[j]:
            heapq.heappush(heap, (-p, -j))
            t = done
        elif heap and (-heap[0][0], -heap[0][1]) > (p, j):
            p_top = -heap[0][0]
            heapq.heapreplace(heap, (-p, -j))
            t = done - p_top
    return {-k for _, k in heap}


def _edd(proc: list[float], deadline: list[float], earliest: float) -> list[int]:
    """Jobs that could finish in time alone on a machine free at `earliest`, in EDD order.
    The others are never kept by any scan, so leaving them out changes no result."""
    fits = [j for j in range(len(deadline)) if earliest + proc[j] <= deadline[j]]
    return sorted(fits, key=lambda j: (deadline[j], j))


def moore_hodgson(proc: Sequence[float], deadline: Sequence[float], start: float) -> list[int]:
    """Indices of a maximum set of jobs that all meet their deadlines on one machine free
    at `start`, in execution (earliest-deadline-first) order."""
    _check_lengths(proc, deadline)
    p = _times("proc", proc)
    d = _times("deadline", deadline)
    s = _time("start", start)
    order = _edd(p, d, s)
    kept = _select(order, p, d, s)
    return [j for j in order if j in kept]


def lst_imh(proc: Sequence[float], deadline: Sequence[float], avail: Sequence[float]) -> list[list[int]]:
    """Latest-Start-Time Iterative Moore-Hodgson: per machine (input order), the job
    indices it runs in execution order; jobs no machine can take are absent."""
    _check_lengths(proc, deadline)
    p = _times("proc", proc)
    d = _times("deadline", deadline)
    a = _times("avail", avail)
    out: list[list[int]] = [[] for _ in a]
    if not a:
        return out
    remaining = _edd(p, d, min(a))
    for i in sorted(range(len(a)), key=lambda i: (-a[i], i)):
        if not remaining:
            break
        kept = _select(remaining, p, d, a[i])
        if kept:
            out[i] = [j for j in remaining if j in kept]
            remaining = [j for j in remaining if j not in kept]
    return out
