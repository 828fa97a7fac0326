"""The core's side of the Rust Dispatcher (PAPER.md §6): submit, tick, prefill done.

The Dispatcher (janusd._native, rust/janus-core/src/dispatch) owns the per-model global
queues, EPDT and the LST-IMH decision; it is pure and takes the clock as an argument,
as does everything here. This adds what the Dispatcher does not know:
- EPDT per device: every instance joins its device's group, so co-located models' prefill
  work delays each other (one worker steps them one after another);
- each instance's own prefill time: the per (model, device) fit (oracle/prefill_estimate.py)
  is handed to the Dispatcher as the instance's `a + b * tokens` after every change, and
  each request carries its prompt's tokens, so a job costs the instance it is planned on
  what that instance's fit says (a slower device, a device shared with other models).
  The submitted p_j (the mean over the model's ready instances) is only the fallback of an
  instance with no fit; a request's error is reported against its instance's own estimate;
- P/D decode routing by least decode backlog (policy/decode_route.py): a P/D model's
  decode instances never join the Dispatcher.
Per model, the estimators behind p_j and the members behind the early-refusal test are
kept until the model's instances (core/registry.py EPOCH) or the Dispatcher's membership
change: admission asks for both on every request, and walking the model's ~13 instances
twice per request was a fifth of the simulator's time at 768 devices.

Refusals: every request refused for its TTFT SLO (at admission, or by the Dispatcher's
requeue) is described by a `Refusal`: the estimate and deadline the refusal used and
each instance's figures at that moment (EPDT, ready, requests given), so the log line
and the metrics show whether it was hopeless by that estimate or the estimate was off,
and, when the decode guard held an instance that would have finished it in time, the
guard's declined trade (DeclinedYield).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from janusd.config import DispatchConfig
from janusd.core.registry import EPOCH, Instance, Model
from janusd.oracle.prefill_estimate import PrefillEstimator
from janusd.policy.decode_route import DecodeLoad, least_decode_backlog


@dataclass(frozen=True)
class InstanceFigure:
    """One instance of the refused request's model at the refusal."""

    device: int
    epdt_s: float  # its device group's EPDT minus now (0: free now)
    ready: bool  # takes new prefill work now (False: e.g. the decode guard holds it)
    given: int  # requests given to it whose prefill is not done
    est_s: float = 0.0  # its own (model, device) prefill estimate for the prompt: what the refusal used


@dataclass(frozen=True)
class DeclinedYield:
    """The decode guard's trade (core/decode_guard.py) declined to yield a held instance
    that would have finished the request's prefill in time: what it weighed."""

    device: int  # the held instance's device
    finish: float  # when that instance would have finished the prefill (absolute; <= the deadline)
    at_risk: int  # output tokens of sequences decoding there the delay pushes off their SLO curve
    tokens: int  # what refusing the request loses: its max_tokens


