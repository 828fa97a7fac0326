"""ServingCore: the daemon's request path without asyncio, sockets or a clock.

Every entry point takes `now` (seconds, the shell's clock) and returns at once; workers
are reached through the Worker protocol (core/worker_edge.py) and heard from through
on_batch / on_failed / on_kv / on_worker_death. The daemon (server/daemon.py) is one
shell around it (HTTP, admin, signals, real worker processes, the real clock); the
simulator will be another (virtual clock, simulated workers). What the core decides:
- admission: unknown model (404), queue full (429), tokenizing a text prompt on a worker
  with an Active instance (core/intake.py), context too long (400; the pure rules are
  core/admission.py's);
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
The parts, each its own module (the shared state named in core/core_state.py): instance
moves (instance_moves.py), admission to assignment (queueing.py), worker events
(worker_events.py); this module builds them into one object and ends requests.
Order of events on a worker's death: its instances leave the Dispatcher (their assigned
but not prefilled requests fail with worker_died), every request whose tokens come from
that worker fails, the instances go Loading (the shell restarts the worker and reloads),
and a model left with no Active instance has its queued requests held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from janusd.config import DispatchConfig, ModelConfig
from janusd.core.decode_guard import DecodeGuard
from janusd.core.dispatch import DispatchCore
from janusd.core.held import HeldQueues
from janusd.core.instance_moves import InstanceMoves
from janusd.core.intake import Intake
from janusd.core.kv_handoff import KVHandoff
from janusd.core.queueing import Queueing
from janusd.core.registry import Model, Registry
from janusd.core.requests import Request, RequestTable, removed, request_slo
from janusd.core.shell_hooks import Limits, Observers
from janusd.core.submission import Submission
from janusd.core.tokenizing import Tokenizing
from janusd.core.worker_edge import Worker
from janusd.core.worker_events import WorkerEvents
from janusd.lifecycle.states import InstanceState
from janusd.telemetry import Telemetry

__all__ = ["Limits", "Observers", "ServingCore", "Submission"]

S = InstanceState


class ServingCore(InstanceMoves, Intake, Queueing, WorkerEvents):
    """The request path's one object: models, and its parts' state (core/core_state.py);
    the shells call only its methods."""

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
        self.tokenizing = Tokenizing()
        self._tok_rr = 0
        self.guard = DecodeGuard(self.registry, self.dispatch)
        self._now = 0.0  # the time of the event being handled (for paths that end requests)

    # ---------------------------------------------------------------- models
    def add_model(self, cfg: ModelConfig) -> Model:
        return self.registry.add_model(cfg)

    def has_model(self, name: str) -> bool:
        return self.registry.model(name) is not None

    def waiting_models(self) -> list[str]:
        """Models with requests held for an Active instance (after a worker's restart the
        shell asks again to wake them: a wake its death interrupted is not retried)."""
        return sorted({r.model for r in self.held})

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
        elif req.untokenized is not None:
            self.tokenizing.finish(req.rid)
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
        self.tokenizing.check(self.requests.by_id)
        for inst in self.registry.instances.values():
            m = self.registry.model(inst.model)
            if m is None or m.instances.get(inst.device) is not inst:
                raise RuntimeError(f"instance {inst.instance_id} is not its model's instance on its device")
            if inst not in self.registry.on_device(inst.device):
                raise RuntimeError(f"instance {inst.instance_id} is missing from device {inst.device}'s index")
