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

from collections import Counter
from collections.abc import Mapping
from typing import Any

from janusd.config import DispatchConfig, ModelConfig
from janusd.core.decode_guard import DecodeGuard
from janusd.core.dispatch import DispatchCore
from janusd.core.held import HeldQueues
from janusd.core.draining import Draining
from janusd.core.instance_moves import InstanceMoves
from janusd.core.intake import Intake
from janusd.core.kv_handoff import KVHandoff
from janusd.core.queueing import Queueing
from janusd.core.registry import Instance, Model, Registry
from janusd.core.requests import Request, RequestTable, removed, request_slo
from janusd.core.shell_hooks import Limits, Observers
from janusd.core.submission import Submission
from janusd.core.tokenizing import Tokenizing
from janusd.core.worker_edge import Worker
from janusd.core.worker_events import WorkerEvents
from janusd.lifecycle.states import InstanceState
from janusd.oracle.prefill_estimate import PrefillEstimator
from janusd.telemetry import ModelWindow, Telemetry

__all__ = ["Limits", "Observers", "ServingCore", "Submission"]

S = InstanceState


class ServingCore(InstanceMoves, Intake, Queueing, Draining, WorkerEvents):
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
        self._drains = {}
        self._tok_rr = 0
        self.guard = DecodeGuard(self.registry, self.dispatch)
        self._now = 0.0  # the time of the event being handled (for paths that end requests)

    # ---------------------------------------------------------------- models
    def add_model(self, cfg: ModelConfig) -> Model:
        return self.registry.add_model(cfg)

    def has_model(self, name: str) -> bool:
        return self.registry.model(name) is not None

    def draining(self) -> bool:
        """Some drain is under way (the simulator runs until every one has ended)."""
        return bool(self._drains)

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
            self.guard.count(req.decode_device, -1, req.tpot_slo_s)
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
    # What the shells (server/, sim/, control/observe.py) read of the core: they call these,
    # never its parts (tests/test_shell_faces.py checks).
    def model(self, name: str) -> Model | None:
        """A model by name: the shells read its config and instances to carry out moves."""
        return self.registry.model(name)

    def models(self) -> Mapping[str, Model]:
        """The models by name, in the order they were added: the shells' views and placement walk them."""
        return self.registry.models

    def instances_on(self, device: int) -> list[Instance]:
        """The instances on `device`, oldest first: a restarted worker reloads them; the simulator's residents."""
        return self.registry.on_device(device)

    def holds(self, inst: Instance) -> bool:
        """Whether `inst` is still its model's instance: a load that ends after an unload or removal frees it."""
        return self.registry.instances.get(inst.instance_id) is inst

    def in_flight(self, model: str | None = None) -> int:
        """Requests not ended yet (of `model`, else of all): status, shutdown and the controller count them."""
        return self.requests.count(model)

    def held_count(self, model: str) -> int:
        """Requests of `model` held for an Active instance: `ctl models` shows them."""
        return self.held.count(model)

    def request(self, rid: int) -> Request:
        """The request in flight with id `rid` (KeyError if none): the simulator's workers read its SLOs."""
        return self.requests.by_id[rid]

    def requests_of(self, model: str) -> list[Request]:
        """The requests of `model` in flight: an unload or a drain waits for (then ends) those on its devices."""
        return self.requests.of_model(model)

    def requests_on(self, device: int) -> list[Request]:
        """The requests whose tokens come from `device`: a fork paces its pull only while there are some."""
        return self.requests.on_device(device)

    def device_load(self, model: str | None = None) -> Counter[int]:
        """Requests in flight per device (of `model`, else of all): the controller's load and P/D role inputs."""
        reqs = self.requests.by_id.values()
        if model is None:
            return Counter(r.device for r in reqs if r.device is not None)
        return Counter(r.device for r in reqs if r.model == model and r.device is not None)

    def window(self, model: str, now: float) -> ModelWindow:
        """The last minute of `model`'s traffic (telemetry/): `ctl models`, the oracle and the controller read it."""
        return self.telemetry.model(model, now)

    def dispatch_stats(self) -> dict[str, int]:
        """The Dispatcher's counters: `ctl status` shows them."""
        return self.dispatch.stats()

    def epdt(self, inst: Instance, now: float) -> float | None:
        """When `inst`'s queued prefill work is estimated to end (None: not in dispatch): `ctl instances`."""
        return self.dispatch.epdt(inst, now)

    def prefill_fits(self, model: str) -> dict[int, PrefillEstimator]:
        """`model`'s online prefill-time fits by device: `ctl instances`, a restore's borrowed fit, the prefill share."""
        return {d: e for (name, d), e in self.dispatch.estimators.items() if name == model}

    def decode_token_s(self, model: str) -> list[float]:
        """Seconds of device time per output token on each of `model`'s devices with a decode fit, at the
        sequences decoding there now (step time / n): the controller's prefill share reads them."""
        costs = []
        for d in self.registry.models[model].instances:
            fit = self.guard.fit.get(d)
            if fit is not None and fit.n:
                n = max(1, self.guard.decoding.get(d, 0))
                costs.append(fit.step_s(n) / n)
        return costs

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
