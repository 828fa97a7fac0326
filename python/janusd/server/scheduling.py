"""Dispatch glue: the daemon's real-time shell around the Rust Dispatcher (PAPER.md §6).

The Dispatcher (janusd._native, rust/janus-core/src/dispatch) owns the per-model global
queues, each instance's EPDT and the LST-IMH decision; it is pure and takes the clock
as an argument. This shell feeds it the daemon's clock (monotonic seconds) and:
- submits each request with deadline = arrival + TTFT SLO and p_j from a per
  (model, device) prefill estimate fitted online (prefill_estimate.py); a request's p_j
  is the mean estimate over the model's ready instances;
- sleeps until the Dispatcher's next wake-up (EPDT minus the pre-pull window) or until
  something changes (submit, prefill done, instance change), then ticks it and hands
  each (request, instance) assignment to `on_assign`, each rejection to `on_reject`;
- marks a request's prefill done at its first token (`complete`), which updates EPDT.
Decode routing: a request decodes where it was prefilled, except on a P/D model: its
prefill instances are the Dispatcher's machines, its decode instances are not (they take
no prefill work); after the first token the KV moves to the decode instance with the
least decode backlog (`decode_target`, policy/decode_route.py).
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from janusd.config import DispatchConfig
from janusd.policy.decode_route import DecodeLoad, least_decode_backlog
from janusd.server.prefill_estimate import PrefillEstimator


@dataclass
class Instance:
    """A model on a device. `ready` means Active: loaded and its worker alive."""

    instance_id: int
    model: str
    device: int
    ready: bool = False
    role: str = "mixed"  # mixed (whole requests) | prefill | decode: the P/D roles of a P/D model
    assigned: set[int] = field(default_factory=set)  # requests sent, prefill not yet done
    served: int = 0  # requests ever assigned to this instance
    decoding: dict[int, int] = field(default_factory=dict)  # P/D decode: request -> max_tokens

    @property
    def dispatched(self) -> bool:
        """Takes prefill work from the Dispatcher (every role but a P/D decode instance)."""
        return self.role != "decode"


class Scheduler:
    def __init__(
        self,
        cfg: DispatchConfig,
        on_assign: Callable[[int, Instance], None],
        on_reject: Callable[[int], None],
    ) -> None:
        from janusd._native import Dispatcher

        self.cfg = cfg
        self.dispatcher = Dispatcher(
            policy=cfg.policy,
            prepull_window_s=cfg.prepull_window_ms / 1000.0,
            requeue=cfg.requeue,
            relax_factor=cfg.relax_factor,
            max_relax=cfg.max_relax,
        )
        self.on_assign = on_assign
        self.on_reject = on_reject
        self.instances: dict[int, Instance] = {}
        self.estimators: dict[tuple[str, int], PrefillEstimator] = {}
        self._next_id = 1
        self._req_instance: dict[int, int] = {}
        self._wake = asyncio.Event()

    # ---- instances ----
    def add_instance(self, model: str, device: int, role: str = "mixed") -> Instance:
        inst = Instance(self._next_id, model, device, role=role)
        self._next_id += 1
        self.instances[inst.instance_id] = inst
        if inst.dispatched:
            self.dispatcher.add_instance(inst.instance_id, model)
            self.dispatcher.set_instance_ready(inst.instance_id, False)
        self.estimators.setdefault((model, device), PrefillEstimator())
        return inst

    def set_ready(self, inst: Instance, ready: bool) -> None:
        inst.ready = ready
        if inst.dispatched:
            self.dispatcher.set_instance_ready(inst.instance_id, ready)
        self._wake.set()

    def remove_instance(self, inst: Instance) -> list[int]:
        """Forget an instance; returns the requests it was given whose prefill was not done."""
        self.instances.pop(inst.instance_id, None)
        inst.ready = False
        queued = self.dispatcher.remove_instance(inst.instance_id) if inst.dispatched else []
        returned = set(queued) | inst.assigned
        for rid in returned:
            self._req_instance.pop(rid, None)
        inst.assigned.clear()
        self._wake.set()
        return sorted(returned)

    def instances_of(self, model: str) -> list[Instance]:
        return [i for i in self.instances.values() if i.model == model]

    # ---- requests ----
    def decode_target(self, model: str) -> Instance | None:
        """The ready P/D decode instance of `model` with the least decode backlog."""
        cands = [i for i in self.instances_of(model) if i.role == "decode" and i.ready]
        loads = [DecodeLoad(i.instance_id, len(i.decoding), sum(i.decoding.values())) for i in cands]
        pick = least_decode_backlog(loads)
        return self.instances.get(pick) if pick is not None else None

    def estimate(self, model: str, tokens: int) -> float:
        mine = [i for i in self.instances_of(model) if i.dispatched]
        ready = [i for i in mine if i.ready] or mine
        if not ready:
            return PrefillEstimator().estimate(tokens)
        return sum(self.estimators[(i.model, i.device)].estimate(tokens) for i in ready) / len(ready)

    def submit(self, rid: int, model: str, arrival_s: float, deadline_s: float, tokens: int) -> None:
        self.dispatcher.submit(rid, model, arrival_s, deadline_s, self.estimate(model, tokens))
        self._wake.set()

    def prefill_done(self, rid: int, now: float, tokens: int, prefill_s: float | None) -> None:
        """First token seen: the instance's prefill work for `rid` is over."""
        iid = self._req_instance.pop(rid, None)
        if iid is None:
            return
        inst = self.instances.get(iid)
        if inst is not None:
            inst.assigned.discard(rid)
            if prefill_s is not None and prefill_s >= 0:
                self.estimators[(inst.model, inst.device)].observe(tokens, prefill_s)
        self.dispatcher.complete(rid, now)
        self._wake.set()

    def cancel(self, rid: int, now: float) -> None:
        """The request ended early (client gone, error): drop it from the queue or from its
        instance's EPDT (charging the time it already ran), counted as cancelled."""
        iid = self._req_instance.pop(rid, None)
        if iid is not None and (inst := self.instances.get(iid)) is not None:
            inst.assigned.discard(rid)
        self.dispatcher.cancel(rid, now)
        self._wake.set()

    def pending(self, model: str) -> int:
        return int(self.dispatcher.pending(model))

    def relaxed_of(self, model: str) -> int:
        """Deadline extensions granted to `model`'s queued requests (requeue = relax)."""
        return int(self.dispatcher.relaxed(model))

    def epdt(self, inst: Instance, now: float) -> float:
        return float(self.dispatcher.epdt(inst.instance_id, now))

    def stats(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.dispatcher.stats().items()}

    # ---- the wake loop ----
    def tick(self, now: float) -> float | None:
        """Apply one Dispatcher tick; returns the next wake-up time (or None)."""
        for rid, iid in self.dispatcher.tick(now):
            inst = self.instances.get(iid)
            if inst is None:  # cannot happen today; keep the Dispatcher consistent if it does
                self.dispatcher.cancel(rid, now)
                self.on_reject(rid)
                continue
            inst.assigned.add(rid)
            inst.served += 1
            self._req_instance[rid] = iid
            try:
                self.on_assign(rid, inst)
            except Exception:  # one bad assignment must not lose the rest of this tick's
                traceback.print_exc()
        for rid in self.dispatcher.take_rejected():
            self.on_reject(rid)
        return self.dispatcher.next_wakeup(now)

    async def run(self, clock: Callable[[], float]) -> None:
        """Tick on `clock` (the daemon's request clock, seconds) until cancelled."""
        while True:
            self._wake.clear()
            try:
                wake_at = self.tick(clock())
            except Exception:  # never let one bad tick stop dispatching for good
                traceback.print_exc()
                wake_at = clock() + 0.01
            # at least 1 ms: a wake-up already due must not spin the loop
            timeout = None if wake_at is None else max(0.001, wake_at - clock())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass
