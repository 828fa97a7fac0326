"""A model's arrivals per second over the telemetry window, for the classifier
(policy/classify.py). Telemetry keeps a running arrival count, not a per-second series;
the controller samples that count at each fast tick and this module turns the samples
into bucket counts. Its own module: the only state the classifier's input needs between
ticks, apart from the loops that sample it."""

from __future__ import annotations

from collections import deque

from janusd.policy.classify import traffic_from_counts
from janusd.policy.snapshot import AppTraffic

BUCKET_S = 1.0  # arrivals are bucketed per second for the classifier
SHORT_BUCKETS = 5  # its short window: 5 s (a burst's 5-10x jump within seconds)


class ArrivalHistory:
    """Samples of each model's arrival counter, (t, arrivals so far), over the window."""

    def __init__(self) -> None:
        self._arrivals: dict[str, deque[tuple[float, int]]] = {}  # model -> (t, arrivals so far)

    def traffic(self, name: str, pool: str, total: int, now: float, window: float) -> AppTraffic:
        """Arrivals per BUCKET_S over the telemetry window, from samples of the model's
        arrival counter taken at each fast tick (a bucket edge reads the latest sample
        at or before it). `total`: the counter now; `pool`: the model's pin (auto: none)."""
        hist = self._arrivals.setdefault(name, deque())
        hist.append((now, total))
        while len(hist) > 2 and hist[1][0] <= now - window:
            hist.popleft()
        n = max(1, int(window // BUCKET_S))
        edges = [now - (n - k) * BUCKET_S for k in range(n + 1)]
        at: list[int] = []
        j = 0
        seen = list(hist)
        for e in edges:
            while j + 1 < len(seen) and seen[j + 1][0] <= e:
                j += 1
            at.append(seen[j][1] if seen[j][0] <= e else seen[0][1])
        counts = [max(0, b - a) for a, b in zip(at, at[1:])]
        pin = None if pool == "auto" else pool
        return traffic_from_counts(name, counts, BUCKET_S, SHORT_BUCKETS, pin=pin)  # type: ignore[arg-type]

    def recent_rate(self, name: str, now: float, span: float) -> float:
        """Arrivals per second over the last `span` seconds, from the samples taken at the
        fast ticks (the latest sample at or before `now - span` is the counter then; when
        every sample is younger, the oldest stands in, so a model first seen mid burst reads
        an under-estimate, never an over-estimate)."""
        hist = self._arrivals.get(name)
        if not hist or span <= 0.0:
            return 0.0
        edge = now - span
        then = hist[0][1]
        for t, total in reversed(hist):  # the newest few samples: a short span reads two or three
            if t <= edge:
                then = total
                break
        return max(0, hist[-1][1] - then) / span
