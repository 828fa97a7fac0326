"""When to restart a dead worker: exponential back-off, and a budget per window after
which the device is given up (marked failed) instead of spinning in a crash loop.

Pure, times as arguments. A worker that stays up for `window_s` has no restarts left in
its window, so its budget and its back-off are back to the start (the reset after a
stable period).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class RestartBudget:
    budget: int = 5  # restarts allowed within window_s; one more and the device is failed
    window_s: float = 60.0
    first_delay_s: float = 0.2
    max_delay_s: float = 10.0
    _deaths: deque[float] = field(default_factory=deque)

    def on_death(self, now: float) -> float | None:
        """Seconds to wait before the next start, or None: the budget is spent, give up."""
        while self._deaths and self._deaths[0] <= now - self.window_s:
            self._deaths.popleft()
        if len(self._deaths) >= self.budget:
            return None
        delay = min(self.first_delay_s * 2 ** len(self._deaths), self.max_delay_s)
        self._deaths.append(now)
        return delay

    def recent(self, now: float) -> int:
        return sum(1 for t in self._deaths if t > now - self.window_s)
