"""The last minute of finished requests per model: TTFT and TPOT percentiles and per-token
SLO attainment, for the operator (`janus ctl models`, `janus top`). The sliding windows of
telemetry.py keep sums and moments, which give means but no percentiles; this keeps the
samples themselves, bounded by time (window_s) and count (max_samples per model, the
oldest dropped first), so a percentile is exact over what it holds.

Pure: no clock reads, every time is an argument (the caller's clock). A request counts
at its end, as /metrics' histograms count it: TTFT when it had a first token, TPOT when it
had two tokens or more, its on-time and counted tokens (trace/slo.py's per-token rule)."""

from __future__ import annotations

import math
from collections import deque

import msgspec


class LatencyFigures(msgspec.Struct, frozen=True):
    """One model's figures over the window (None: no sample)."""

    requests: int  # ended in the window (kept)
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    tpot_p50_s: float | None
    tpot_p99_s: float | None
    attainment: float | None  # tokens on time / tokens counted
    window_s: float


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The nearest-rank q-quantile (0 < q <= 1) of an ascending list, None when empty."""
    if not sorted_values:
        return None
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


_Sample = tuple[float, float | None, float | None, int, int]  # (end time, ttft, tpot, on time, counted)


class LatencyWindow:
    def __init__(self, window_s: float = 60.0, max_samples: int = 10_000) -> None:
        if not (math.isfinite(window_s) and window_s > 0) or max_samples < 1:
            raise ValueError(f"window_s must be > 0 and max_samples >= 1, got {window_s}, {max_samples}")
        self.window_s = float(window_s)
        self.max_samples = max_samples
        self._models: dict[str, deque[_Sample]] = {}

    def add(self, model: str, t: float, ttft_s: float | None, tpot_s: float | None, on_time: int = 0,
            counted: int = 0) -> None:
        """A request of `model` ended at `t`."""
        if not math.isfinite(t):
            return
        q = self._models.get(model)
        if q is None:
            q = self._models[model] = deque(maxlen=self.max_samples)
        q.append((t, ttft_s, tpot_s, max(0, on_time), max(0, counted)))

    def forget(self, model: str) -> None:
        self._models.pop(model, None)

    def figures(self, model: str, now: float) -> LatencyFigures:
        """`model`'s figures over (now - window_s, now]."""
        q = self._models.get(model)
        if q is not None:
            while q and q[0][0] <= now - self.window_s:
                q.popleft()
        rows = list(q or ())
        ttft = sorted(r[1] for r in rows if r[1] is not None)
        tpot = sorted(r[2] for r in rows if r[2] is not None)
        on, counted = sum(r[3] for r in rows), sum(r[4] for r in rows)
        return LatencyFigures(requests=len(rows), ttft_p50_s=percentile(ttft, 0.5), ttft_p99_s=percentile(ttft, 0.99),
                              tpot_p50_s=percentile(tpot, 0.5), tpot_p99_s=percentile(tpot, 0.99),
                              attainment=on / counted if counted else None, window_s=self.window_s)
