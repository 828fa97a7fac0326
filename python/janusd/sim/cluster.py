"""The simulator's event loop: the daemon's ServingCore on a virtual clock.

What is real here is the daemon's: core/serving.py's ServingCore (admission, held queues,
the Rust Dispatcher with EPDT and LST-IMH, telemetry) is driven exactly as server/daemon.py
drives it (admit, tick at the time it asks, on_batch / on_failed from workers). What is
simulated: the workers (sim/worker.py, behind the Worker protocol) and time.

Events, in time order (ties: arrivals first, then worker events by device, then ticks):
- an arrival from the trace: a Submission to ServingCore.submit, as the HTTP handler makes,
  but already tokenized (the prompt is `input_tokens` placeholder ids; max_tokens is the trace's
  output_tokens and the simulated engine produces exactly that many);
- a worker event: its step segment ended (sim/worker.py); the token deltas go to
  core.on_batch, failures to core.on_failed;
- a core tick at the time the last tick asked for (the Dispatcher's next wake-up).
After every event the core is ticked, as the daemon's tick task does after each event.

Telemetry: the core's windows span `telemetry_window_s` (10 s by default, not the
daemon's 60 s): the controller's loads come from them, and on a trace compressed 48x
(a day in 30 min) a 60 s window averages 48 minutes of the day, so a burst would reach
the elastic demand only after it is over.

Served models: every (app, trace model) pair is a served model of its own (the paper's
apps each have their own model); its name is the app's, or app/model when an app uses
several models. Its architecture comes from sim/specs.py; its SLOs (in its ModelConfig:
what the decode guard and the controller's oracle plan for) are the median of its
requests' SLO columns, the architecture's defaults where the trace has none; a request's
own SLO columns win for its dispatch deadline and accounting.

Device-hours (PAPER.md §9 compares 13,440 with 768 x 24): a device counts while it holds
an instance of some model in a state that holds device memory and serves or is about to
(Loading, Active or Draining), from time 0 to the end of the run (the last request's
end). Fixed placements hold their devices throughout. An instance of a tp-N model holds
the N devices of its group (lead .. lead + N - 1, control/groups.py); a device counts
once however many instances hold it.

Device groups: one SimWorker per group, keyed by its lead, steps every resident of the
group together (sim/perfmodel.py). The simulator models no device shared by groups of
different shapes (a tp-1 instance on one device of a tp-2 group would run on a worker of
its own that the group's step does not see), so `blocked` names such a device and the
controller's shell refuses the activation there, as a worker's out-of-memory refuses it.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable

import numpy as np

from janusd.config import DispatchConfig, ModelConfig
from janusd.core import Failure, Limits, Observers, Refused, ServingCore, Submission
from janusd.lifecycle.states import InstanceState, holds_device_memory
from janusd.sim.perfmodel import PerfModel
from janusd.sim.served import RunOutcome, Served, TraceColumns, OutcomeLists
from janusd.sim.specs import SimModel
from janusd.sim.worker import EngineLimits, SimWorker
from janusd.telemetry import Telemetry
from janusd.trace import slo
from janusd.trace.formats import Trace
from janusd.trace.results import RequestResult, Status
from janusd.wire import worker_msgs as wm

class Cluster:
    """One simulation: a trace, a pool of devices, the served models, a controller.

    `controller` (sim/policies.py) places instances before the first arrival and may act
    at its own periods through `every(period_s, fn)`; fixed placements only place."""

    def __init__(self, trace: Trace, served: list[Served], request_model: np.ndarray, perf: PerfModel,
                 devices: int, dispatch: DispatchConfig, engine: EngineLimits = EngineLimits(),
                 keep_times: bool = False, model_wait_timeout_s: float = 30.0,
                 telemetry_window_s: float = 10.0) -> None:
        self.trace = trace
        self.served = {s.name: s for s in served}
        self.req_model = [served[i].name for i in range(len(served))]
        self.request_model = request_model
        self.perf = perf
        self.n_devices = devices
        self.keep_times = keep_times
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int]] = []  # (time, kind, key, seq)
        self._seq = 0
        self.workers: dict[int, SimWorker] = {}
        self.groups: dict[int, list[int]] = {}  # worker (leader device) -> its devices
        self.engine = engine
        n = len(trace.arrival_s)
        # per request, as Python lists while the run fills them in (a numpy item write costs
        # several times a list's); outcome() makes the arrays
        self._res = OutcomeLists(n, trace.output_tokens.astype(np.int64).tolist())
        self._index: dict[int, int] = {}  # core rid -> trace row
        self.refused = 0
        self.outcome_counts: dict[str, int] = {}
        obs = Observers(finished=self._finished)
        self.core = ServingCore(dispatch, self.workers, Limits(queue_limit=1 << 30,
                                                                model_wait_timeout_s=model_wait_timeout_s,
                                                                default_max_tokens=1 << 20), obs,
                                Telemetry(window_s=telemetry_window_s, bucket_s=1.0))
        for s in served:
            self.core.add_model(ModelConfig(name=s.name, checkpoint=f"sim:{s.arch.name}", app=s.app,
                                            ttft_slo_ms=s.ttft_slo_ms, tpot_slo_ms=s.tpot_slo_ms,
                                            tp=s.arch.tp, max_model_len=s.arch.max_model_len))
        self.arrivals_left = len(trace.arrival_s)
        self._tick_at = math.inf
        self._timers: list[tuple[float, Callable[[float], None]]] = []
        self._device_s = 0.0  # device-seconds held (module doc)
        self._held_devices = 0
        self._held_since = 0.0
        self.device_series: list[tuple[float, int, int]] = [(0.0, 0, 0)]
        self._devices_dirty = False  # an instance changed state: count devices after this event
        self._holding: dict[int, int] = {}  # device -> instances holding memory on it
        self._spans: dict[int, dict[tuple[int, int], int]] = {}  # device -> (lead, tp) of those -> count
        self._held_now = 0  # devices holding some instance (kept by set_state)
        self._insts_now = 0  # instances holding device memory
        self.on_arrival: Callable[[int, float], None] | None = None  # (trace row, now): the controller's counts
        self.on_done: Callable[[int, float], None] | None = None  # (trace row, now) of each ok end: a closed loop
        self.figures: Callable[[], dict[str, int]] | None = None  # the controller's own counts, for the summary
        self._cols = TraceColumns(trace, [self.req_model[k] for k in request_model.tolist()])

    # ------------------------------------------------------------- devices
    def worker(self, devices: list[int]) -> SimWorker:
        """The simulated worker of a device group (made on first use)."""
        lead = devices[0]
        w = self.workers.get(lead)
        if w is None:
            w = SimWorker(lead, self.perf, self._schedule_worker, lambda: self.now, self._meta, self.engine,
                          self.keep_times)
            self.workers[lead] = w
            self.groups[lead] = list(devices)
        return w

    def _meta(self, rid: int) -> tuple[float, float, float]:
        req = self.core.request(rid)
        return req.arrival, req.ttft_slo_s, req.tpot_slo_s

    def residents(self, lead: int) -> dict[str, SimModel]:
        return {i.model: self.served[i.model].arch for i in self.core.instances_on(lead)
                if holds_device_memory(i.state)}

    def set_state(self, model: str, lead: int, target: InstanceState, now: float) -> None:
        """Move an instance (through the core's set_state) and keep the worker's residents
        and the device-hours in step."""
        inst = self.core.instance(model, lead)
        before = holds_device_memory(inst.state)
        self.core.set_state(inst, target, now)
        self.worker(self.groups.get(lead, [lead])).set_residents(self.residents(lead))
        delta = int(holds_device_memory(inst.state)) - int(before)
        if delta:
            tp = self.served[model].arch.tp
            for d in range(lead, lead + tp):
                k = self._holding.get(d, 0)
                self._holding[d] = k + delta
                if (k == 0) != (k + delta == 0):
                    self._held_now += delta
                spans = self._spans.setdefault(d, {})
                spans[(lead, tp)] = spans.get((lead, tp), 0) + delta
            self._insts_now += delta
            self._devices_dirty = True

    def holding(self, device: int) -> int:
        """Instances holding memory on `device` (of any group covering it)."""
        return self._holding.get(device, 0)

    def blocked(self, model: str, lead: int) -> int | None:
        """A device of the group `model` would take at `lead` that an instance of another
        group shape holds memory on (module doc), or None."""
        tp = self.served[model].arch.tp
        for d in range(lead, lead + tp):
            if any(n > 0 and span != (lead, tp) for span, n in self._spans.get(d, {}).items()):
                return d
        return None

    def place(self, model: str, devices: list[int], now: float, load_s: float = 0.0,
              via: InstanceState = InstanceState.LOADING,
              on_done: Callable[[float], None] | None = None) -> None:
        """An instance of `model` on the group `devices`: `via` (Loading, Restoring from
        Warm or Cold, Forking) now, Active after load_s; then on_done(t)."""
        self.worker(devices)
        lead = devices[0]
        self.set_state(model, lead, via, now)

        def up(t: float) -> None:
            self._loaded(model, lead, t)
            if on_done is not None:
                on_done(t)

        if load_s <= 0:
            up(now)
        else:
            self.at(now + load_s, up)

    def drain(self, model: str, lead: int, now: float, to: InstanceState = InstanceState.UNLOADED,
              on_done: Callable[[float], None] | None = None) -> None:
        """Active -> Draining (the core's drain, unbounded here: the simulated worker
        always finishes); `to` (Unloaded, Warm or Cold) once its requests have ended,
        then on_done(t)."""

        def over(t: float, _ended: int) -> None:
            self.set_state(model, lead, to, t)
            if on_done is not None:
                on_done(t)

        self.core.drain(self.core.instance(model, lead), now, math.inf, _NEVER, over)

    def _loaded(self, model: str, lead: int, now: float) -> None:
        inst = self.core.instance(model, lead)
        arch = self.served[model].arch
        probe = [(n, self.perf.prefill_s(arch, n)) for n in (128, 512, 2048)]
        self.core.loaded(inst, now, arch.max_model_len, 0.0, probe)

    def _count_devices(self, now: float) -> None:
        """Close the device-seconds since the last change and record the new counts
        (kept up to date by set_state: the module doc's definition)."""
        self._device_s += self._held_devices * (now - self._held_since)
        held, insts = self._held_now, self._insts_now
        self._held_devices, self._held_since = held, now
        if self.device_series[-1][1:] != (held, insts):
            if self.device_series[-1][0] == now:
                self.device_series[-1] = (now, held, insts)
            else:
                self.device_series.append((now, held, insts))

    # --------------------------------------------------------------- events
    def _push(self, t: float, kind: int, key: int) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, key, self._seq))

    def _schedule_worker(self, lead: int, t: float) -> None:
        self._push(t, 1, lead)

    @property
    def busy(self) -> bool:
        """Requests still to come or in flight (periodic controller loops stop after)."""
        return self.arrivals_left > 0 or self.core.in_flight() > 0 or self.core.draining()

    def at(self, t: float, fn: Callable[[float], None]) -> None:
        """Call fn(t) at virtual time t (controller timers, load completions)."""
        self._timers.append((t, fn))
        self._push(t, 0, len(self._timers) - 1)

    def run(self, on_progress: Callable[[float], None] | None = None) -> float:
        """Replay the whole trace; returns the wall seconds it took."""
        wall0 = time.perf_counter()
        self._count_devices(self.now)
        self._devices_dirty = False
        arrivals = self._cols.arrival
        n = len(arrivals)
        heap = self._heap
        core = self.core
        i = 0
        while True:
            t_arr = arrivals[i] if i < n else math.inf
            t_ev = heap[0][0] if heap else math.inf
            if t_arr == math.inf and t_ev == math.inf:
                break
            if t_arr <= t_ev:
                self.now = t_arr
                self._arrive(i, t_arr)
                i += 1
                self.arrivals_left = n - i
            else:
                t, kind, key, _ = heapq.heappop(heap)
                self.now = t
                if kind == 1:
                    w = self.workers[key]
                    deltas = w.on_event(t)
                    failed, w.failed = w.failed, []
                    for f in failed:
                        core.on_failed(key, f, t)
                    if deltas:
                        core.on_batch(key, wm.StepBatch(deltas), t)
                    elif not failed:
                        continue
                elif kind == 0:
                    self._timers[key][1](t)
                else:  # a tick the core asked for
                    if t != self._tick_at:
                        continue
                    self._tick_at = math.inf
            wake = core.tick(self.now)  # drains that ended rest their instances here
            if self._devices_dirty:
                self._devices_dirty = False
                self._count_devices(self.now)
            if wake is not None and wake < self._tick_at:
                self._tick_at = max(wake, self.now)
                self._push(self._tick_at, 2, 0)
            if on_progress is not None and (i & 0xFFFF) == 0:
                on_progress(self.now)
        self._count_devices(self.now)
        return time.perf_counter() - wall0

    def _arrive(self, i: int, now: float) -> None:
        cols = self._cols
        name = cols.name[i]
        if self.on_arrival is not None:
            self.on_arrival(i, now)
        ttft = cols.ttft[i]
        tpot = cols.tpot[i]
        try:
            req = self.core.submit(Submission(name, wm.SamplingSpec(max_tokens=cols.out[i], ignore_eos=True), now,
                                              prompt_ids=[1] * cols.inp[i],
                                              ttft_ms=None if math.isnan(ttft) else ttft,
                                              tpot_ms=None if math.isnan(tpot) else tpot, request_id=str(i)),
                                   now, _drop)
        except Refused:
            self.refused += 1
            self.outcome_counts["refused"] = self.outcome_counts.get("refused", 0) + 1
            return
        if not req.done:
            self._index[req.rid] = i
        else:  # rejected at admission (reject_early): _finished has run without an index
            self._record_failure(i, req, "rejected")

    def release(self, row: int, t: float) -> None:
        """Row `row` arrives at `t` instead of its trace time: a closed loop's next request
        (bench/replay_sim.py); rows must be released in order, each no earlier than the last."""
        self._cols.arrival[row] = t

    # --------------------------------------------------------------- results
    def _finished(self, req, outcome: str) -> None:  # type: ignore[no-untyped-def]
        self.outcome_counts[outcome] = self.outcome_counts.get(outcome, 0) + 1
        i = self._index.pop(req.rid, None)
        if i is None:
            return
        if outcome != "ok":
            self._record_failure(i, req, outcome)
            return
        if self.on_done is not None:
            self.on_done(i, self.now)
        w = self.workers.get(req.device) if req.device is not None else None
        o = w.outcomes.pop(req.rid, None) if w is not None else None
        r = self._res
        if o is None:  # cannot happen: an ok request ended on a worker
            raise RuntimeError(f"request {req.rid} ended ok but its worker has no outcome")
        ttft, tpot = req.ttft_slo_s, req.tpot_slo_s
        n = o.tokens
        total = r.total[i] = max(r.total[i], n)
        r.on_time[i] = o.on_time
        r.ok[i] = True
        r.ttft_met[i] = o.first_s <= ttft + slo.EPS_S
        complete = n >= self._cols.out[i]
        itl = (o.last_s - o.first_s) / (n - 1) if n > 1 else 0.0
        r.tpot_met[i] = complete and itl <= tpot + slo.EPS_S
        r.e2e_met[i] = complete and o.on_time == total
        r.status[i] = "ok"
        if o.token_times is not None:
            r.token_times[i] = o.token_times

    def _record_failure(self, i: int, req, outcome: str) -> None:  # type: ignore[no-untyped-def]
        self._res.status[i] = "rejected" if outcome == "rejected" else "error"

    # ----------------------------------------------------------------- views
    @property
    def device_hours(self) -> float:
        return self._device_s / 3600.0

    def outcome(self) -> RunOutcome:
        return self._res.arrays()

    def result_rows(self) -> list[RequestResult]:
        """Per request, in the replayer's format (trace/results.py); token times only when
        the run kept them (keep_times)."""
        tr, r = self.trace, self._res
        rows = []
        for i in range(len(tr.arrival_s)):
            ok = r.status[i] == "ok"
            st: Status = "ok" if ok else "error"
            rows.append(RequestResult(
                index=i, arrival_s=float(tr.arrival_s[i]), app=tr.apps[int(tr.app_id[i])],
                model=tr.models[int(tr.model_id[i])], input_tokens=int(tr.input_tokens[i]),
                output_tokens=int(tr.output_tokens[i]),
                ttft_slo_ms=self._slo_ms(i, True), tpot_slo_ms=self._slo_ms(i, False), send_lag_ms=0.0,
                token_times_s=r.token_times.get(i, []) if ok else [], status=st,
                error=None if ok else r.status[i]))
        return rows

    def _slo_ms(self, i: int, ttft: bool) -> float:
        v = float((self.trace.ttft_slo_ms if ttft else self.trace.tpot_slo_ms)[i])
        if not math.isnan(v):
            return v
        served = self.served[self.req_model[int(self.request_model[i])]]
        return served.ttft_slo_ms if ttft else served.tpot_slo_ms


_NEVER = Failure(500, "a simulated drain has no bound")  # never given: the bound is inf


def _drop(_event: object) -> None:
    """The request's sink: the simulator reads outcomes from the core and its workers."""
