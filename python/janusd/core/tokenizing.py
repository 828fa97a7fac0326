"""Requests whose prompt is being tokenized on a worker, by request id.

A request given as text is tokenized by a worker that has an Active instance of its
model (the daemon never loads a tokenizer). From the Tokenize message until the worker's
Tokenized (or RequestFailed) it is here and nowhere else: not queued, not held, not on a
worker's request list. This file knows who is being tokenized where and since when; the
core (core/intake.py) decides what happens next. Pure: time comes in as `now`.
"""

from __future__ import annotations

from collections.abc import Iterator

from janusd.core.requests import Request


class Tokenizing:
    def __init__(self) -> None:
        self._at: dict[int, tuple[Request, int, float]] = {}  # rid -> (request, device, since)
        self._per_model: dict[str, int] = {}

    def start(self, req: Request, device: int, now: float) -> None:
        self.finish(req.rid)
        self._at[req.rid] = (req, device, now)
        self._per_model[req.model] = self._per_model.get(req.model, 0) + 1

    def finish(self, rid: int) -> Request | None:
        """Take the request out (its tokens came, it failed or it ended); None if absent."""
        got = self._at.pop(rid, None)
        if got is None:
            return None
        req = got[0]
        n = self._per_model.get(req.model, 1) - 1
        if n:
            self._per_model[req.model] = n
        else:
            self._per_model.pop(req.model, None)
        return req

    def on_device(self, device: int) -> list[Request]:
        return [r for r, d, _ in self._at.values() if d == device]

    def expire(self, now: float, timeout_s: float) -> tuple[list[Request], float | None]:
        """Take out the requests tokenizing `timeout_s` or longer and say when the next
        one is due (None: nothing is being tokenized)."""
        late = [r for r, _, since in self._at.values() if since + timeout_s <= now]
        for r in late:
            self.finish(r.rid)
        wake = min((since + timeout_s for _, _, since in self._at.values()), default=None)
        return late, wake

    def count(self, model: str) -> int:
        return self._per_model.get(model, 0)

    def __contains__(self, rid: int) -> bool:
        return rid in self._at

    def __len__(self) -> int:
        return len(self._at)

    def __iter__(self) -> Iterator[Request]:
        return (r for r, _, _ in self._at.values())

    def check(self, live: dict[int, Request]) -> None:
        """Tokenizing => live, not held, not assigned, no tokens yet; RuntimeError on a breach."""
        for rid, (req, _, _) in self._at.items():
            if live.get(rid) is not req:
                raise RuntimeError(f"request {rid} is being tokenized but has ended")
            if req.held_since is not None or req.instance is not None or req.prompt_ids:
                raise RuntimeError(f"request {rid} is being tokenized and also held, assigned or tokenized")
