"""The daemon's own life and each worker process's, as lifecycle/states.py does for an
instance: one enum and one table of moves each, every other move refused with an error
naming both states. Values are their old words (StrEnum), so `ctl status`, /health and
the log read as before.

Daemon: Starting (workers spawn, models load) -> Running (serving) -> Draining (shutdown:
in-flight requests finish, bounded) -> Stopped; a shutdown asked during start goes
Starting -> Stopped (nothing was served).

Worker process (server/workers.py WorkerHandle), why each move exists:
- Stopped -> Starting: the daemon starts it. Starting -> Ready: its Ready frame came.
- Starting -> Dead: it failed its start-up (killed). Starting -> Stopping: shutdown
  meanwhile.
- Ready -> Dead: it exited or was killed (hung); Ready -> Stopping: shutdown.
- Stopping -> Stopped: it exited when asked; Stopping -> Dead: it had to be killed
  (then Stopped once the stop ends).
- Dead -> Starting: the restart after its back-off; Dead -> Failed: its restart budget
  is spent (the device is given up); Dead -> Stopped / Stopping: shutdown.
- Failed -> Stopping / Stopped: shutdown (a given-up device stays given up).
- Absent, a device slot no node offers (the ray launcher, server/node_joins.py): Stopped
  -> Absent: the cluster had fewer devices than devices.count at start; Dead -> Absent:
  its node left the cluster (no restart can help); Absent -> Starting: a node joined
  with a free device (a new one, or one that replaces the lost node); Absent -> Stopping
  / Stopped: shutdown."""

from __future__ import annotations

import enum


class ProcessMoveError(RuntimeError):
    """A move the table does not allow: a bug in the daemon, named with both states."""


class DaemonState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"


class WorkerState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    DEAD = "dead"
    FAILED = "failed"
    ABSENT = "absent"  # a device slot no node offers yet (server/node_joins.py)


D, W = DaemonState, WorkerState
DAEMON_MOVES: dict[DaemonState, frozenset[DaemonState]] = {
    D.STARTING: frozenset({D.RUNNING, D.DRAINING, D.STOPPED}),
    D.RUNNING: frozenset({D.DRAINING}),
    D.DRAINING: frozenset({D.STOPPED}),
    D.STOPPED: frozenset(),
}
WORKER_MOVES: dict[WorkerState, frozenset[WorkerState]] = {
    W.STOPPED: frozenset({W.STARTING, W.ABSENT}),
    W.STARTING: frozenset({W.READY, W.DEAD, W.STOPPING}),
    W.READY: frozenset({W.DEAD, W.STOPPING}),
    W.STOPPING: frozenset({W.STOPPED, W.DEAD}),
    W.DEAD: frozenset({W.STARTING, W.FAILED, W.ABSENT, W.STOPPING, W.STOPPED}),
    W.FAILED: frozenset({W.STOPPING, W.STOPPED}),
    W.ABSENT: frozenset({W.STARTING, W.STOPPING, W.STOPPED}),
}


def moved(current: enum.StrEnum, target: enum.StrEnum, table: dict, what: str) -> enum.StrEnum:  # type: ignore[type-arg]
    """`target` when the table allows current -> target (or it is no move), else raise."""
    if target != current and target not in table[current]:
        allowed = ", ".join(sorted(s.value for s in table[current])) or "none"
        raise ProcessMoveError(f"{what} is {current.value}: cannot go {target.value} (allowed: {allowed})")
    return target
