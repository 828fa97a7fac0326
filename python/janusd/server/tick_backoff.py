"""What the daemon's tick loop does when a tick raises: back off, and say so without
flooding the log.

A tick that raises must not stop dispatching for good (the next one may succeed), but
one that keeps raising must neither spin (the loop used to retry every 10 ms, and every
event that pokes it retried at once too) nor write a traceback per try. So the wait
before the next try doubles from FIRST_S to MAX_S and resets on the first success, and
the log says the first failure with its traceback, then at most one line per
LOG_EVERY_S with how many failures it did not write (a traceback again only when the
failure changed), and the recovery. Pure: it takes `now`, reads no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_S = 0.01
MAX_S = 1.0
LOG_EVERY_S = 30.0


@dataclass(frozen=True)
class Verdict:
    """After a failed tick: how long to wait before the next, and what to log (None: nothing)."""

    wait_s: float
    message: str | None = None
    traceback: bool = False


class TickBackoff:
    def __init__(self, first_s: float = FIRST_S, max_s: float = MAX_S, log_every_s: float = LOG_EVERY_S) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.log_every_s = log_every_s
        self.streak = 0  # failures since the last success
        self.total = 0  # failures ever
        self._streak_since = 0.0
        self._logged_at: float | None = None
        self._unlogged = 0  # failures since the last line written
        self._last_error = ""

    def failed(self, now: float, error: BaseException) -> Verdict:
        if self.streak == 0:
            self._streak_since = now
        self.streak += 1
        self.total += 1
        wait = min(self.max_s, self.first_s * 2 ** (self.streak - 1))
        what = f"{type(error).__name__}: {error}"
        changed, self._last_error = what != self._last_error, what
        if not self._may_log(now):
            self._unlogged += 1
            return Verdict(wait)
        skipped, self._unlogged = self._unlogged, 0
        more = f" ({skipped} more not logged since the last line)" if skipped else ""
        msg = (f"the core's tick failed ({self.streak} in a row, {self.total} since start){more}; "
               f"next try in {wait * 1e3:.0f} ms: {what}")
        return Verdict(wait, msg, traceback=changed or self.total == 1)

    def succeeded(self, now: float) -> str | None:
        """A tick went through: the back-off resets; returns the line to log about the
        recovery (None when there was no failure, or the log limit holds it back)."""
        if self.streak == 0:
            return None
        streak, self.streak = self.streak, 0
        if not self._may_log(now):
            return None
        skipped, self._unlogged = self._unlogged, 0
        more = f", {skipped} of them not logged" if skipped else ""
        return f"the core's tick works again after {streak} failures in {now - self._streak_since:.2f} s{more}"

    def _may_log(self, now: float) -> bool:
        if self._logged_at is not None and now - self._logged_at < self.log_every_s:
            return False
        self._logged_at = now
        return True
