"""The fast loop's sight of a burst and of its end (PAPER.md §5: a bursty app gets its
replicas within about a second, and keeps them while it needs them). Its own module: the
three rules below are what make elastic scaling react at once and not flap, and each
reads on its own.

- Burst: m* is asked for the telemetry window's load, its rates raised to the arrival
  rate of the last BURST_S seconds when that rate is beyond what the window's mean
  explains (more arrivals than mean + 3 standard deviations of a Poisson count, plus
  one). A 60 s mean moves 1/60 of a burst's jump per second: on a real daemon the
  scale-out came 5-6 s after a burst began; the short rate sees a 10x jump within half a
  second, and the significance test keeps a quiet app's Poisson noise from looking like
  one (at 1.5 req/s a one-second count of 7 or more comes once in ~1,200 seconds).
- Refusals: a model that refused requests since the last tick (its window's failed count
  grew) asks one instance more than it serves: whatever the rates say, its queue did
  not fit.
- Hold: the count asked is the largest m* of the last `scale_in_hold_s` seconds, so a
  scale-out happens at the first tick that asks for it and a scale-in only after demand
  stayed low for the hold time (hysteresis on m*: a burst's lull does not send a replica
  away to bring it back seconds later). A scale-in of a replica within the hold time of
  its scale-out is still counted (`undone`): only budget compression can cause one.
Pure: every figure comes from the snapshot and `now`.
"""

from __future__ import annotations

import math
from collections import deque

import msgspec

from janusd.control.snapshot import ModelView
from janusd.control.traffic import ArrivalHistory
from janusd.oracle.types import LoadFeatures

BURST_S = 1.0  # the short span a burst's arrival rate is read over
SIGMAS = 3.0  # how far beyond the window's mean a short count must be to be a burst


def burst_rate(window_rate: float, recent_rate: float, span: float = BURST_S) -> float | None:
    """The recent rate when it is a burst against the window's mean (module doc), else None."""
    expected = window_rate * span
    count = recent_rate * span
    return recent_rate if count > expected + SIGMAS * math.sqrt(expected) + 1.0 else None


def raised(load: LoadFeatures, rate: float) -> LoadFeatures:
    """`load` with its request and token rates at `rate` requests/s (lengths as they are)."""
    k = rate / load.request_rate if load.request_rate > 0 else 0.0
    return msgspec.structs.replace(load, request_rate=rate, input_token_rate=load.input_token_rate * k,
                                   output_token_rate=load.output_token_rate * k)


class BurstWatch:
    """The state the rules keep between fast ticks: each model's failed count at the last
    tick, its recent m* (time, m*) over the hold time, and when each replica scaled out."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._failed: dict[str, int] = {}
        self._asked: dict[str, deque[tuple[float, int]]] = {}
        self._out_at: dict[tuple[str, int], float] = {}

    def load(self, m: ModelView, arrivals: ArrivalHistory, now: float) -> tuple[LoadFeatures, str]:
        """The load m* is asked for, and a note when a burst raised it."""
        load = m.load
        rate = burst_rate(load.request_rate, arrivals.recent_rate(m.name, now, BURST_S))
        if rate is None or load.request_rate <= 0.0:
            return load, ""
        return raised(load, rate), f"burst: {rate:.1f} req/s over the last {BURST_S:g} s " \
                                   f"(window mean {load.request_rate:.2f})"

    def refused(self, m: ModelView) -> int:
        """Requests the model failed since the last tick (0 the first time it is seen)."""
        failed = m.window.failed
        before = self._failed.get(m.name, failed)
        self._failed[m.name] = failed
        return max(0, failed - before)

    def hold(self, model: str, want: int, now: float) -> tuple[int, str]:
        """The largest m* over the hold time, this tick's `want` included, and a note when
        the hold keeps more than `want`."""
        asked = self._asked.setdefault(model, deque())
        asked.append((now, want))
        while asked and asked[0][0] < now - self.hold_s:
            asked.popleft()
        held = max(w for _, w in asked)
        if held > want:
            return held, f"held at {held} for {self.hold_s:g} s after demand fell to {want}"
        return want, ""

    def forget(self, models: set[str]) -> None:
        """Drop the state of models that left the elastic pool (they start afresh on return)."""
        for name in [n for n in self._asked if n not in models]:
            del self._asked[name]

    def scaled_out(self, model: str, device: int, now: float) -> None:
        self._out_at[(model, device)] = now

    def undone(self, model: str, device: int, now: float) -> bool:
        """A scale-in of this replica is one of a scale-out within the hold time."""
        t = self._out_at.pop((model, device), None)
        return t is not None and now - t < self.hold_s
