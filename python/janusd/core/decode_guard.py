"""The decode guard: keeps new prefill work off a device that would then decode too slowly.

Per-token attainment under overload is decided by TPOT, not TTFT (bench/RESULTS.md,
dispatch-replay): a prefill admitted onto a device already decoding near the model's
TPOT SLO makes every sequence there late. So an Active instance takes new prefill work
only while its device, with one more sequence decoding, is estimated to stay within the
model's TPOT SLO and that of every sequence decoding there (co-located models of other
SLO classes share the device's pace); an instance with nothing decoding always may (every request is served
eventually). The estimate is an online fit of the device's observed inter-token gaps by
the number of sequences decoding (oracle/decode_estimate.py).

The guard yields (`yield_to_late`): a queued request about to reach its latest start,
that no instance the guard leaves ready can start in time, gets one instance the guard
holds, if that one can still finish its prefill by the deadline (`dispatch.guard_yield_ms`
before the latest start) and the trade pays in tokens. The alternative to the yield is a
refusal, and a refused request loses every one of its tokens (trace/slo.py: each token of
a failed request is missed), so the trade weighs the request's whole max_tokens against
what the yield costs: the tokens still to come of the sequences decoding there that the
delay of one prefill pushes off their SLO curve (on time now, late after the delay).
Without the yield, at light load the guard's holds were the source of the refusals left
(bench/RESULTS.md, [Q]); without the trade, past capacity it turned on-time decode into
late decode (tests/test_sim_golden.py). (Until 2026-12-07, session 5, the request was
credited only the tokens it would produce on time at the device's pace with one more
sequence: a few on a device decoding past its TPOT, so at light load the guard declined
and the request was refused at a free instance: tests/test_core_guard_refusal.py.) A
declined yield is kept (`declined`) until the request leaves the queue, so a refusal that
follows says that the guard's trade made it and with which figures (core/dispatch.py
DeclinedYield).

Owned state: per device, the sequences past their first token and the decode fit, plus
the set of devices whose inputs changed since the guard last looked (None: all), so a
tick costs O(devices changed), not O(instances); per queued request, the yield it last
declined (kept while the request is queued; the refusal that follows takes it). The
guard acts only through the Dispatcher's ready flag (Instance.saturated records that it did).
"""

from __future__ import annotations

from collections.abc import Callable

from janusd.core.dispatch import DeclinedYield, DispatchCore
from janusd.core.registry import Instance, Registry
from janusd.core.requests import Request
from janusd.oracle.decode_estimate import DecodeStepEstimator


