"""The daemon's request side (server/api.py's Frontend): a request is checked, tokenized
on a worker with an Active instance of its model (waiting, bounded, while a resting one
wakes), and queued on the core; a client that goes away is cancelled; each finished
request is counted and logged. A part of server/daemon.py's Daemon (a mixin), apart
from its life cycle because this is the one path every client request takes."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from janusd.config import JanusConfig
from janusd.core import Failure, Refused, Request, ServingCore, no_instance, removed
from janusd.log import log
from janusd.server.daemon_clock import clock
from janusd.server.lifecycle_ops import LifecycleOps
from janusd.server.metrics import Metrics
from janusd.server.openai_types import Parsed
from janusd.server.process_states import DaemonState
from janusd.server.workers import WorkerError, WorkerHandle
from janusd.wire import worker_msgs as wm


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class RequestFront:
    """What it uses of the Daemon (made in Daemon.__init__)."""

    state: DaemonState
    core: ServingCore
    life: LifecycleOps
    metrics: Metrics
    workers: list[WorkerHandle]
    _idle: asyncio.Event  # set while no request is in flight (the shutdown drain waits on it)
    _serving_changed: asyncio.Event  # replaced and set each time a model gets an Active instance
    _tasks: set[asyncio.Task[Any]]

    if TYPE_CHECKING:
        @property
        def cfg(self) -> JanusConfig: ...

        def poke(self) -> None: ...

    async def admit(self, p: Parsed, request_id: str = "") -> tuple[Request, asyncio.Queue[Any]]:
        """Check, tokenize and queue a request; raises Refused for every refusal.

        The request's clock (SLO deadlines, token times) starts here, before tokenizing."""
        arrival = clock()
        if self.state is not DaemonState.RUNNING:
            if self.core.registry.model(p.model) is None:
                self.core.begin_admission(p.model)  # raises the 404
            raise Refused(Failure(503, "the server is shutting down", code="shutting_down"))
        m = self.core.begin_admission(p.model)
        try:
            ids, waited = (p.prompt_ids, False) if p.prompt_ids is not None else await self._tokenize(p, arrival)
            events: asyncio.Queue[Any] = asyncio.Queue()
            req = self.core.admit(m, ids, p.sampling, p.max_tokens_given, p.chat, p.ttft_ms, p.tpot_ms,
                                  arrival, clock(), events.put_nowait, request_id=request_id,
                                  waited_since=arrival if waited else None)
            self._idle.clear()
            self.poke()
            return req, events
        finally:
            self.core.end_admission(p.model)

    async def _tokenize(self, p: Parsed, arrival: float) -> tuple[list[int], bool]:
        """On a worker with an Active instance of the model; waits (bounded) for one.
        Returns the ids and whether it waited (the core then gives it a fresh TTFT
        budget, as to a request it held itself)."""
        limit = self.cfg.server.model_wait_timeout_s
        waited = False
        while (dev := self.core.tokenizer_device(p.model)) is None:
            waited = True
            if self.core.registry.model(p.model) is None:
                raise Refused(removed(p.model))
            waking = self.life.wake(p.model)  # scale to zero: a Warm or Cold instance comes up
            if waking is not None:
                self._tasks.add(waking)
                waking.add_done_callback(self._tasks.discard)
            left = arrival + limit - clock()
            ev = self._serving_changed
            try:
                if left <= 0:
                    raise asyncio.TimeoutError
                await asyncio.wait_for(ev.wait(), left)
            except asyncio.TimeoutError:
                self.metrics.reject(p.model, "no_instance")
                raise Refused(no_instance(p.model, limit)) from None
        w = self.workers[dev]
        try:
            reply: wm.Tokenized = await w.call(lambda seq: wm.Tokenize(seq, p.model, p.prompt, p.messages), 30.0)
        except WorkerError as e:
            if e.kind == "bad_request":
                raise Refused(Failure(400, str(e), "invalid_request_error",
                                      param="messages" if p.chat else None)) from None
            if e.kind == "internal":  # a tokenizer bug: retrying in a second would fail again
                raise Refused(Failure(500, f"tokenizing failed on the worker: {e}")) from None
            raise Refused(Failure(503, str(e), retry_after_s=1.0)) from None  # the worker went away
        except asyncio.TimeoutError:
            raise Refused(Failure(503, "tokenization timed out", retry_after_s=1.0)) from None
        return reply.token_ids, waited

    def _serving(self, model: str) -> None:
        ev, self._serving_changed = self._serving_changed, asyncio.Event()
        ev.set()  # wakes every admission waiting for an Active instance; they re-check

    def _on_idle(self) -> None:
        """The last in-flight request ended: a cheap moment to check every request is in
        exactly one place (STYLE.md #9); a breach is logged, never fatal."""
        self._idle.set()
        try:
            self.core.check_integrity()
        except RuntimeError as e:
            _log(f"integrity check failed: {e}", logging.ERROR)

    def cancel(self, req: Request) -> None:
        self.core.cancel(req, clock())
        self.poke()

    def _finished(self, req: Request, outcome: str) -> None:
        self.metrics.observe(req, outcome)
        self.poke()
        if log.isEnabledFor(logging.DEBUG) or req.failed:
            ttft = f"{req.ttft_s * 1e3:.0f} ms" if req.ttft_s is not None else "-"
            why = f" ({req.failure.code or req.failure.type}: {req.failure.message})" if req.failure else ""
            _log(f"request {req.request_id or req.rid} {req.model} {outcome}{why}: prompt {len(req.prompt_ids)}, "
                 f"output {req.num_output_tokens} tokens, ttft {ttft}, device {req.device}",
                 logging.INFO if req.failed else logging.DEBUG)
