"""In-flight requests: their state, their events, the one place a request ends.

A Request lives from its submission (core/submission.py; before tokenizing, when it came
as text) until it ends. Each one carries a
`sink` that the shell gives at admission (the daemon: an asyncio queue's put_nowait; the
simulator: a recorder); the core only ever calls it, so nothing here knows asyncio.
Every token gets a timestamp on arrival from the caller's clock, which is what SLO
accounting uses (PAPER.md §9, trace/slo.py): token i is on time iff
t_i <= TTFT_SLO + (i-1) * TPOT_SLO, measured from admission.

Which instance holds a request has one owner, the Request (`instance`, and `device`: the
worker its tokens come from, the decode worker after a P/D handoff). The Rust Dispatcher
keeps its own private copy only until the prefill is done, checked by check_integrity.

Failure paths all end in `fail()`: a rejected request (dispatcher), a worker that died,
a bad request refused by the engine, shutdown, a wait for an instance that timed out.
Each puts one Failure event, so a streaming handler writes an SSE error event and
`[DONE]`, a non-streaming one a status.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from janusd.wire import worker_msgs as wm


@dataclass
class Failure:
    status: int
    message: str
    type: str = "server_error"
    code: str | None = None
    retry_after_s: float | None = None  # sent as Retry-After when set
    param: str | None = None  # the request field at fault (OpenAI error bodies name it)


class Refused(Exception):
    """Admission said no; carries the Failure the client gets."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


@dataclass
class Request:
    rid: int
    model: str
    prompt_ids: list[int]
    sampling: wm.SamplingSpec
    arrival: float
    ttft_slo_s: float
    tpot_slo_s: float
    sink: Callable[[Any], None] = field(default=lambda ev: None, repr=False)
    request_id: str = ""  # the id the client and the log know it by (X-Request-Id); rid is internal
    instance: Any = None  # core.registry.Instance once assigned (the prefill instance on P/D)
    device: int | None = None  # the worker that holds it now (the decode worker after a handoff)
    kv_source: int | None = None  # P/D: the prefill worker's device still holding its KV blocks
    decode_inst: Any = None  # P/D: the decode instance it was handed to
    decode_device: int | None = None  # counted as decoding on this device's worker (tie-breaks dispatch)
    est_prefill_s: float = 0.0  # the prefill estimate the dispatcher charged
    held_since: float | None = None  # waiting for an Active instance of its model since
    waited_since: float | None = None  # it waited, held before it was tokenized, since (a fresh TTFT budget)
    untokenized: Any = None  # its Submission while it has no prompt ids yet (core/intake.py)
    assigned_at: float | None = None  # sent to a worker at (queue time = assigned_at - arrival)
    ended_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    prefill_seen: bool = False
    done: bool = False
    failed: bool = False
    failure: Failure | None = None
    finish_reason: str | None = None
    slo_tokens: tuple[int, int] = (0, 0)  # (on time, counted) per trace/slo.py, set when it ends

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None


class RequestTable:
    """All in-flight requests; the single place that ends a request."""

    def __init__(self, on_finish: Callable[[Request], None]) -> None:
        self.by_id: dict[int, Request] = {}
        self._ids = itertools.count(1)
        self._on_finish = on_finish
        self._per_model: dict[str, int] = {}

    def new_id(self) -> int:
        return next(self._ids)

    def add(self, req: Request) -> None:
        self.by_id[req.rid] = req
        self._per_model[req.model] = self._per_model.get(req.model, 0) + 1

    def count(self, model: str | None = None) -> int:
        if model is None:
            return len(self.by_id)
        return self._per_model.get(model, 0)

    def of_model(self, model: str) -> list[Request]:
        return [r for r in self.by_id.values() if r.model == model]

    def deliver(self, delta: wm.TokenDelta, now: float) -> Request | None:
        """Record a worker's delta and pass it to the consumer; returns the request."""
        req = self.by_id.get(delta.req_id)
        if req is None or req.done:
            return None
        req.token_times.extend([now] * len(delta.token_ids))
        req.num_output_tokens = max(delta.num_output_tokens, len(req.token_times))
        req.sink(delta)
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
        req.sink(failure)
        self._end(req)
        return req

    def _end(self, req: Request) -> None:
        req.done = True
        self.by_id.pop(req.rid, None)
        n = self._per_model.get(req.model, 1) - 1
        if n:
            self._per_model[req.model] = n
        else:
            self._per_model.pop(req.model, None)
        self._on_finish(req)

    def on_device(self, device: int) -> list[Request]:
        """Requests whose tokens come from the worker of `device`."""
        return [r for r in self.by_id.values() if r.device == device]


def removed(model: str) -> Failure:
    """A request for a model that was removed (ctl remove, a reload without it)."""
    return Failure(404, f"model {model!r} was removed", "invalid_request_error", code="model_not_found",
                   param="model")


def no_instance(model: str, waited_s: float) -> Failure:
    """A request that waited the whole bound for an Active instance of its model."""
    return Failure(503, f"no instance of model {model!r} became ready within {waited_s:g} s (loading, "
                        "restarting or unloaded); retry later", code="model_not_ready", retry_after_s=1.0)


def request_slo(req: Request) -> tuple[int, int]:
    """(on-time tokens, counted tokens) of a finished request, per trace/slo.py."""
    from janusd.trace.slo import request_attainment

    raw = req.token_times
    times: Sequence[float]
    if len(raw) >= 64 and raw[1] == raw[-1]:
        times = _SinceArrival(raw, req.arrival)  # all after the first came together: read a few by bisection
    else:
        times = [t - req.arrival for t in raw]
    expected = len(times) if not req.failed else max(len(times), 1)
    a = request_attainment(times, expected, req.ttft_slo_s, req.tpot_slo_s, ok=not req.failed)
    return a.on_time_tokens, a.total_tokens


class _SinceArrival(Sequence[float]):
    """Token times minus the arrival, computed when read (the same floats as the list).
    request_attainment bisects runs of tokens delivered together, so when all tokens after
    the first came in one delta (the simulator's workers, a non-streamed answer) it reads
    a few dozen of them; building the whole list cost ~90 us per request of ~2000 tokens."""

    __slots__ = ("_raw", "_arrival")

    def __init__(self, raw: list[float], arrival: float) -> None:
        self._raw = raw
        self._arrival = arrival

    def __len__(self) -> int:
        return len(self._raw)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if isinstance(i, slice):
            return [t - self._arrival for t in self._raw[i]]
        return self._raw[i] - self._arrival
