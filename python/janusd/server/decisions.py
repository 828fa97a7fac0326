"""The controller's decisions as a record: every Op the daemon carries out (the controller
shell's, and the wakes a request starts), with its reason, kept in a bounded ring in
memory (the last `control.decisions_kept`), one log line each when it ends, and a
Prometheus counter by kind (`janusd_controller_decisions_total`). `janus ctl events`
reads the ring over the admin socket, `janus top` shows its tail.

Each record changes at most twice (carried, then ended); `version` numbers every change,
so a follower asks for what changed after the last version it saw and never misses an
outcome nor reads a record twice in one state."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from janusd.control.ops import Activate, Op
from janusd.log import log
from janusd.server.daemon_clock import wall_clock

RUNNING = "running"


@dataclass
class Decision:
    """One carried Op. `at`: wall-clock seconds (epoch) when it was started; `outcome`:
    "running", "ok" or the error; `seconds`: how long it ran (None while running)."""

    seq: int
    at: float
    started: float  # the daemon's clock, for `seconds`
    op: Op
    outcome: str = RUNNING
    seconds: float | None = None
    version: int = 0

    def row(self) -> dict[str, Any]:
        op = self.op
        then = op.then if isinstance(op, Activate) else None
        return {"seq": self.seq, "at": round(self.at, 3), "model": op.model, "kind": op.kind, "rule": op.rule,
                "device": op.device, "target": op.target, "source": getattr(op, "source", None), "role": op.role,
                "then": None if then is None else {"device": then.device, "target": then.target},
                "reason": op.reason, "outcome": self.outcome,
                "seconds": None if self.seconds is None else round(self.seconds, 3), "version": self.version}


def _nothing(kind: str, rule: str) -> None:
    return None


class DecisionLog:
    """The ring (module doc). `on_decision(kind, rule)`: the metrics' hook, once per Op
    carried; `wall`: the wall clock the records' `at` is read from."""

    def __init__(self, kept: int, on_decision: Callable[[str, str], None] = _nothing,
                 wall: Callable[[], float] = wall_clock) -> None:
        if kept < 1:
            raise ValueError(f"decisions kept must be >= 1, got {kept}")
        self.ring: deque[Decision] = deque(maxlen=kept)
        self.on_decision = on_decision
        self.wall = wall
        self.seq = 0
        self.version = 0

    def _bump(self, d: Decision) -> None:
        self.version += 1
        d.version = self.version

    def carried(self, op: Op, now: float) -> Decision:
        """`op` starts now (`now`: the daemon's clock)."""
        self.seq += 1
        d = Decision(self.seq, self.wall(), now, op)
        self._bump(d)
        self.ring.append(d)
        self.on_decision(op.kind, op.rule)
        return d

    def ended(self, d: Decision, outcome: str, now: float) -> None:
        """`d` ended with `outcome` ("ok" or the error): its one log line."""
        d.outcome, d.seconds = outcome, max(0.0, now - d.started)
        self._bump(d)
        op = d.op
        log.log(logging.INFO if outcome == "ok" else logging.WARNING,
                f"decision {d.seq}: {op.kind} {op.model} on device {op.device} -> {op.target}: {outcome} in "
                f"{d.seconds:.2f} s ({op.reason})")

    def rows(self, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        """The records changed after version `after` (0: all kept, in the order they were
        carried; else in the order they changed), the last `limit` of them."""
        out = [d.row() for d in self.ring if d.version > after]
        if after:
            out.sort(key=lambda r: r["version"])
        return out[-limit:] if limit else out

    def view(self, after: int = 0, limit: int | None = None) -> dict[str, Any]:
        """`janus ctl events`' reply: the records, the last version (the next `after`) and
        how many the ring keeps."""
        return {"events": self.rows(after, limit), "version": self.version, "kept": self.ring.maxlen,
                "total": self.seq}
