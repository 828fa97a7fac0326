"""ServingCore: the daemon's request path without asyncio, sockets or a clock.

Every entry point takes `now` (seconds, the shell's clock) and returns at once; workers
are reached through the Worker protocol (core/worker_edge.py) and heard from through
on_batch / on_failed / on_kv / on_worker_death. The daemon (server/daemon.py) is one
shell around it (HTTP, admin, signals, real worker processes, the real clock); the
simulator will be another (virtual clock, simulated workers). What the core decides:
- admission: unknown model (404), queue full (429), context too long (400; the pure
  rules are core/admission.py's);
- queueing: a request for a model with an instance taking prefill work goes to the Rust
  Dispatcher; otherwise it is *held* (the model is loading, restarting or unloaded) for
  up to `model_wait_timeout_s`, then fails with 503 and Retry-After. Held requests go to
  the Dispatcher the moment an instance becomes Active, with a fresh TTFT budget (their
  SLO is already lost; serving them late beats refusing them);
- assignment: Dispatcher ticks turn into Generate messages; rejections into 503s; the
  decode guard (core/decode_guard.py) takes a device decoding past TPOT out of the plan;
- instance states: every change goes through `set_state` (lifecycle/states.py's table),
  which keeps the Dispatcher's ready flags and the held queues in step;
- request end: RequestTable.fail / deliver, then `_finished` tidies the Dispatcher, the
  P/D handoff, telemetry and the shell's observers.
Order of events on a worker's death: its instances leave the Dispatcher (their assigned
but not prefilled requests fail with worker_died), every request whose tokens come from
that worker fails, the instances go Loading (the shell restarts the worker and reloads),
and a model left with no Active instance has its queued requests held.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


from janusd.config import DispatchConfig, ModelConfig
from janusd.core.admission import fit_to_context, late_by
from janusd.core.decode_guard import DecodeGuard
from janusd.core.dispatch import DispatchCore
from janusd.core.held import HeldQueues
from janusd.core.kv_handoff import KVHandoff
from janusd.core.registry import Instance, Model, Registry
from janusd.core.requests import Failure, Refused, Request, RequestTable, no_instance, removed, request_slo
from janusd.core.worker_edge import Worker
from janusd.lifecycle.states import COMING_UP, InstanceState, check_transition
from janusd.log import log
from janusd.telemetry import Telemetry
from janusd.wire import worker_msgs as wm

S = InstanceState
ROLES = ("mixed", "prefill", "decode")  # an instance's engine roles (engine/runner.py)


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


@dataclass(frozen=True)
class Limits:
    queue_limit: int = 256
    model_wait_timeout_s: float = 30.0
    default_max_tokens: int = 1024  # a model's own default_max_tokens overrides it


def _nothing(*_: Any) -> None:
    return None


@dataclass
class Observers:
    """What the shell wants to hear; each default does nothing (tests, the simulator)."""

    finished: Callable[[Request, str], None] = _nothing  # (request, outcome)
    rejected: Callable[[str, str], None] = _nothing  # (model, reason)
    kv_transfer: Callable[[str, str, int, float | None], None] = _nothing
    estimate_error: Callable[[str, float], None] = _nothing  # (model, observed - estimated prefill s)
    serving: Callable[[str], None] = _nothing  # a model got an Active instance
    idle: Callable[[], None] = _nothing  # the last in-flight request ended


class ServingCore:
    def __init__(self, dispatch: DispatchConfig, workers: Mapping[int, Worker], limits: Limits = Limits(),
                 observers: Observers | None = None, telemetry: Telemetry | None = None) -> None:
        self.limits = limits
        self.workers = workers
        self.obs = observers or Observers()
        self.registry = Registry()
        self.requests = RequestTable(on_finish=self._finished)
        self.dispatch = DispatchCore(dispatch, on_estimate_error=lambda m, e: self.obs.estimate_error(m, e))
        self.handoff = KVHandoff(self.requests, workers, self._decode_target,
                                 lambda *a: self.obs.kv_transfer(*a))
        self.telemetry = telemetry or Telemetry()
        self.held = HeldQueues()
        self._admitting: dict[str, int] = {}
        self._tok_rr = 0
        self.guard = DecodeGuard(self.registry, self.dispatch)
        self._now = 0.0  # the time of the event being handled (for paths that end requests)

    def _at(self, now: float) -> float:
        self._now = max(self._now, now)
        return self._now

    # ---------------------------------------------------------------- models
    def add_model(self, cfg: ModelConfig) -> Model:
        return self.registry.add_model(cfg)

    def retune(self, cfg: ModelConfig) -> None:
        """New request-only settings (SLOs, app) for a served model: new requests get them."""
        m = self.registry.models[cfg.name]
        m.cfg = cfg
        self.guard.mark_all()

    def remove_model(self, name: str, now: float) -> None:
        """Forget a model whose instances are all Unloaded; its waiting requests end (404)."""
        self._at(now)
        m = self.registry.model(name)
        if m is None:
            raise KeyError(name)
        busy = [i for i in m.instances.values() if i.state is not S.UNLOADED]
        if busy:
            raise ValueError(f"model {name!r} still has instances on devices {sorted(i.device for i in busy)}")
        for req in self.requests.of_model(name):  # held ones too: ending them empties the held queue
            self.requests.fail(req.rid, removed(name))
        for inst in list(m.instances.values()):
            self.dispatch.leave(inst)
        self.registry.drop_model(name)

    # ------------------------------------------------------------- instances
    def instance(self, model: str, device: int) -> Instance:
        """The instance of `model` on `device`, made (Unloaded) when there is none."""
        m = self.registry.models[model]
        inst = m.instances.get(device)
        if inst is None:
            inst = self.registry.new_instance(m, device)
        return inst

    def set_state(self, inst: Instance, target: InstanceState, now: float, error: str = "") -> None:
        """The one place an instance changes state; raises IllegalTransition per the table."""
        self._at(now)
        check_transition(inst.state, target, f"{inst.model} on device {inst.device}")
        inst.state = target
        inst.error = error
        self.guard.mark(inst.device)
        if target in COMING_UP:  # Loading, Restoring, Forking
            # a fresh membership: work it held was handed back by whoever took it out of
            # Active (on_worker_death ends those requests with the death's reason first)
            self._leave_dispatch(inst, f"{inst.model} on device {inst.device} is reloading", None)
            self.dispatch.join(inst)
        elif target is S.ACTIVE:
            self.dispatch.join(inst)
            inst.saturated = False
        elif target is S.DRAINING:
            self.dispatch.set_ready(inst, False)
        elif target in (S.UNLOADED, S.WARM, S.COLD):
            self._leave_dispatch(inst, f"model {inst.model!r} on device {inst.device} went {target.value}", None)
            inst.decoding.clear()
        m = self.registry.model(inst.model)
        if m is None:
            return
        self._pair(m)
        if target is S.ACTIVE:
            self.dispatch.set_ready(inst, inst.paired)
        if not m.serving:
            self._hold_queued(m.name, now)
        elif target is S.ACTIVE or (m.pd and inst.role == "decode"):  # a decode instance may pair a prefill one
            self._release_held(m.name, now)
        if target is S.ACTIVE:  # a worker that can tokenize for it (admissions waiting on one)
            self.obs.serving(m.name)

    def set_role(self, inst: Instance, role: str, now: float) -> None:
        """The engine role `inst` comes up in next (the controller's choice for an elastic
        P/D app, policy/roles.py). Only while it rests (Warm, Cold, Unloaded): it is out of
        the Dispatcher then, so its next activation joins as the new role does (a decode
        instance never joins) and KVHandoff's decode targets follow its state."""
        self._at(now)
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        m = self.registry.models[inst.model]
        if role != "mixed" and not m.pd:
            raise ValueError(f"model {m.name!r} is not a P/D model (no prefill_devices): its instances run mixed")
        if inst.state not in (S.WARM, S.COLD, S.UNLOADED):
            raise ValueError(f"{inst.model} on device {inst.device} is {inst.state.value}: its role changes only "
                             "while it rests (warm, cold, unloaded)")
        inst.role = role
        self._pair(m)

    def _pair(self, m: Model) -> None:
        """A P/D model's prefill instances take work only while an Active decode instance
        can take their KV (else each request would fail at its handoff; it waits, held,
        instead): keeps `paired` and the Dispatcher's ready flag in step."""
        if not m.pd:
            return
        decoding = any(i.role == "decode" and i.state is S.ACTIVE for i in m.instances.values())
        for i in m.instances.values():
            paired = decoding or i.role != "prefill"
            if paired != i.paired:
                i.paired = paired
                if i.state is S.ACTIVE:
                    self.dispatch.set_ready(i, paired and not i.saturated)

    def _leave_dispatch(self, inst: Instance, message: str, code: str | None) -> None:
        for rid in self.dispatch.leave(inst):
            self.requests.fail(rid, Failure(503, message, code=code))

    def loaded(self, inst: Instance, now: float, max_model_len: int, load_s: float,
               prefill_probe: list[tuple[int, float]] | None = None) -> None:
        """The worker answered ModelLoaded (or StateSet active after a restore or fork):
        Active, unless the instance left Loading/Restoring/Forking meanwhile.
        `prefill_probe` (tokens, seconds) pairs the worker timed seed the prefill estimate."""
        if inst.state not in COMING_UP:
            return
        inst.max_model_len = max_model_len
        inst.load_s = load_s
        self.dispatch.seed(inst, prefill_probe or [])
        self.set_state(inst, S.ACTIVE, now)

    def load_failed(self, inst: Instance, now: float, error: str) -> None:
        if inst.state is S.LOADING:
            self.set_state(inst, S.UNLOADED, now, error=error)

    def on_worker_death(self, device: int, now: float, code: str = "worker_died", why: str = "died") -> None:
        """The worker of `device` is gone (`why`: died, or hung and was killed)."""
        self._at(now)
        for inst in self.registry.on_device(device):
            if inst.state is S.ACTIVE:
                self._leave_dispatch(inst, f"the worker for device {device} {why}", code)
                self.set_state(inst, S.LOADING, now, error=f"worker {why}; restarting")
            elif inst.state is S.DRAINING:
                self.set_state(inst, S.UNLOADED, now, error=f"worker {why} while draining")
            elif inst.state is S.LOADING:
                inst.error = f"worker {why}; restarting"
            elif inst.state in (S.RESTORING, S.FORKING):  # it was coming up: the restart loads it
                self.set_state(inst, S.LOADING, now, error=f"worker {why} while {inst.state.value}; restarting")
            elif inst.state is S.WARM:  # the host copy died with the process
                self.set_state(inst, S.COLD, now, error=f"worker {why}; the host copy is gone")
        for req in self.requests.on_device(device):
            self.requests.fail(req.rid, Failure(503, f"the worker for device {device} {why} while serving this "
                                                     "request", code=code))

    def on_device_failed(self, device: int, now: float) -> None:
        """The device is given up (its restart budget is spent): its instances hold nothing
        and serve nothing; requests for models left without an instance wait, bounded."""
        self._at(now)
        for inst in self.registry.on_device(device):
            if inst.state is S.ACTIVE:
                self.set_state(inst, S.DRAINING, now)
            if inst.state is not S.UNLOADED:
                self.set_state(inst, S.UNLOADED, now, error=f"device {device} failed")

    def _decode_target(self, model: str) -> Instance | None:
        m = self.registry.model(model)
        if m is None:
            return None
        dec = [i for i in m.instances.values() if i.role == "decode" and i.state is S.ACTIVE]
        if not dec:  # the whole model drains: a request still prefilling may finish on a draining one
            dec = [i for i in m.instances.values() if i.role == "decode" and i.state is S.DRAINING]
        return self.dispatch.decode_target(dec)

    # ------------------------------------------------------------- admission
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
              sink: Callable[[Any], None], request_id: str = "") -> Request:
        """Queue a tokenized request (its clock started at `arrival`); raises Refused."""
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
        self._submit(req, now)
        late_by = self._hopeless(req, now)
        if late_by is not None:
            self.dispatch.cancel(req.rid, now)
            self._reject(req.rid, retry_after_s=max(1.0, float(math.ceil(late_by))))
        return req

    def _hopeless(self, req: Request, now: float) -> float | None:
        """With admission = reject_early (and requeue = reject): when even the earliest-free
        instance of the model cannot finish the prefill by the deadline by the estimate,
        how long until it frees up (the Retry-After); None when the request may be on time."""
        cfg = self.dispatch.cfg
        if cfg.admission != "reject_early" or cfg.requeue != "reject":
            return None
        m = self.registry.models[req.model]
        free = [self.dispatch.epdt(i, now) for i in m.instances.values() if i.takes_prefill]
        earliest = min((f for f in free if f is not None), default=None)
        return late_by(earliest, req.est_prefill_s, req.arrival + req.ttft_slo_s, now)

    def _submit(self, req: Request, now: float) -> None:
        m = self.registry.models[req.model]
        req.est_prefill_s = self.dispatch.estimate(list(m.instances.values()), len(req.prompt_ids))
        deadline = req.arrival + req.ttft_slo_s
        if req.held_since is not None:
            deadline = max(deadline, now + req.ttft_slo_s)
            req.held_since = None
        # its value under objective = "tokens": the output tokens it may produce (max_tokens,
        # already capped by the context at admission), the tokens its SLO accounting counts
        self.dispatch.submit(req.rid, req.model, req.arrival, deadline, req.est_prefill_s, req.sampling.max_tokens)

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
        self._at(now)
        n = 0
        for req in list(self.requests.by_id.values()):
            if req.device is not None and (w := self.workers.get(req.device)) is not None:
                w.send(wm.Abort(req.rid))
            self.requests.fail(req.rid, failure)
            n += 1
        return n

    # ----------------------------------------------------------------- time
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
            self._reject(rid)
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

    def _reject(self, rid: int, retry_after_s: float = 1.0) -> None:
        req = self.requests.by_id.get(rid)
        if req is None:
            return
        self.obs.rejected(req.model, "slo")
        cfg = self.dispatch.cfg
        self.requests.fail(rid, Failure(
            503, f"request rejected: it cannot meet its TTFT SLO of {req.ttft_slo_s * 1000:g} ms "
                 f"(dispatch policy {cfg.policy}, requeue={cfg.requeue})", code="slo_unattainable",
            retry_after_s=retry_after_s))

    # ------------------------------------------------------- worker events
    def on_batch(self, device: int, batch: wm.StepBatch, now: float) -> None:
        self._at(now)
        for d in batch.outputs:
            req = self.requests.by_id.get(d.req_id)
            if req is None:
                continue
            if not req.prefill_seen and d.token_ids:
                # before deliver(): a request whose first token is also its last ends inside
                # deliver(), and its prefill time must still reach the estimator and EPDT
                req.prefill_seen = True
                if req.device is not None:
                    req.decode_device = req.device
                    self.guard.count(req.device, +1)
                self.telemetry.on_first_token(req.rid, now)
                if req.instance is not None:
                    self.dispatch.prefill_done(req.rid, req.instance, now, len(req.prompt_ids), d.prefill_s,
                                               req.est_prefill_s)
            elif d.token_ids and req.token_times and req.decode_device == device:
                # a later token: the gap since the last one is the device's decode pace
                self.guard.observe_gap(device, (now - req.token_times[-1]) / len(d.token_ids))
            if d.token_ids:
                self.telemetry.on_tokens(req.rid, now, len(d.token_ids))
            self.requests.deliver(d, now)

    def on_failed(self, device: int, f: wm.RequestFailed, now: float) -> None:
        self._at(now)
        if not self.handoff.accept_failure(device, f.req_id):
            return  # P/D: a stale report from the prefill worker after the handoff
        status = {"bad_request": 400, "unavailable": 503}.get(f.kind, 500)
        self.requests.fail(f.req_id, Failure(status, f.message, "invalid_request_error" if status == 400
                                             else "server_error"))

    def on_kv(self, device: int, msg: wm.KVReady | wm.KVImported, now: float) -> None:
        self._at(now)
        self.handoff.on_message(device, msg)
        req = self.requests.by_id.get(msg.req_id) if isinstance(msg, wm.KVReady) else None
        if req is not None and req.decode_device is not None and req.device is not None \
                and req.device != req.decode_device:
            # handed off: it decodes on the decode instance's device from now on (the decode
            # guard's count and gap samples, and the controller's per-token decode cost)
            self.guard.count(req.decode_device, -1)
            self.guard.count(req.device, +1)
            req.decode_device = req.device

    # ---------------------------------------------------------- request end
    def _finished(self, req: Request) -> None:
        now = self._now
        req.ended_at = now
        self.handoff.on_finished(req)
        if req.decode_device is not None:
            self.guard.count(req.decode_device, -1)
            req.decode_device = None
        if req.held_since is not None:
            self.held.drop(req)
        elif not req.prefill_seen:
            self.dispatch.cancel(req.rid, now)
        if not req.failed:
            outcome = "ok"
        else:
            f = req.failure
            outcome = {499: "cancelled", 400: "bad_request"}.get(getattr(f, "status", 0), "failed")
            if getattr(f, "code", None) == "slo_unattainable":
                outcome = "rejected"
        counted = on_time = 0
        if outcome != "cancelled":
            on_time, counted = request_slo(req)
        req.slo_tokens = (on_time, counted)
        self.telemetry.on_end(req.rid, now, not req.failed, req.num_output_tokens, on_time, counted)
        self.obs.finished(req, outcome)
        if not self.requests.by_id:
            self.obs.idle()

    # ---------------------------------------------------------------- views
    def snapshot(self, now: float) -> dict[str, Any]:
        models = self.registry.models
        return {
            "queues": {n: self.queue_length(n) for n in models},
            "held": {n: self.held.count(n) for n in models},
            "relaxed": {n: self.dispatch.relaxed(n) for n in models},
            "in_flight": {n: self.requests.count(n) for n in models},
            "dispatch": self.dispatch.stats(),
            "instances": [(i.model, i.device, i.state.value) for m in models.values()
                          for i in m.instances.values()],
            "roles": [(i.model, i.device, i.role) for m in models.values() if m.pd for i in m.instances.values()],
            "telemetry": self.telemetry.snapshot(now),
        }

    def check_integrity(self) -> None:
        """Every request in exactly one place; raises RuntimeError naming the first breach."""
        self.dispatch.check_integrity()
        self.held.check(self.requests.by_id)
        for inst in self.registry.instances.values():
            m = self.registry.model(inst.model)
            if m is None or m.instances.get(inst.device) is not inst:
                raise RuntimeError(f"instance {inst.instance_id} is not its model's instance on its device")
            if inst not in self.registry.on_device(inst.device):
                raise RuntimeError(f"instance {inst.instance_id} is missing from device {inst.device}'s index")
