"""A simulated device worker behind the core's Worker protocol (core/worker_edge.py).

It takes the same wire messages a real worker takes (Generate, Abort) and answers with
the same StepBatch / RequestFailed the core hears from a real one, at virtual times.
Inside it is an engine in outline: per resident model a FIFO of waiting requests and a
running batch (continuous batching); a request is admitted when its prompt plus its
output tokens fit in the device's KV pool, which all resident models share
(sim/perfmodel.py), and its model's batch has room, the queue heads of the models taken
oldest first across the device; it waits while they do not (pages held by other
requests, its own model's or a co-located one's), and fails when it could not fit even
alone on the device or has waited `kv_wait_timeout_s` (the engine's rule,
engine/scheduler.py). Every device step runs, for every resident model with work, the
prefills it admits (up to `max_batched_tokens` per model) and one decode token of every
running sequence; its length is the roofline of all of that together (co-located models
share the step).

Speed: steps are not simulated one by one. While nothing changes (no admission, no
sequence ends) the step time is constant, so a *segment* of k equal steps is one event;
a Generate arriving mid-segment cuts it at the next step boundary. The token times of a
sequence follow from the segments it lived through: token k comes at the end of device
step s_first + k - 1, and its on-time test (trace/slo.py: t_k <= TTFT + (k-1) TPOT) is
linear in k within a segment, so on-time tokens are counted in closed form per segment.
The core hears of the first token (with the prefill time, for the dispatcher) and of the
rest in one delta at the end; the exact per-token accounting is the worker's `Outcome`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from janusd._native import SegmentLog
from janusd.sim.perfmodel import PerfModel
from janusd.sim.specs import SimModel
from janusd.wire import worker_msgs as wm


@dataclass(slots=True)
class Seq:
    rid: int
    model: str
    arrival: float  # the request's clock start (its SLO deadline is measured from it)
    ttft_s: float
    tpot_s: float
    prompt: int
    n_out: int
    s_first: int = -1  # the device step that prefills it (its first token)
    queued_at: float = 0.0  # when the worker got it (the KV wait bound counts from here)


@dataclass(slots=True)
class Outcome:
    """Exact SLO figures of a request that finished on a simulated worker."""

    on_time: int
    first_s: float  # first token, seconds after arrival
    last_s: float  # last token, seconds after arrival
    tokens: int
    token_times: list[float] | None = None  # seconds after arrival, when asked for


@dataclass
class _Resident:
    model: SimModel
    kv_token_bytes: float = 0.0  # per device (perfmodel.kv_token_bytes)
    waiting: deque[Seq] = field(default_factory=deque)
    running: dict[int, Seq] = field(default_factory=dict)
    sum_prompt: int = 0  # over running
    sum_first: int = 0  # s_first over running


@dataclass(frozen=True)
class EngineLimits:
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    kv_wait_timeout_s: float = 30.0  # EngineConfig's: a request waiting this long for KV fails


class SimWorker:
    """One device (group): the Worker protocol's `send`, plus `on_event(now)` for the loop."""

    def __init__(self, device_index: int, perf: PerfModel, schedule: Callable[[int, float], None],
                 clock: Callable[[], float], request_meta: Callable[[int], tuple[float, float, float]],
                 limits: EngineLimits = EngineLimits(), keep_times: bool = False) -> None:
        self.device_index = device_index
        self.perf = perf
        self.limits = limits
        self._schedule = schedule  # (device, time): call on_event then
        self._clock = clock
        self._meta = request_meta  # rid -> (arrival, TTFT s, TPOT s): the core's Request says
        self.keep_times = keep_times
        self.residents: dict[str, _Resident] = {}
        self.kv_pool = 0  # bytes of KV the residents share (perfmodel.kv_pool_bytes)
        self.kv_used = 0  # bytes held by running sequences
        self._alone: dict[str, int] = {}  # model -> KV tokens it could hold alone on the device
        self.step = 0  # device steps completed
        self.outcomes: dict[int, Outcome] = {}
        self.failed: list[wm.RequestFailed] = []
        # the segment running now: steps [seg_s0, seg_end) of dt each from seg_t0
        self.seg_s0 = 0
        self.seg_t0 = 0.0
        self.seg_dt = 0.0
        self.seg_end = 0  # step index after the segment's last step
        self.busy = False
        self.event_at = math.inf
        self._prefilling: list[Seq] = []
        # history of segments: step index, start time, step time (for token times)
        self._segments = SegmentLog()
        self._finish: list[tuple[int, int]] = []  # heap of (last step, rid) of running sequences
        self._seqs: dict[int, Seq] = {}  # running ones by rid
        self.busy_s = 0.0

    # ------------------------------------------------------------ residents
    def set_residents(self, models: dict[str, SimModel]) -> None:
        """The served models (name -> architecture) whose weights are on the device now;
        KV capacity is shared out anew."""
        for n in list(self.residents):
            r = self.residents[n]
            if n not in models and not r.running and not r.waiting:
                del self.residents[n]
        for n, m in models.items():
            self.residents.setdefault(n, _Resident(m, self.perf.kv_token_bytes(m)))
        self.kv_pool = self.perf.kv_pool_bytes([r.model for r in self.residents.values()])
        if any(r.waiting for r in self.residents.values()):
            self._wake(self._clock())  # freed pages may admit a waiting request

    # -------------------------------------------------------- Worker protocol
    def send(self, msg: object) -> bool:
        now = self._clock()
        if isinstance(msg, wm.Generate):
            r = self.residents.get(msg.model)
            if r is None:
                self.failed.append(wm.RequestFailed(msg.req_id, f"model {msg.model!r} is not on this device",
                                                    kind="unavailable"))
                self._wake(now)
                return True
            meta = self._meta(msg.req_id)
            seq = Seq(msg.req_id, msg.model, meta[0], meta[1], meta[2], len(msg.prompt_token_ids),
                      msg.sampling.max_tokens)
            alone = self._alone.get(msg.model)
            if alone is None:
                alone = self._alone[msg.model] = self.perf.kv_capacity_tokens(r.model, [r.model])
            if seq.prompt + seq.n_out > alone:
                self.failed.append(wm.RequestFailed(
                    msg.req_id, f"needs {seq.prompt + seq.n_out} KV tokens; {msg.model} holds at most {alone} "
                    "on a device", kind="unavailable"))
                self._wake(now)
                return True
            seq.queued_at = now
            r.waiting.append(seq)
            self._wake(now)
            return True
        if isinstance(msg, wm.Abort):
            self._abort(msg.req_id)
            return True
        return True

    def _abort(self, rid: int) -> None:
        for r in self.residents.values():
            for s in r.waiting:
                if s.rid == rid:
                    r.waiting.remove(s)
                    return
        seq = self._seqs.get(rid)
        if seq is not None:
            self._retire(seq)
            self.outcomes.pop(rid, None)

    def _wake(self, now: float) -> None:
        """Something new to do: start a step now when idle, else cut a decode segment at
        the next step boundary."""
        if not self.busy:
            self._set_event(now)
        elif not self._prefilling and self.seg_dt > 0:
            k = math.ceil((now - self.seg_t0) / self.seg_dt - 1e-9)
            k = max(1, min(k, self.seg_end - self.seg_s0))
            self._set_event(self.seg_t0 + k * self.seg_dt)

    def _set_event(self, t: float) -> None:
        if t < self.event_at - 1e-12 or not self.busy:
            self.event_at = t
            self._schedule(self.device_index, t)

    # ----------------------------------------------------------------- loop
    def on_event(self, now: float) -> list[wm.TokenDelta]:
        """The scheduled time came: close the steps done, start the next segment."""
        if abs(now - self.event_at) > 1e-9:
            return []  # a stale wake-up (replaced by an earlier one)
        out: list[wm.TokenDelta] = []
        if self.busy:
            done = self.seg_end - self.seg_s0 if self._prefilling else \
                int(round((now - self.seg_t0) / self.seg_dt)) if self.seg_dt > 0 else 0
            self.step = self.seg_s0 + max(0, done)
            for seq in self._prefilling:
                out.append(wm.TokenDelta(seq.rid, [0], "", finished=seq.n_out <= 1, num_prompt_tokens=seq.prompt,
                                         num_output_tokens=1, prefill_s=self.seg_dt))
            self._prefilling = []
            while self._finish and self._finish[0][0] < self.step:
                _, rid = heapq.heappop(self._finish)
                ended = self._seqs.get(rid)
                if ended is None:
                    continue
                self._retire(ended)
                if ended.n_out > 1:
                    out.append(wm.TokenDelta(rid, [0] * (ended.n_out - 1), "", finished=True,
                                             num_prompt_tokens=ended.prompt, num_output_tokens=ended.n_out))
            self.busy = False
        self._start(now)
        return out

    def _retire(self, seq: Seq) -> None:
        r = self.residents[seq.model]
        del self._seqs[seq.rid]
        del r.running[seq.rid]
        self.kv_used -= int((seq.prompt + seq.n_out) * r.kv_token_bytes)
        r.sum_prompt -= seq.prompt
        r.sum_first -= seq.s_first
        self.outcomes[seq.rid] = self._outcome(seq)

    def _expire(self, now: float) -> float:
        """Fail requests that waited out the KV bound; returns the next such deadline."""
        nxt = math.inf
        bound = self.limits.kv_wait_timeout_s
        for r in self.residents.values():
            while r.waiting and r.waiting[0].queued_at + bound <= now + 1e-9:
                seq = r.waiting.popleft()
                self.failed.append(wm.RequestFailed(seq.rid, f"no KV pages for {seq.prompt + seq.n_out} tokens of "
                                                    f"{seq.model} within {bound:g} s", kind="unavailable"))
            if r.waiting:
                nxt = min(nxt, r.waiting[0].queued_at + bound)
        return nxt

    def _start(self, now: float) -> None:
        expiry = self._expire(now)
        flops = nbytes = comm = 0.0
        admitted: list[Seq] = []
        s = self.step
        lim = self.limits
        # admission: the heads of the residents' queues, oldest first across the device; a
        # model out of seats or batch tokens sits this step out, but when the oldest head
        # does not fit in the pool nobody is admitted (pages go to the longest waiter)
        taken: dict[str, list[float]] = {}  # resident -> [prompt tokens, pairs, seats left]
        heads = [(r.waiting[0].queued_at, k, name) for k, (name, r) in enumerate(self.residents.items()) if r.waiting]
        heapq.heapify(heads)
        while heads:
            _, k, name = heapq.heappop(heads)
            r = self.residents[name]
            t = taken.setdefault(name, [0, 0.0, lim.max_num_seqs - len(r.running)])
            seq = r.waiting[0]
            if t[2] <= 0 or (t[0] and t[0] + seq.prompt > lim.max_batched_tokens):
                continue
            need = int((seq.prompt + seq.n_out) * r.kv_token_bytes)
            if self.kv_used + need > self.kv_pool:
                break
            self.kv_used += need
            r.waiting.popleft()
            t[0] += seq.prompt
            t[1] += seq.prompt * (seq.prompt + 1) / 2.0
            t[2] -= 1
            admitted.append(seq)
            if r.waiting:
                heapq.heappush(heads, (r.waiting[0].queued_at, k, name))
        for name, r in self.residents.items():
            pf_tokens, pf_pairs, _ = taken.get(name, (0, 0.0, 0))
            n = len(r.running)
            ctx = r.sum_prompt + n * s - r.sum_first  # prompt + tokens produced so far, over running
            f, b = self.perf.work(r.model, pf_tokens, pf_pairs, n, ctx)
            flops += f
            nbytes += b
            if r.model.tp > 1:  # its group's all-reduces (perfmodel.comm_s); none at tp 1
                comm += self.perf.comm_s(r.model, pf_tokens + n)
        for seq in admitted:
            r = self.residents[seq.model]
            seq.s_first = s
            r.running[seq.rid] = seq
            r.sum_prompt += seq.prompt
            r.sum_first += s
            self._seqs[seq.rid] = seq
            heapq.heappush(self._finish, (s + seq.n_out - 1, seq.rid))
        if not self._seqs:
            self.event_at = math.inf
            if expiry < math.inf:  # idle with requests waiting for pages: wake up to fail them
                self._set_event(expiry)
            return
        dt = self.perf.step_s(flops, nbytes, len(self._seqs)) + comm
        steps = 1 if admitted else max(1, self._finish[0][0] - s + 1)
        self._prefilling = admitted
        self.busy = True
        self.seg_s0, self.seg_t0, self.seg_dt, self.seg_end = s, now, dt, s + steps
        self._segments.push(s, now, dt)
        self.busy_s += steps * dt
        self.event_at = math.inf
        self._set_event(now + steps * dt)
        if len(self._segments) > 8192:
            self._segments.trim(min((q.s_first for q in self._seqs.values()), default=self.step))

    # ----------------------------------------------------------- accounting
    def _outcome(self, seq: Seq) -> Outcome:
        """Tokens 1..n at the ends of steps s_first .. s_first + n - 1, counted on time per
        segment in closed form (module doc; rust/janus-core/src/sim/segments.rs)."""
        on_time, first_s, last_s, times = self._segments.tally(seq.s_first, seq.n_out, seq.arrival, seq.ttft_s,
                                                               seq.tpot_s, self.keep_times)
        return Outcome(on_time, first_s, last_s, seq.n_out, times)

    # ---------------------------------------------------------------- views
    @property
    def in_flight(self) -> int:
        return len(self._seqs) + sum(len(r.waiting) for r in self.residents.values())
