"""Admission to assignment in the core: a request is checked before and after
tokenizing (404, 429, context fit), queued on the Rust Dispatcher when its model has an
instance taking prefill work or held until one comes (bounded by
`model_wait_timeout_s`), refused early when it cannot meet its TTFT SLO, and, at each
tick, assigned (a Generate to its worker) or rejected (503). Apart from instance moves
(core/instance_moves.py), which call back into the held queues here when a model stops
or starts serving."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

from janusd.core.admission import fit_to_context
from janusd.core.core_state import CoreState
from janusd.core.registry import Model
from janusd.core.requests import Failure, Refused, Request, no_instance, removed
from janusd.log import log
from janusd.wire import worker_msgs as wm


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class Queueing(CoreState):
    """ServingCore's request part, from admission to assignment (see core/core_state.py)."""

    def begin_admission(self, name: str) -> Model:
        """First check before tokenizing; counts the request as queued until end_admission."""
        m = self.registry.model(name)
        if m is None:
            raise Refused(Failure(404, f"model {name!r} does not exist", "invalid_request_error",
                                  code="model_not_found", param="model"))
        if self.queue_length(name) >= self.limits.queue_limit:
            self.obs.rejected(name, "queue_full")
            raise Refused(Failure(429, f"too many requests queued for model {name!r}; retry later",
                                  "rate_limit_error", code="queue_full", retry_after_s=1.0))
        self._admitting[name] = self._admitting.get(name, 0) + 1
        return m

    def end_admission(self, name: str) -> None:
        n = self._admitting.get(name, 0) - 1
        if n > 0:
            self._admitting[name] = n
        else:
            self._admitting.pop(name, None)

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

    def admit(self, m: Model, ids: list[int], sampling: wm.SamplingSpec, max_tokens_given: bool, chat: bool,
              ttft_ms: float | None, tpot_ms: float | None, arrival: float, now: float,
              sink: Callable[[Any], None], request_id: str = "", waited_since: float | None = None) -> Request:
        """Queue a tokenized request (its clock started at `arrival`); raises Refused.
        `waited_since`: the request already waited (in its shell, before it could be
        tokenized) for an Active instance of its model since then: it gets a fresh TTFT
        budget from now, as a request the core held does (one rule for both waits)."""
        self._at(now)
        if self.registry.model(m.name) is not m:
            # removed (or replaced by a reload) while it was tokenized
            raise Refused(removed(m.name))
        sampling = fit_to_context(len(ids), sampling, max_tokens_given, m.max_model_len,
                                  self.default_max_tokens(m), chat)
        ttft = (ttft_ms or m.cfg.ttft_slo_ms) / 1000.0
        tpot = (tpot_ms or m.cfg.tpot_slo_ms) / 1000.0
        req = Request(self.requests.new_id(), m.name, ids, sampling, arrival, ttft, tpot, sink=sink,
                      request_id=request_id)
        self.requests.add(req)
        self.telemetry.on_arrival(req.rid, m.name, now, len(ids), sampling.max_tokens)
        if not m.serving:
            self._hold(req, now)
            return req
        req.held_since = waited_since
        deadline = self._submit(req, now)
        late_by = self._hopeless(req, now, deadline)
        if late_by is not None:
            self.dispatch.cancel(req.rid, now)
            self._reject(req.rid, now, "admission", deadline, retry_after_s=max(1.0, float(math.ceil(late_by))))
        return req

    def _hopeless(self, req: Request, now: float, deadline: float) -> float | None:
        """With admission = reject_early (and requeue = reject): when no instance of the
        model can finish the prefill by the deadline, each by its own estimate after the
        work it has, how long until the earliest-free one frees up (the Retry-After); None
        when the request may be on time."""
        cfg = self.dispatch.cfg
        if cfg.admission != "reject_early" or cfg.requeue != "reject":
            return None
        m = self.registry.models[req.model]
        finish = self.dispatch.earliest_finish(m, len(req.prompt_ids), req.est_prefill_s, now)
        if finish is None or finish <= deadline:
            return None
        earliest = self.dispatch.earliest_free(m, now)
        return max(0.0, (earliest if earliest is not None else now) - now)

    def _submit(self, req: Request, now: float) -> float:
        """Hand the request to the Dispatcher; returns its TTFT deadline (a fresh budget
        from now for one that waited for an instance)."""
        m = self.registry.models[req.model]
        req.est_prefill_s = self.dispatch.estimate_model(m, len(req.prompt_ids))
        deadline = req.arrival + req.ttft_slo_s
        if req.held_since is not None:
            deadline = max(deadline, now + req.ttft_slo_s)
            req.held_since = None
        # its value under objective = "tokens": the output tokens it may produce (max_tokens,
        # already capped by the context at admission), the tokens its SLO accounting counts
        self.dispatch.submit(req.rid, req.model, req.arrival, deadline, req.est_prefill_s, req.sampling.max_tokens,
                             len(req.prompt_ids))
        return deadline

    def _hold(self, req: Request, now: float) -> None:
        self.held.hold(req, now)

    def _release_held(self, model: str, now: float) -> None:
        for req in self.held.release(model):
            self._submit(req, now)

    def _hold_queued(self, model: str, now: float) -> None:
        """The model stopped taking prefill work: its queued requests wait for an instance
        (bounded) instead of being rejected against an SLO no instance can meet now."""
        for req in self.requests.of_model(model):
            if req.instance is None and req.held_since is None and not req.done:
                self.dispatch.cancel(req.rid, now)
                self._hold(req, now)

    def default_max_tokens(self, m: Model) -> int:
        """max_tokens of a request that omits it (then capped by the context)."""
        return m.cfg.default_max_tokens or self.limits.default_max_tokens

    def queue_length(self, model: str) -> int:
        return self.dispatch.pending(model) + self.held.count(model) + self._admitting.get(model, 0)

    def cancel(self, req: Request, now: float) -> None:
        """The client went away: abort on the worker (frees KV) and forget the request."""
        self._at(now)
        if req.device is not None:
            w = self.workers.get(req.device)
            if w is not None:
                w.send(wm.Abort(req.rid))
        self.requests.fail(req.rid, Failure(499, "client closed the request", code="cancelled"))

    def fail_all(self, failure: Failure, now: float) -> int:
        """End every request (shutdown past its drain bound); aborts them on their workers."""
        return self.fail_requests(list(self.requests.by_id.values()), failure, now)

    def fail_requests(self, reqs: Iterable[Request], failure: Failure, now: float) -> int:
        """End these requests (a drain past its bound: the one place a drain ends what is
        left); each is aborted on its worker first. Returns how many ended."""
        self._at(now)
        n = 0
        for req in reqs:
            if req.done:
                continue
            if req.device is not None and (w := self.workers.get(req.device)) is not None:
                w.send(wm.Abort(req.rid))
            self.requests.fail(req.rid, failure)
            n += 1
        return n

    def tick_wanted(self) -> bool:
        """After a worker event: whether the shell should tick now rather than at the time
        the last tick asked for. True when requests are queued and the Dispatcher's state
        moved (a prefill ended before its estimate: its instance is free early) or the
        decode guard's inputs did (an instance may take work again): waiting for the
        planned wake-up would leave that instance idle, and a request the plan could now
        start in time would reach its latest start and be refused."""
        return self.dispatch.wants_tick() or (self.dispatch.cfg.decode_guard and self.guard.changed
                                               and self.dispatch.stats().get("pending", 0) > 0)

    def tick(self, now: float) -> float | None:
        """Expire held requests, dispatch; returns when to tick next (None: on the next event)."""
        self._at(now)
        timeout = self.limits.model_wait_timeout_s
        expired, wake = self.held.expire(now, timeout)
        for req in expired:
            self.obs.rejected(req.model, "no_instance")
            self.requests.fail(req.rid, no_instance(req.model, timeout))
        if self.dispatch.cfg.decode_guard:
            self.guard.apply()
        assigned, rejected = self.dispatch.tick(now)
        for rid, iid in assigned:
            self._assign(rid, iid, now)
        for rid in rejected:
            self._reject(rid, now, "queue")
        nxt = self.dispatch.next_wakeup(now)
        if nxt is not None:
            wake = nxt if wake is None else min(wake, nxt)
        return wake

    def _assign(self, rid: int, iid: int, now: float) -> None:
        req = self.requests.by_id.get(rid)
        inst = self.dispatch.member(iid)
        if req is None or inst is None:
            self.dispatch.cancel(rid, now)
            return
        inst.served += 1
        req.instance, req.device = inst, inst.device
        # what the Dispatcher charged it there: the instance's own estimate (the error
        # reported at its first token is against this)
        req.est_prefill_s = self.dispatch.own_estimate(inst, len(req.prompt_ids))
        req.assigned_at = now
        w = self.workers.get(inst.device)
        try:
            sent = w is not None and w.send(wm.Generate(rid, req.model, req.prompt_ids, req.sampling))
        except Exception as e:  # e.g. a frame over the limit: this request fails, dispatching goes on
            _log(f"request {rid}: cannot send it to device {inst.device}: {type(e).__name__}: {e}")
            self.requests.fail(rid, Failure(500, f"internal error sending the request to its worker: {e}"))
            return
        if not sent:
            self.requests.fail(rid, Failure(503, f"the worker for device {inst.device} is not running"))

    def _reject(self, rid: int, now: float, stage: str, deadline: float | None = None,
                retry_after_s: float = 1.0) -> None:
        """Refuse `rid` for its TTFT SLO (`stage`: admission | queue), logging and
        reporting the figures the refusal used (core/dispatch.py Refusal)."""
        req = self.requests.by_id.get(rid)
        m = self.registry.models.get(req.model) if req is not None else None
        if req is None or m is None:
            self.dispatch.forget(rid)
            return
        refusal = self.dispatch.refusal(rid, m, stage, now, req.est_prefill_s, len(req.prompt_ids), deadline)
        _log(refusal.line())
        self.obs.refused(refusal)
        self.obs.rejected(req.model, "slo")
        cfg = self.dispatch.cfg
        self.requests.fail(rid, Failure(
            503, f"request rejected: it cannot meet its TTFT SLO of {req.ttft_slo_s * 1000:g} ms "
                 f"(dispatch policy {cfg.policy}, requeue={cfg.requeue})", code="slo_unattainable",
            retry_after_s=retry_after_s))
