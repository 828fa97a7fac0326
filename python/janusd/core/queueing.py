"""Queue to assignment in the core: a request with its prompt ids (core/intake.py) is
queued on the Rust Dispatcher when its model has an instance taking prefill work or held
until one comes (bounded by `model_wait_timeout_s`), refused early when it cannot meet
its TTFT SLO, and, at each tick, assigned (a Generate to its worker) or rejected (503).
Apart from instance moves (core/instance_moves.py), which call back into the held queues
here when a model stops or starts serving."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from janusd.core.core_state import CoreState
from janusd.core.registry import Model
from janusd.core.requests import Failure, Request, no_instance
from janusd.log import log
from janusd.wire import worker_msgs as wm


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class Queueing(CoreState):
    """ServingCore's request part, from admission to assignment (see core/core_state.py)."""

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
        if req.held_since is not None or req.waited_since is not None:
            deadline = max(deadline, now + req.ttft_slo_s)
            req.held_since = req.waited_since = None
        # its value under objective = "tokens": the output tokens it may produce (max_tokens,
        # already capped by the context at admission), the tokens its SLO accounting counts
        self.dispatch.submit(req.rid, req.model, req.arrival, deadline, req.est_prefill_s, req.sampling.max_tokens,
                             len(req.prompt_ids))
        return deadline

    def _hold(self, req: Request, now: float) -> None:
        self.held.hold(req, now)

    def _release_held(self, model: str, now: float) -> None:
        for req in self.held.release(model):
            if req.untokenized is None:
                self._submit(req, now)
            else:  # it waited before it could be tokenized: its fresh budget starts once it is
                req.waited_since, req.held_since = req.held_since, None
                self._tokenize(req, now)

    def _hold_queued(self, model: str, now: float) -> None:
        """The model stopped taking prefill work: its queued requests wait for an instance
        (bounded) instead of being rejected against an SLO no instance can meet now."""
        for req in self._queued(model):
            self.dispatch.cancel(req.rid, now)
            self._hold(req, now)

    def _queued(self, model: str) -> list[Request]:
        """The model's requests waiting in the Dispatcher's queue (not held, not assigned)."""
        return [r for r in self.requests.of_model(model)
                if r.instance is None and r.held_since is None and r.untokenized is None and not r.done]

    def default_max_tokens(self, m: Model) -> int:
        """max_tokens of a request that omits it (then capped by the context)."""
        return m.cfg.default_max_tokens or self.limits.default_max_tokens

    def queue_length(self, model: str) -> int:
        return self.dispatch.pending(model) + self.held.count(model) + self.tokenizing.count(model)

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
        """End drains that are over, expire held and tokenizing requests, dispatch;
        returns when to tick next (None: on the next event)."""
        self._at(now)
        drain_wake = self._look_at_drains(now) if self._drains else None
        timeout = self.limits.model_wait_timeout_s
        expired, wake = self.held.expire(now, timeout)
        if drain_wake is not None:
            wake = drain_wake if wake is None else min(wake, drain_wake)
        for req in expired:
            self.obs.rejected(req.model, "no_instance")
            self.requests.fail(req.rid, no_instance(req.model, timeout))
        late, tok_wake = self.tokenizing.expire(now, self.limits.tokenize_timeout_s)
        for req in late:
            self.requests.fail(req.rid, Failure(503, "tokenization timed out", retry_after_s=1.0))
        if tok_wake is not None:
            wake = tok_wake if wake is None else min(wake, tok_wake)
        if self.dispatch.cfg.decode_guard:
            self.guard.apply()
            if self.dispatch.cfg.guard_yield_ms > 0:
                at = self.guard.yield_to_late(self._queued, self.requests.on_device, now,
                                              self.dispatch.cfg.guard_yield_ms / 1000.0)
                if at is not None:
                    wake = at if wake is None else min(wake, at)
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
        declined = self.guard.declined.pop(rid, None)
        refusal = self.dispatch.refusal(rid, m, stage, now, req.est_prefill_s, len(req.prompt_ids), deadline,
                                        declined)
        _log(refusal.line())
        self.obs.refused(refusal)
        self.obs.rejected(req.model, "slo")
        cfg = self.dispatch.cfg
        self.requests.fail(rid, Failure(
            503, f"request rejected: it cannot meet its TTFT SLO of {req.ttft_slo_s * 1000:g} ms "
                 f"(dispatch policy {cfg.policy}, requeue={cfg.requeue})", code="slo_unattainable",
            retry_after_s=retry_after_s))
