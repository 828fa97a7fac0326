"""The core's side of the Rust Dispatcher (PAPER.md §6): submit, tick, prefill done.

The Dispatcher (janusd._native, rust/janus-core/src/dispatch) owns the per-model global
queues, EPDT and the LST-IMH decision; it is pure and takes the clock as an argument,
as does everything here. This adds what the Dispatcher does not know:
- EPDT per device: every instance joins its device's group, so co-located models' prefill
  work delays each other (one worker steps them one after another);
- p_j per request from a per (model, device) prefill fit (oracle/prefill_estimate.py),
  the mean over the model's ready instances; its error is reported when the prefill ends;
- P/D decode routing by least decode backlog (policy/decode_route.py): a P/D model's
  decode instances never join the Dispatcher.
Per model, the estimators behind p_j and the members behind the early-refusal test are
kept until the model's instances (core/registry.py EPOCH) or the Dispatcher's membership
change: admission asks for both on every request, and walking the model's ~13 instances
twice per request was a fifth of the simulator's time at 768 devices.
"""

from __future__ import annotations

from collections.abc import Callable

from janusd.config import DispatchConfig
from janusd.core.registry import EPOCH, Instance, Model
from janusd.oracle.prefill_estimate import PrefillEstimator
from janusd.policy.decode_route import DecodeLoad, least_decode_backlog


