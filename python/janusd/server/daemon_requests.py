"""The daemon's request side (server/api.py's Frontend): a parsed request becomes a
Submission the core owns from here (tokenizing on a worker, holding while no instance is
Active, queueing: core/intake.py); a request that has to wait wakes a resting instance
(the core asks, lifecycle_ops carries it out); a client that goes away is cancelled;
each finished request is counted and logged. A part of server/daemon.py's Daemon (a
mixin), apart from its life cycle because this is the one path every client request
takes."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from janusd.config import JanusConfig
from janusd.core import Failure, Refused, Request, ServingCore, Submission
from janusd.log import log
from janusd.server.daemon_clock import clock
from janusd.server.lifecycle_ops import LifecycleOps
from janusd.server.metrics import Metrics
from janusd.server.openai_types import Parsed
from janusd.server.process_states import DaemonState
from janusd.server.workers import WorkerHandle
from janusd.wire import worker_msgs as wm


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class RequestFront:
    """What it uses of the Daemon (made in Daemon.__init__)."""

    state: DaemonState
    core: ServingCore
    life: LifecycleOps
    metrics: Metrics
    _idle: asyncio.Event  # set while no request is in flight (the shutdown drain waits on it)
    _tasks: set[asyncio.Task[Any]]

    if TYPE_CHECKING:
        @property
        def cfg(self) -> JanusConfig: ...

        def poke(self) -> None: ...

    def admit(self, p: Parsed, request_id: str = "") -> tuple[Request, asyncio.Queue[Any]]:
        """Hand a request to the core; raises Refused for what is refused at once (404,
        429, shutting down); everything later arrives as a Failure event. The request's
        clock (SLO deadlines, token times) starts here, before tokenizing."""
        now = clock()
        if self.state is not DaemonState.RUNNING:
            if not self.core.has_model(p.model):
                raise Refused(Failure(404, f"model {p.model!r} does not exist", "invalid_request_error",
                                      code="model_not_found", param="model"))
            raise Refused(Failure(503, "the server is shutting down", code="shutting_down"))
        events: asyncio.Queue[Any] = asyncio.Queue()
        req = self.core.submit(Submission(p.model, p.sampling, now, p.max_tokens_given, p.prompt_ids, p.prompt,
                                          p.messages, p.chat, p.ttft_ms, p.tpot_ms, request_id),
                               now, events.put_nowait)
        self._idle.clear()
        self.poke()
        return req, events

    def _wake_model(self, model: str) -> None:
        """The core holds a new request for `model` (no Active instance): scale from zero,
        a Warm or Cold instance comes up (lifecycle_ops decides which, once)."""
        waking = self.life.wake(model)
        if waking is not None:
            self._tasks.add(waking)
            waking.add_done_callback(self._tasks.discard)

    def _on_tokens(self, w: WorkerHandle, msg: wm.Tokenized) -> None:
        self.core.on_tokenized(w.device_index, msg, clock())
        self.poke()

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
