"""A time-bucketed sliding window: counts, sums and variances of the last window_s.

Why buckets: the controller asks "what happened in the last minute" every 0.5 s for
every model, while events arrive at thousands per second. Keeping raw events costs memory
in proportion to the load; keeping one running total cannot forget. Buckets of bucket_s
seconds forget whole buckets at once: O(1) amortised per event (each bucket is created
once and evicted once), memory bounded by the window, and exact for every event inside
the window up to bucket granularity.

Edge semantics (the rule the tests' brute-force reference shares, via the two functions
below):
- An event at time t falls in bucket k = floor(t / bucket_s); bucket k holds [k*b, (k+1)*b).
- The window at time `now` is the n = span_buckets(window_s, bucket_s) buckets with index
  in (K - n, K], K = bucket_index(now): the current (partial) bucket and the n - 1 before
  it. An event at t counts iff K - k < n. The span actually covered is between
  (n - 1) * bucket_s and n * bucket_s, and n = ceil(window_s / bucket_s), so window_s lies
  inside that range. At most n <= window_s / bucket_s + 1 buckets are ever held.
- Buckets are created only when an event lands in them: a quiet gap costs nothing.
- Time never goes backwards inside a window: an event (or a query) earlier than the
  newest bucket seen is clamped into the newest bucket, so an out-of-order caller cannot
  revive an evicted bucket nor corrupt eviction.

Variances are population variances (ddof=0) kept Welford-style: each bucket keeps
(n, total, m2) with m2 the sum of squared deviations about the bucket's own mean, and
buckets merge with Chan's pairwise formula. No sum of squares of raw values is ever
formed, so values around 1e12 with unit spread keep their variance (a naive
E[x^2] - E[x]^2 loses it to cancellation). What is left is the rounding of the mean:
the variance's relative error is about ulp(mean) / std (about 1e-12 for token counts around
1e4 with a spread of 1, a few 1e-6 at a mean of 1e12 with a spread of 1). Totals stay
Python ints when the values are ints, so counts and token sums are exact.
"""

from __future__ import annotations

import math
from collections import deque


def bucket_index(t: float, bucket_s: float) -> int:
    """The bucket of time t: floor(t / bucket_s) (the one rounding rule used everywhere)."""
    return math.floor(t / bucket_s)


def span_buckets(window_s: float, bucket_s: float) -> int:
    """How many buckets a window holds: ceil(window_s / bucket_s), float noise forgiven.

    60/1 -> 60; 0.7/0.1 (= 6.999999999999999 in floats) -> 7; 1/0.3 -> 4.
    """
    q = window_s / bucket_s
    r = round(q)
    if r >= 1 and abs(q - r) <= 1e-9 * q:
        return int(r)
    return max(1, math.ceil(q))


def check_window_args(window_s: float, bucket_s: float) -> None:
    """ValueError unless 0 < bucket_s <= window_s, both finite."""
    if not (math.isfinite(window_s) and window_s > 0):
        raise ValueError(f"window_s must be a finite number > 0, got {window_s!r}")
    if not (math.isfinite(bucket_s) and bucket_s > 0):
        raise ValueError(f"bucket_s must be a finite number > 0, got {bucket_s!r}")
    if bucket_s > window_s:
        raise ValueError(f"bucket_s ({bucket_s}) must not exceed window_s ({window_s})")


