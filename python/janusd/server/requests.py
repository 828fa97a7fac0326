"""In-flight requests on the daemon side: their state, their events, their accounting.

A Request lives from admission (after tokenization) until its last event was consumed.
Token batches from workers are fanned out to per-request asyncio queues; the HTTP
handler consumes them. Every token gets a timestamp on arrival (loop clock), which is
what SLO accounting uses (PAPER.md §9, trace/slo.py): token i is on time iff
t_i <= TTFT_SLO + (i-1) * TPOT_SLO, measured from admission.

Failure paths all end in `fail()`: a rejected request (dispatcher), a worker that died,
a bad request refused by the engine, shutdown. Each puts one Failure event, so a
streaming handler writes an SSE error event and `[DONE]`, a non-streaming one a status.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from janusd.wire import worker_msgs as wm


@dataclass
class Failure:
    status: int
    message: str
    type: str = "server_error"
    code: str | None = None


@dataclass
class Request:
    rid: int
    model: str
    prompt_ids: list[int]
    sampling: wm.SamplingSpec
    arrival: float
    ttft_slo_s: float
    tpot_slo_s: float
    events: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    instance: Any = None  # scheduling.Instance once assigned
    worker: Any = None  # workers.WorkerHandle once sent (the decode worker after a P/D handoff)
    kv_source: Any = None  # P/D: the prefill worker still holding this request's KV blocks
    decode_inst: Any = None  # P/D: the decode instance it was handed to
    token_times: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    prefill_seen: bool = False
    done: bool = False
    failed: bool = False
    failure: Failure | None = None
    finish_reason: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None


class RequestTable:
    """All in-flight requests; the daemon's single place that ends a request."""

    def __init__(self, on_finish: Callable[[Request], None]) -> None:
        self.by_id: dict[int, Request] = {}
        self._ids = itertools.count(1)
        self._on_finish = on_finish
        self.idle = asyncio.Event()
        self.idle.set()

    def new_id(self) -> int:
        return next(self._ids)

    def add(self, req: Request) -> None:
        self.by_id[req.rid] = req
        self.idle.clear()

    def count(self, model: str | None = None) -> int:
        if model is None:
            return len(self.by_id)
        return sum(1 for r in self.by_id.values() if r.model == model)

    def deliver(self, delta: wm.TokenDelta, now: float) -> Request | None:
        """Record a worker's delta and pass it to the consumer; returns the request."""
        req = self.by_id.get(delta.req_id)
        if req is None or req.done:
            return None
        req.token_times.extend([now] * len(delta.token_ids))
        req.num_output_tokens = max(delta.num_output_tokens, len(req.token_times))
        req.events.put_nowait(delta)
        if delta.finished:
            req.finish_reason = delta.finish_reason
            self._end(req)
        return req

    def fail(self, rid: int, failure: Failure) -> Request | None:
        req = self.by_id.get(rid)
        if req is None or req.done:
            return None
        req.failed = True
        req.failure = failure
        req.events.put_nowait(failure)
        self._end(req)
        return req

    def _end(self, req: Request) -> None:
        req.done = True
        self.by_id.pop(req.rid, None)
        if not self.by_id:
            self.idle.set()
        self._on_finish(req)

    def on_worker(self, worker: Any) -> list[Request]:
        return [r for r in self.by_id.values() if r.worker is worker]