class DecodeGuard:
    def __init__(self, registry: Registry, dispatch: DispatchCore) -> None:
        self.registry = registry
        self.dispatch = dispatch
        self.decoding: dict[int, int] = {}  # device -> requests past their first token there
        # device -> {TPOT SLO (s): how many of those decoding there have it}: the tightest bounds the device
        self.tpots: dict[int, dict[float, int]] = {}
        self.fit: dict[int, DecodeStepEstimator] = {}  # device -> seconds per token by sequences
        self._dirty: set[int] | None = None
        self.declined: dict[int, DeclinedYield] = {}  # request id -> the yield last declined for it, while queued

    def mark(self, device: int) -> None:
        """An input of `device` changed (its states, its decoding count or fit)."""
        if self._dirty is not None:
            self._dirty.add(device)

    @property
    def changed(self) -> bool:
        """Some device's inputs changed since the guard last looked."""
        return self._dirty is None or bool(self._dirty)

    def mark_all(self) -> None:
        """Every device may have changed (e.g. a model's SLO was retuned)."""
        self._dirty = None

    def count(self, device: int, delta: int, tpot_s: float = float("inf")) -> None:
        """A sequence with TPOT SLO `tpot_s` started (+1) or stopped (-1) decoding on `device`."""
        n = max(0, self.decoding.get(device, 0) + delta)
        self.decoding[device] = n
        per = self.tpots.setdefault(device, {})
        k = per.get(tpot_s, 0) + delta
        if k > 0:
            per[tpot_s] = k
        else:
            per.pop(tpot_s, None)
        self.mark(device)
        self.dispatch.set_decode_load(device, n)

    def observe_gap(self, device: int, gap_s: float) -> None:
        """One observed time per token on `device` at its current decoding count."""
        fit = self.fit.setdefault(device, DecodeStepEstimator())
        fit.observe(max(1, self.decoding.get(device, 1)), max(0.0, gap_s))
        self.mark(device)

    def apply(self) -> None:
        """Set the ready flag of every instance on a changed device by the rule above."""
        dirty, self._dirty = self._dirty, set()
        if dirty is None:
            insts = list(self.registry.instances.values())
        else:
            insts = [i for d in dirty for i in self.registry.on_device(d)]
        for inst in insts:
            if not (inst.active and inst.dispatched):
                continue
            n = self.decoding.get(inst.device, 0)
            fit = self.fit.get(inst.device)
            m = self.registry.models.get(inst.model)
            tpot = min(m.cfg.tpot_slo_ms / 1000.0 if m is not None else float("inf"), self.tightest(inst.device))
            full = n > 0 and fit is not None and fit.step_s(n + 1) > tpot
            if full != inst.saturated:
                inst.saturated = full
                self.dispatch.set_ready(inst, not full and inst.paired)

    def tightest(self, device: int) -> float:
        """The tightest TPOT SLO among the sequences decoding on `device` (inf: none): a new
        sequence there slows every one of them, so theirs bounds it too, not only its own
        model's. (Until 2026-12-07 only its own: on a device shared by a 100 ms TPOT batch
        model and 50 ms chat and RAG models the batch model took prefills while the device
        decoded at 50-100 ms a token, so chat and RAG decoded late and their instances, held
        at 50 ms, refused their requests: bench/RESULTS.md, [Q] session 4.)"""
        per = self.tpots.get(device)
        return min(per) if per else float("inf")

    def yield_to_late(self, queued: Callable[[str], list[Request]], decoding: Callable[[int], list[Request]],
                      now: float, lead_s: float) -> float | None:
        """Make ready, for the tick about to run, each held instance that a queued request
        needs (the rule above: within `lead_s` of its latest start there, no ready
        instance finishes it in time, this one does, and it costs fewer tokens than it
        saves); the next apply() holds it again. `decoding(device)`: the requests whose
        tokens come from that device. Returns when to look next: the earliest such
        moment still ahead (None: none)."""
        held: dict[str, list[Instance]] = {}
        for inst in self.registry.instances.values():
            if inst.saturated and inst.active and inst.dispatched and inst.paired:
                held.setdefault(inst.model, []).append(inst)
        wake: float | None = None
        seen: set[int] = set()
        for model, insts in held.items():
            m = self.registry.models.get(model)
            if m is None or not self.dispatch.pending(model):
                continue
            ready = [i for i in m.instances.values() if i.active and i.dispatched and i.paired and not i.saturated]
            for req in queued(model):
                seen.add(req.rid)
                at = self._yield_at(req, insts, ready, now, lead_s, decoding)
                if at is not None and at > now:
                    wake = at if wake is None else min(wake, at)
                if not insts:
                    break
        self.declined = {rid: d for rid, d in self.declined.items() if rid in seen}
        return wake

    def _yield_at(self, req: Request, insts: list[Instance], ready: list[Instance], now: float, lead_s: float,
                  decoding: Callable[[int], list[Request]]) -> float | None:
        """The yield rule for one queued request: yields the best of the held `insts` (moved
        to `ready`) when it is due and pays; returns when it is due (None: not for this one)."""
        deadline = self.dispatch.deadline(req.rid)
        if deadline is None:
            return None
        n = len(req.prompt_ids)
        if any(self._finish(i, n, now) <= deadline for i in ready):
            return None  # a ready instance can still take it: nothing to yield
        finish, best = min(((self._finish(i, n, now), i) for i in insts), key=lambda fi: fi[0])
        if finish > deadline:
            return None  # lost either way: the Dispatcher refuses it
        est = self.dispatch.own_estimate(best, n)
        at = deadline - est - lead_s
        if at > now:
            return at
        at_risk = self._at_risk(best.device, est, now, decoding)
        loss = self._refusal_loss(req)
        if at_risk >= loss:  # the delay costs more tokens than refusing it loses
            self.declined[req.rid] = DeclinedYield(best.device, finish, at_risk, loss)
            return at
        self.declined.pop(req.rid, None)
        best.saturated = False
        self.dispatch.set_ready(best, True)
        self.mark(best.device)
        insts.remove(best)
        ready.append(best)
        return at

    def _finish(self, inst: Instance, tokens: int, now: float) -> float:
        """When `inst` would finish a prefill of `tokens` started after the work it has."""
        free = self.dispatch.epdt(inst, now)
        return max(now, free if free is not None else now) + self.dispatch.own_estimate(inst, tokens)

    def _at_risk(self, device: int, delay_s: float, now: float, decoding: Callable[[int], list[Request]]) -> int:
        """Output tokens still to come of the sequences decoding on `device` that a delay
        of `delay_s` pushes off their SLO curve: their next token is on time now and
        would be late after it (trace/slo.py: token i is due at TTFT + (i-1) * TPOT)."""
        seqs = [r for r in decoding(device) if r.prefill_seen and not r.done]
        fit = self.fit.get(device)
        step = fit.step_s(max(1, len(seqs))) if fit is not None else 0.0
        n = 0
        for r in seqs:
            slack = r.arrival + r.ttft_slo_s + r.num_output_tokens * r.tpot_slo_s - now - step
            if 0.0 <= slack < delay_s:
                n += max(0, r.sampling.max_tokens - r.num_output_tokens)
        return n

    @staticmethod
    def _refusal_loss(req: Request) -> int:
        """The tokens a refusal of `req` loses: all of them (its max_tokens)."""
        return req.sampling.max_tokens
