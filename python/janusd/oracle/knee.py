"""Where to measure next: load points concentrated where attainment changes (pure).

One series is a fixed instance count and length mix; its points are request rates. The
attainment curve of a server is flat (near 1) at low load, drops over a narrow range
(the knee) and is flat again (near 0) past saturation. A uniform grid spends most points
on the flat parts, so the next rate is chosen from what the series has measured:
1. bracket the knee: divide the lowest rate by GROWTH while even that misses HIGH;
   multiply the highest by GROWTH while even that reaches LOW. GROWTH is 2, not 3:
   every bracketing point below the knee is also a served point the GPs learn from, and
   the step is how far a held-out point is from its neighbours. Measured on three
   profiles (bench/RESULTS.md "Doubling steps"): the held-out attainment P90 fell (sum
   over three models x three seeds 322 -> 195 points), the bandwidth P90 rose (362 ->
   469%), its worst rows being bracket points that landed at the engine's limit, where
   the step count is bistable;
2. then refine: the adjacent pair of measured rates with the largest attainment change
   gets its geometric mean (rates act multiplicatively), while the pair's ratio exceeds
   MIN_RATIO; None when there is nothing left worth measuring;
3. but before any refinement, the widest gap between two adjacent served rates (both at
   HIGH or above) wider than FILL_RATIO gets its geometric mean. Why: the Capacity GP
   learns only from served points (fit.py), and a start below the bracket's grid (a series
   of m > 1 starts from one instance's knee) can leave them more than GROWTH apart; and a served
   point measures a window KNEE_STRETCH times shorter than a knee point (profiling/). The
   fill used to wait until the knee pair was within FILL_RATIO, and in three profiles
   it never fired: the budget went to knee points whose bandwidth is the least
   reproducible (bench/RESULTS.md "Twice the budget, a lag cap, a served-range fill" and
   "The served range first").
series_next_rate adds a profile's bounds: where a series of m instances starts, and the
rate the load generator could not offer (client lag), which no later rate reaches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

HIGH = 0.9
LOW = 0.3
MIN_RATIO = 1.12
GROWTH = 2.0
FILL_RATIO = 2.0


def next_rate(measured: Sequence[tuple[float, float]], start: float, floor: float, cap: float) -> float | None:
    """measured: (rate, attainment) pairs of one series; rates within [floor, cap]."""
    if not (0 < floor <= start <= cap):
        raise ValueError(f"need 0 < floor <= start <= cap, got {floor}, {start}, {cap}")
    if not measured:
        return start
    pts = sorted(measured)
    lo_r, lo_a = pts[0]
    hi_r, hi_a = pts[-1]
    if lo_a < HIGH and lo_r / GROWTH >= floor:
        return lo_r / GROWTH
    if hi_a >= LOW and hi_r * GROWTH <= cap:
        return hi_r * GROWTH
    fill = _served_fill(pts)
    if fill is not None:
        return fill
    best, gap = None, 0.0
    for (r1, a1), (r2, a2) in zip(pts, pts[1:], strict=False):
        if r2 / r1 > MIN_RATIO and abs(a1 - a2) > gap:
            best, gap = math.sqrt(r1 * r2), abs(a1 - a2)
    return best if gap > 0.02 else None


def _served_fill(pts: Sequence[tuple[float, float]]) -> float | None:
    """The geometric mean of the widest gap wider than FILL_RATIO between adjacent served rates."""
    served = [r for r, a in pts if a >= HIGH]
    gaps = [(r2 / r1, math.sqrt(r1 * r2)) for r1, r2 in zip(served, served[1:], strict=False) if r2 / r1 > FILL_RATIO]
    return max(gaps)[1] if gaps else None


def series_next_rate(measured: Sequence[tuple[float, float]], m: int, one_instance_knee: float, lag_cap: float,
                     start_rate: float, max_rate: float) -> float | None:
    """next_rate for a profile's series of m instances: it starts near m times one
    instance's knee (half of it: below the knee), and stays below lag_cap (module doc)."""
    floor = start_rate / 16
    cap = max(floor, min(max_rate, lag_cap))
    start = min(cap, max(start_rate, 0.5 * m * one_instance_knee))
    return next_rate(measured, start, floor, cap)
