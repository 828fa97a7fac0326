"""Requests waiting for their model to have an Active instance, per model, oldest first.

A request is held while its model is loading, restarting, Warm, Cold or unloaded, for up
to `server.model_wait_timeout_s`; then it ends with 503 + Retry-After. Holding is what
lets scale-to-zero and restores queue requests instead of refusing them. This file knows
the queues and the `held_since` mark on each request and nothing else: the core decides
when to hold, release and expire, and ends the requests. Pure: time comes in as `now`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from janusd.core.requests import Request


class HeldQueues:
    def __init__(self) -> None:
        self._q: dict[str, deque[Request]] = {}

    def hold(self, req: Request, now: float) -> None:
        req.held_since = now
        self._q.setdefault(req.model, deque()).append(req)

    def release(self, model: str) -> list[Request]:
        """The model's live held requests, oldest first, no longer held (`held_since`
        stays set: the caller reads it for the fresh TTFT budget, then clears it)."""
        q = self._q.pop(model, None)
        return [r for r in q or () if not r.done]

    def drop(self, req: Request) -> None:
        """Forget an ending request (any position); idempotent."""
        if req.held_since is None:
            return
        q = self._q.get(req.model)
        if q is not None:
            try:
                q.remove(req)
            except ValueError:
                pass
            if not q:
                del self._q[req.model]
        req.held_since = None

    def expire(self, now: float, timeout_s: float) -> tuple[list[Request], float | None]:
        """Take out the requests held `timeout_s` or longer (the caller ends them) and say
        when the next one is due (None: nothing held)."""
        out: list[Request] = []
        wake: float | None = None
        for model, q in list(self._q.items()):
            while q and (q[0].done or q[0].held_since is None or q[0].held_since + timeout_s <= now):
                req = q.popleft()
                if req.done or req.held_since is None:
                    continue
                req.held_since = None  # out of the held queue already
                out.append(req)
            if q:
                at = q[0].held_since + timeout_s  # type: ignore[operator]
                wake = at if wake is None else min(wake, at)
            else:
                del self._q[model]
        return out, wake

    def count(self, model: str) -> int:
        return len(self._q.get(model, ()))

    def __len__(self) -> int:
        return sum(len(q) for q in self._q.values())

    def __iter__(self) -> Iterator[Request]:
        for q in self._q.values():
            yield from q

    def check(self, live: dict[int, Request]) -> None:
        """Held <=> marked held, never ended and never assigned; RuntimeError on a breach."""
        held_ids = {r.rid for r in self}
        for rid in held_ids:
            if rid not in live:
                raise RuntimeError(f"request {rid} is held but has ended")
        for req in live.values():
            if req.held_since is not None and req.rid not in held_ids:
                raise RuntimeError(f"request {req.rid} says it is held but no held queue has it")
            if req.rid in held_ids and req.instance is not None:
                raise RuntimeError(f"request {req.rid} is both held and assigned")
