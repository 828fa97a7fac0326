"""The worker process's log, and its count of the errors it caught and served past.

A worker writes plain lines to its own stderr, prefixed `janusd-worker[PID]` (the daemon's
logger lives in another process; the journal interleaves the two). An error the worker
catches on the request path and goes on after (an abort that raised, a tokenizer bug) is
never only a line: `Caught` counts it too, and the counts travel in every Stats reply, so
the daemon's /metrics shows them (janusd_worker_errors) as a rate an operator can alert
on rather than a line lost in a log.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback


def log(msg: str) -> None:
    print(f"janusd-worker[{os.getpid()}]: {msg}", file=sys.stderr, flush=True)


class Caught:
    """Errors caught on the worker's request path, by where they were caught (abort,
    tokenize), since the worker started. The reader thread and the main thread both count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def __call__(self, where: str, what: str) -> None:
        """Log `what` with the traceback of the exception being handled (call it inside
        the except block) and count one under `where`."""
        log(f"{what}:\n{traceback.format_exc()}")
        with self._lock:
            self._counts[where] = self._counts.get(where, 0) + 1

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