class Moments:
    """Running count, total and m2 (sum of squared deviations about the mean) of a series.

    A count-only series adds 1s and reads n; a sum-only series reads total. Mutable and
    small (__slots__): one per channel per bucket.
    """

    __slots__ = ("n", "total", "m2")

    def __init__(self, n: int = 0, total: float = 0, m2: float = 0.0) -> None:
        self.n = n
        self.total = total
        self.m2 = m2

    @classmethod
    def from_sums(cls, n: int, s1: int, s2: int) -> Moments:
        """From exact integer sums (count, sum, sum of squares): m2 = (n*s2 - s1^2) / n.

        Exact because the numerator is formed in Python ints (no rounding, no
        cancellation); used for the in-flight prior, where values come and go.
        """
        if n <= 0:
            return cls()
        return cls(n, s1, (n * s2 - s1 * s1) / n)

    def add(self, x: float) -> None:
        """Welford's update, with the mean derived from the (exact for ints) total."""
        n = self.n
        if n == 0:
            self.n, self.total = 1, x
            return
        old_mean = self.total / n
        self.n = n + 1
        self.total += x
        self.m2 += (x - old_mean) * (x - self.total / self.n)

    def merge(self, o: Moments) -> None:
        """Fold o into self (Chan et al.): m2 += o.m2 + d^2 * n_a * n_b / n."""
        if o.n == 0:
            return
        if self.n == 0:
            self.n, self.total, self.m2 = o.n, self.total + o.total, o.m2
            return
        n = self.n + o.n
        d = o.total / o.n - self.total / self.n
        self.m2 += o.m2 + d * d * (self.n * o.n / n)
        self.n = n
        self.total += o.total

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    @property
    def var(self) -> float:
        """Population variance (ddof=0); 0 for fewer than two values; never negative."""
        return max(0.0, self.m2 / self.n) if self.n else 0.0


class _Bucket:
    __slots__ = ("index", "ch")

    def __init__(self, index: int, channels: int) -> None:
        self.index = index
        self.ch = [Moments() for _ in range(channels)]


class SlidingWindow:
    """Several series (channels) over the same sliding window and buckets.

    One window per model keeps all of its series in one bucket deque, so the memory bound
    (<= window_s / bucket_s + 1 buckets) holds per model, not per series.
    """

    def __init__(self, window_s: float, bucket_s: float, channels: int) -> None:
        check_window_args(window_s, bucket_s)
        if channels < 1:
            raise ValueError(f"channels must be >= 1, got {channels}")
        self.window_s = float(window_s)
        self.bucket_s = float(bucket_s)
        self.channels = channels
        self.n_buckets = span_buckets(window_s, bucket_s)
        self._buckets: deque[_Bucket] = deque()
        self._latest: int | None = None  # newest bucket index seen (events or queries)

    def __len__(self) -> int:
        """Buckets held now (<= n_buckets after any add or totals)."""
        return len(self._buckets)

    def _index(self, t: float) -> int:
        """t's bucket, clamped to the newest seen: time never goes backwards here."""
        k = bucket_index(t, self.bucket_s)
        return k if self._latest is None or k >= self._latest else self._latest

    def _advance(self, t: float) -> int:
        k = self._latest = self._index(t)
        horizon = k - self.n_buckets  # buckets with index <= horizon have left
        b = self._buckets
        while b and b[0].index <= horizon:
            b.popleft()
        return k

    def add(self, t: float, channel: int, x: float) -> None:
        """Record value x on channel at time t (clamped to the newest bucket seen)."""
        self.at(t)[channel].add(x)

    def at(self, t: float) -> list[Moments]:
        """The channels of the bucket that records values at time t (as `add` finds it):
        several values of one event at one time advance the window once."""
        k = self._advance(t)
        b = self._buckets
        if not b or b[-1].index != k:
            b.append(_Bucket(k, self.channels))
        return b[-1].ch

    def covered_s(self, now: float) -> float:
        """Seconds the window's buckets span at `now`: from the start of its oldest bucket to
        now, between (n - 1) * bucket_s and n * bucket_s (module doc), at least one bucket.
        What its counts divide by to be rates: dividing by window_s instead read a steady
        load up to a bucket's share low (a third with 3 buckets) just after each boundary,
        and the controller's m* dipped and came back (tests/test_controller_scale_in_daemon.py)."""
        k = self._index(now)
        return max(self.bucket_s, now - (k - self.n_buckets + 1) * self.bucket_s)

    def totals(self, now: float) -> list[Moments]:
        """Each channel merged over the window at `now` (evicts what has left it)."""
        self._advance(now)
        out = [Moments() for _ in range(self.channels)]
        for bucket in self._buckets:
            for acc, m in zip(out, bucket.ch):
                acc.merge(m)
        return out