class DispatchCore:
    def __init__(self, cfg: DispatchConfig, on_estimate_error: Callable[[str, float], None] | None = None) -> None:
        from janusd._native import Dispatcher

        self.cfg = cfg
        self.dispatcher = Dispatcher(
            policy=cfg.policy,
            prepull_window_s=cfg.prepull_window_ms / 1000.0,
            requeue=cfg.requeue,
            relax_factor=cfg.relax_factor,
            max_relax=cfg.max_relax,
            plan=cfg.plan,
            objective=cfg.objective,
        )
        self.estimators: dict[tuple[str, int], PrefillEstimator] = {}
        self._members: dict[int, Instance] = {}  # instance id -> instance, while in the Dispatcher
        self._on_estimate_error = on_estimate_error
        self._version = 0  # bumped when membership or an estimator object changes
        # model -> ((EPOCH, _version), the ready instances' estimators, prefill members' ids)
        self._cache: dict[str, tuple[tuple[int, int], tuple[PrefillEstimator, ...], list[int]]] = {}

    # ---- instances ----
    def join(self, inst: Instance) -> None:
        """The instance takes part in dispatch (not yet ready); decode instances never do."""
        self._version += 1
        self.estimators.setdefault((inst.model, inst.device), PrefillEstimator())
        if inst.dispatched and inst.instance_id not in self._members:
            self.dispatcher.add_instance(inst.instance_id, inst.model, group=inst.device)
            self.dispatcher.set_instance_ready(inst.instance_id, False)
            self._members[inst.instance_id] = inst

    def seed(self, inst: Instance, probe: list[tuple[int, float]]) -> None:
        """Prefill times measured on a freshly loaded instance: a fresh fit from them (a
        reloaded model may sit on a device that got slower or faster meanwhile)."""
        if not probe:
            return
        est = PrefillEstimator()
        for tokens, seconds in probe:
            if tokens >= 0 and seconds >= 0:
                est.observe(tokens, seconds)
        self.estimators[(inst.model, inst.device)] = est
        self._version += 1

    def set_decode_load(self, device: int, sequences: int) -> None:
        """Sequences decoding on `device`: the tie-break between equally free instances."""
        self.dispatcher.set_group_decode_load(device, float(sequences))

    def set_ready(self, inst: Instance, ready: bool) -> None:
        if inst.instance_id in self._members:
            self.dispatcher.set_instance_ready(inst.instance_id, ready)

    def leave(self, inst: Instance) -> list[int]:
        """Take the instance out; returns the requests it was given whose prefill was not done."""
        if self._members.pop(inst.instance_id, None) is None:
            return []
        self._version += 1
        return list(self.dispatcher.remove_instance(inst.instance_id))

    def member(self, iid: int) -> Instance | None:
        return self._members.get(iid)

    # ---- requests ----
    def estimate(self, instances: list[Instance], tokens: int) -> float:
        """p_j of a request of `tokens` prompt tokens: the mean fit over the model's ready
        prefill instances (all of them while none is ready; the prior without any)."""
        mine = [i for i in instances if i.instance_id in self._members]
        ready = [i for i in mine if i.active] or mine
        if not ready:
            return PrefillEstimator().estimate(tokens)
        return sum(self.estimators[(i.model, i.device)].estimate(tokens) for i in ready) / len(ready)

    def _model_cache(self, m: Model) -> tuple[tuple[int, int], tuple[PrefillEstimator, ...], list[int]]:
        key = (EPOCH.n, self._version)
        c = self._cache.get(m.name)
        if c is not None and c[0] == key:
            return c
        insts = list(m.instances.values())
        mine = [i for i in insts if i.instance_id in self._members]
        ready = [i for i in mine if i.active] or mine
        prefill = tuple(i.instance_id for i in insts if i.takes_prefill and i.instance_id in self._members)
        c = (key, tuple(self.estimators[(i.model, i.device)] for i in ready), list(prefill))
        self._cache[m.name] = c
        return c

    def estimate_model(self, m: Model, tokens: int) -> float:
        """estimate(m's instances, tokens), the same number, from the per-model cache."""
        ests = self._model_cache(m)[1]
        if not ests:
            return PrefillEstimator().estimate(tokens)
        t = max(tokens, 0)
        vals = []
        for e in ests:
            a, b = e.coefficients()
            vals.append(a + b * t)
        return sum(vals) / len(vals)

    def earliest_free(self, m: Model, now: float) -> float | None:
        """The least EPDT over m's instances that take prefill work (None: none in the
        Dispatcher): the early-refusal test's input."""
        ids = self._model_cache(m)[2]
        return self.dispatcher.min_epdt(ids, now) if ids else None

    def submit(self, rid: int, model: str, arrival_s: float, deadline_s: float, est_s: float,
               value_tokens: int = 1) -> None:
        """`value_tokens`: what the request is worth under objective = "tokens"."""
        self.dispatcher.submit(rid, model, arrival_s, deadline_s, est_s, float(value_tokens))

    def prefill_done(self, rid: int, inst: Instance, now: float, tokens: int, prefill_s: float | None,
                     est_s: float) -> None:
        """First token seen: the instance's prefill work for `rid` is over."""
        if prefill_s is not None and prefill_s >= 0:
            est = self.estimators.get((inst.model, inst.device))
            if est is not None:
                est.observe(tokens, prefill_s)
            if self._on_estimate_error is not None:
                self._on_estimate_error(inst.model, prefill_s - est_s)
        self._complete(rid, now)

    def _complete(self, rid: int, now: float) -> None:
        try:
            self.dispatcher.complete(rid, now)
        except ValueError:
            pass  # handed back by remove_instance meanwhile: nothing left to complete

    def cancel(self, rid: int, now: float) -> None:
        """The request ended before its prefill was done: out of the queue or its EPDT."""
        self.dispatcher.cancel(rid, now)

    def tick(self, now: float) -> tuple[list[tuple[int, int]], list[int]]:
        assigned = self.dispatcher.tick(now)
        return assigned, self.dispatcher.take_rejected()

    def next_wakeup(self, now: float) -> float | None:
        return self.dispatcher.next_wakeup(now)

    def decode_target(self, candidates: list[Instance]) -> Instance | None:
        """The ready P/D decode instance with the least decode backlog."""
        loads = [DecodeLoad(i.instance_id, len(i.decoding), sum(i.decoding.values())) for i in candidates]
        pick = least_decode_backlog(loads)
        return next((i for i in candidates if i.instance_id == pick), None)

    # ---- views ----
    def pending(self, model: str) -> int:
        return int(self.dispatcher.pending(model))

    def relaxed(self, model: str) -> int:
        return int(self.dispatcher.relaxed(model))

    def epdt(self, inst: Instance, now: float) -> float | None:
        if inst.instance_id not in self._members:
            return None
        return float(self.dispatcher.epdt(inst.instance_id, now))

    def stats(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.dispatcher.stats().items()}

    def check_integrity(self) -> None:
        self.dispatcher.check_integrity()
