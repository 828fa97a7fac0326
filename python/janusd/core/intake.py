"""A request's way in, owned by the core from its arrival: checked (404, 429), tokenized
on a worker with an Active instance of its model when it came as text (held, bounded,
while none is Active; the shell is asked to wake one), checked against the model's
context (400), then queued or held (core/queueing.py). One path for the daemon's HTTP
requests and the simulator's arrivals; the shell only makes a Submission and hands over
a sink for the request's events.

Tokenizing is a worker message like Generate: Tokenize(req_id, ...) out, Tokenized or
RequestFailed back through on_tokenized / on_failed. A request whose tokenizing worker
dies or no longer has the model is tokenized again elsewhere (or held); one that waits
past `Limits.tokenize_timeout_s` for its tokens ends with 503 and Retry-After."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from janusd.core.admission import fit_to_context
from janusd.core.core_state import CoreState
from janusd.core.registry import Model
from janusd.core.requests import Failure, Refused, Request, removed
from janusd.core.submission import Submission
from janusd.log import log
from janusd.wire import worker_msgs as wm


class Intake(CoreState):
    """ServingCore's way in (see core/core_state.py)."""

    def submit(self, s: Submission, now: float, sink: Callable[[Any], None]) -> Request:
        """Take a client's request; raises Refused for what is known at once (404, 429,
        and for given ids 400). Everything later (tokenizing errors, a too long prompt,
        a wait that timed out, an SLO refusal) ends the request with a Failure event on
        its sink."""
        self._at(now)
        m = self.registry.model(s.model)
        if m is None:
            raise Refused(Failure(404, f"model {s.model!r} does not exist", "invalid_request_error",
                                  code="model_not_found", param="model"))
        if self.queue_length(s.model) >= self.limits.queue_limit:
            self.obs.rejected(s.model, "queue_full")
            raise Refused(Failure(429, f"too many requests queued for model {s.model!r}; retry later",
                                  "rate_limit_error", code="queue_full", retry_after_s=1.0))
        ttft = (s.ttft_ms or m.cfg.ttft_slo_ms) / 1000.0
        tpot = (s.tpot_ms or m.cfg.tpot_slo_ms) / 1000.0
        if s.prompt_ids is not None:
            sampling = fit_to_context(len(s.prompt_ids), s.sampling, s.max_tokens_given, m.max_model_len,
                                      self.default_max_tokens(m), s.chat)
            req = Request(self.requests.new_id(), m.name, s.prompt_ids, sampling, s.arrival, ttft, tpot, sink=sink,
                          request_id=s.request_id)
            self.requests.add(req)
            self._enter(req, m, now, wake=True)
            return req
        req = Request(self.requests.new_id(), m.name, [], s.sampling, s.arrival, ttft, tpot, sink=sink,
                      request_id=s.request_id, untokenized=s)
        self.requests.add(req)
        self._tokenize(req, now)
        return req

    def on_tokenized(self, device: int, msg: wm.Tokenized, now: float) -> None:
        """A worker's tokens for a request's prompt: on to the context check and the queue."""
        self._at(now)
        req = self.tokenizing.finish(msg.req_id)
        if req is None or req.done:
            return  # ended meanwhile (cancelled, timed out, its model removed)
        s: Submission = req.untokenized
        m = self.registry.model(req.model)
        if m is None:
            self.requests.fail(req.rid, removed(req.model))
            return
        try:
            req.sampling = fit_to_context(len(msg.token_ids), s.sampling, s.max_tokens_given, m.max_model_len,
                                          self.default_max_tokens(m), s.chat)
        except Refused as r:
            self.requests.fail(req.rid, r.failure)
            return
        req.prompt_ids = msg.token_ids
        req.untokenized = None
        self._enter(req, m, now, wake=False)

    def _tokenize_failed(self, req: Request, device: int, f: wm.RequestFailed, now: float) -> None:
        """The worker could not tokenize: the client's input is a 400, a tokenizer bug a
        500 (the same prompt would fail again), a worker without the model any more (a
        state move raced the message) tokenizes it elsewhere."""
        s: Submission = req.untokenized
        if f.kind == "bad_request":
            self.requests.fail(req.rid, Failure(400, f.message, "invalid_request_error", param=s.where))
        elif f.kind == "internal":
            self.requests.fail(req.rid, Failure(500, f"tokenizing failed on the worker: {f.message}"))
        else:
            log.info(f"request {req.request_id or req.rid}: device {device} could not tokenize it ({f.message}); "
                     "trying again")
            self._tokenize(req, now)

    def _retokenize(self, device: int, now: float) -> None:
        """The worker of `device` died: what it was tokenizing goes to another (or waits)."""
        for req in self.tokenizing.on_device(device):
            self.tokenizing.finish(req.rid)
            self._tokenize(req, now)

    def _tokenize(self, req: Request, now: float) -> None:
        dev = self.tokenizer_device(req.model)
        if dev is None:
            self._hold(req, now)
            self.obs.wake(req.model)
            return
        s: Submission = req.untokenized
        w = self.workers.get(dev)
        if w is None or not w.send(wm.Tokenize(req.rid, req.model, s.prompt, s.messages)):
            self.requests.fail(req.rid, Failure(503, f"the worker for device {dev} is not running",
                                                retry_after_s=1.0))
            return
        self.tokenizing.start(req, dev, now)

    def _enter(self, req: Request, m: Model, now: float, wake: bool) -> None:
        """A request with its prompt ids: counted as arrived, then held (no instance takes
        prefill work: `wake` asks the shell for one) or queued, refused at once when no
        instance can start it in time."""
        self.telemetry.on_arrival(req.rid, m.name, now, len(req.prompt_ids), req.sampling.max_tokens)
        if not m.serving:
            self._hold(req, now)
            if wake:
                self.obs.wake(m.name)
            return
        deadline = self._submit(req, now)
        late_by = self._hopeless(req, now, deadline)
        if late_by is not None:
            self.dispatch.cancel(req.rid, now)
            self._reject(req.rid, now, "admission", deadline, retry_after_s=max(1.0, float(math.ceil(late_by))))

    def tokenizer_device(self, name: str) -> int | None:
        """A device whose worker can tokenize for `name` (round robin over Active instances)."""
        m = self.registry.model(name)
        if m is None:
            return None
        devs = sorted(i.device for i in m.active)
        if not devs:
            return None
        self._tok_rr += 1
        return devs[self._tok_rr % len(devs)]