@dataclass(frozen=True)
class Refusal:
    """A request refused for its TTFT SLO and the figures the refusal used."""

    rid: int
    model: str
    stage: str  # "admission" (early refusal) | "queue" (past its latest start while queued)
    now: float
    est_s: float  # the request's submitted p_j (the mean over the model's instances)
    deadline: float  # the TTFT deadline it was planned against (absolute)
    queued: int  # the model's requests queued in the Dispatcher after this one left
    instances: tuple[InstanceFigure, ...]
    tokens: int = 0  # its prompt tokens
    est_now_s: float | None = None  # the estimate for its prompt at the refusal (the fit moves)
    declined: DeclinedYield | None = None  # the guard's declined yield that left it to be refused

    @property
    def earliest_s(self) -> float | None:
        """The least EPDT - now over the instances (None: none)."""
        return min((i.epdt_s for i in self.instances), default=None)

    @property
    def late_by_s(self) -> float | None:
        """How late the prefill would end on the instance that would finish it first, each
        by its own estimate after the work it has (> 0 for a refusal the estimate justifies;
        <= 0: some instance could have finished it in time, a false refusal)."""
        if not self.instances:
            return None
        return self.now + min(i.epdt_s + i.est_s for i in self.instances) - self.deadline

    @property
    def justified(self) -> str:
        """"no": some instance could have finished it in time by its own estimate (a false
        refusal); "guard": not at the refusal, but a held instance could have when the decode
        guard's trade declined to yield it (the refusal is the guard's choice, in tokens);
        "yes": neither."""
        late = self.late_by_s
        if late is not None and late <= 0:
            return "no"
        return "guard" if self.declined is not None else "yes"

    def line(self) -> str:
        insts = ", ".join(f"dev{i.device} epdt +{i.epdt_s * 1000:.1f} ms {'ready' if i.ready else 'held'} "
                          f"{i.given} given est {i.est_s * 1000:.1f} ms" for i in self.instances) or "none"
        late = self.late_by_s
        return (f"refused request {self.rid} ({self.model}) at {self.stage}: est {self.est_s * 1000:.1f} ms, "
                f"deadline in {(self.deadline - self.now) * 1000:.1f} ms, late by "
                f"{'?' if late is None else f'{late * 1000:.1f}'} ms on the instance finishing first; "
                f"instances: {insts}; queued {self.queued}; {self.tokens} prompt tokens, estimate now "
                f"{'?' if self.est_now_s is None else f'{self.est_now_s * 1000:.1f}'} ms{self._declined_words()}")

    def _declined_words(self) -> str:
        d = self.declined
        if d is None:
            return ""
        return (f"; the decode guard declined to yield dev{d.device} (done {(self.deadline - d.finish) * 1000:.1f} "
                f"ms before the deadline): {d.at_risk} tokens of its decoding sequences at risk >= the "
                f"request's {d.tokens}")


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
        self._deadline: dict[int, float] = {}  # request id -> its deadline, while queued or prefilling
        self._on: dict[tuple[str, int], list[int]] = {}  # (model, device) -> member instance ids

    # ---- instances ----
    def join(self, inst: Instance) -> None:
        """The instance takes part in dispatch (not yet ready); decode instances never do."""
        self._version += 1
        key = (inst.model, inst.device)
        self.estimators.setdefault(key, PrefillEstimator())
        if inst.dispatched and inst.instance_id not in self._members:
            self.dispatcher.add_instance(inst.instance_id, inst.model, group=inst.device)
            self.dispatcher.set_instance_ready(inst.instance_id, False)
            self._members[inst.instance_id] = inst
            self._on.setdefault(key, []).append(inst.instance_id)
            self._push_fit(key)

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
        self._push_fit((inst.model, inst.device))

    def _push_fit(self, key: tuple[str, int]) -> None:
        """The Dispatcher's copy of (model, device)'s prefill fit, on each of its instances."""
        est = self.estimators.get(key)
        if est is None:
            return
        fit = est.coefficients()
        for iid in self._on.get(key, ()):
            self.dispatcher.set_prefill_fit(iid, fit)

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
        ids = self._on.get((inst.model, inst.device), [])
        if inst.instance_id in ids:
            ids.remove(inst.instance_id)
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

    def own_estimate(self, inst: Instance, tokens: int) -> float:
        """The instance's own (model, device) prefill estimate for `tokens`."""
        est = self.estimators.get((inst.model, inst.device))
        return (est or PrefillEstimator()).estimate(tokens)

    def earliest_finish(self, m: Model, tokens: int, est_s: float, now: float) -> float | None:
        """The earliest any of m's instances taking prefill work could finish a prompt of
        `tokens` by its own estimate after the work it has (None: none in the Dispatcher):
        the early-refusal test's input."""
        ids = self._model_cache(m)[2]
        return self.dispatcher.earliest_finish(ids, float(tokens), est_s, now) if ids else None

    def earliest_free(self, m: Model, now: float) -> float | None:
        """The least EPDT over m's instances that take prefill work (None: none in the
        Dispatcher): a refused request's Retry-After."""
        ids = self._model_cache(m)[2]
        return self.dispatcher.min_epdt(ids, now) if ids else None

    def submit(self, rid: int, model: str, arrival_s: float, deadline_s: float, est_s: float,
               value_tokens: int = 1, prompt_tokens: int = 0) -> None:
        """`value_tokens`: what the request is worth under objective = "tokens";
        `prompt_tokens`: what each instance's prefill fit reads."""
        self._deadline[rid] = deadline_s
        self.dispatcher.submit(rid, model, arrival_s, deadline_s, est_s, float(value_tokens),
                               float(max(prompt_tokens, 0)))

    def prefill_done(self, rid: int, inst: Instance, now: float, tokens: int, prefill_s: float | None,
                     est_s: float) -> None:
        """First token seen: the instance's prefill work for `rid` is over."""
        if prefill_s is not None and prefill_s >= 0:
            key = (inst.model, inst.device)
            est = self.estimators.get(key)
            if est is not None:
                est.observe(tokens, prefill_s)
                self._push_fit(key)
            if self._on_estimate_error is not None:
                self._on_estimate_error(inst.model, prefill_s - est_s)
        self._complete(rid, now)

    def _complete(self, rid: int, now: float) -> None:
        self._deadline.pop(rid, None)
        try:
            self.dispatcher.complete(rid, now)
        except ValueError:
            pass  # handed back by remove_instance meanwhile: nothing left to complete

    def cancel(self, rid: int, now: float) -> None:
        """The request ended before its prefill was done: out of the queue or its EPDT."""
        self._deadline.pop(rid, None)
        self.dispatcher.cancel(rid, now)

    def tick(self, now: float) -> tuple[list[tuple[int, int]], list[int]]:
        assigned = self.dispatcher.tick(now)
        return assigned, self.dispatcher.take_rejected()

    def wants_tick(self) -> bool:
        return bool(self.dispatcher.wants_tick())

    def next_wakeup(self, now: float) -> float | None:
        return self.dispatcher.next_wakeup(now)

    def decode_target(self, candidates: list[Instance]) -> Instance | None:
        """The ready P/D decode instance with the least decode backlog."""
        loads = [DecodeLoad(i.instance_id, len(i.decoding), sum(i.decoding.values())) for i in candidates]
        pick = least_decode_backlog(loads)
        return next((i for i in candidates if i.instance_id == pick), None)

    def deadline(self, rid: int) -> float | None:
        """The TTFT deadline `rid` was submitted with, while it is queued or prefilling."""
        return self._deadline.get(rid)

    def forget(self, rid: int) -> None:
        """A request the Dispatcher dropped on its own (rejected) is gone here too."""
        self._deadline.pop(rid, None)

    def refusal(self, rid: int, m: Model, stage: str, now: float, est_s: float, tokens: int,
                deadline: float | None = None, declined: DeclinedYield | None = None) -> Refusal:
        """The figures of a refusal of request `rid` of model `m` at `now` (its deadline
        as submitted unless given; `declined`: the decode guard's yield it declined for
        it); forgets the request's deadline."""
        dl = self._deadline.pop(rid, None)
        if deadline is None:
            deadline = dl if dl is not None else now
        figs = []
        for i in sorted(m.instances.values(), key=lambda i: i.device):
            if i.instance_id in self._members:
                epdt, ready, given = self.dispatcher.instance_figures(i.instance_id, now)
                own = self.estimators.get((i.model, i.device))
                figs.append(InstanceFigure(i.device, max(0.0, epdt - now), bool(ready), int(given),
                                           own.estimate(tokens) if own is not None else est_s))
        return Refusal(rid, m.name, stage, now, est_s, deadline, self.pending(m.name), tuple(figs), tokens,
                       self.estimate_model(m, tokens), declined)

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
