"""Prometheus metrics of the daemon (GET /metrics), on a registry of its own.

Two kinds: event metrics updated when a request ends (TTFT/TPOT histograms, per-token
SLO attainment counters, outcomes), and state metrics read at scrape time from the live
daemon (queue lengths, dispatcher counters, instance states, worker pool pages) by a
custom collector, so a scrape never sees a stale copy of state we already hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from janusd.core import Refusal, Request
from janusd.lifecycle.states import STATE_WORDS
from janusd.telemetry.latency import LatencyWindow

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# the `*_created` sample families carry no information an operator uses and double the
# size of every scrape (process-wide setting of prometheus_client)
disable_created_metrics()
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32)
_E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 300)
_PHASE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_STATES = STATE_WORDS  # lifecycle/states.py
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2)


_WINDOW_FIELDS = (
    ("request_rate", "arrivals per second"),
    ("input_token_rate", "prompt tokens of arrivals per second"),
    ("output_token_rate", "output tokens delivered per second"),
    ("input_len_mean", "mean prompt length"),
    ("input_len_var", "prompt length variance"),
    ("output_len_mean", "mean output length (in-flight requests count at max_tokens)"),
    ("output_len_var", "output length variance"),
    ("ttft_mean_s", "mean time to first token"),
)


class _Live(Collector):
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        """One snapshot per scrape, read by each family of figures in turn."""
        s = self.snapshot()
        for part in (_request_families, _instance_families, _worker_families, _pool_families, _engine_families):
            yield from part(s)


def _by_model(family: Any, values: dict[str, float]) -> Any:
    """A family with one sample per model."""
    for model, n in values.items():
        family.add_metric([model], n)
    return family


def _request_families(s: dict[str, Any]) -> Iterator[Any]:
    """Queues, held and in-flight requests, the telemetry window, the dispatcher's counters."""
    yield _by_model(GaugeMetricFamily("janusd_queue_length", "requests waiting in the model's global queue",
                                      labels=["model"]), s["queues"])
    yield _by_model(GaugeMetricFamily("janusd_requests_held", "requests waiting for an Active instance of their "
                                      "model (loading, restarting or unloaded)", labels=["model"]), s.get("held", {}))
    yield _by_model(GaugeMetricFamily("janusd_requests_in_flight", "admitted requests not yet finished",
                                      labels=["model"]), s["in_flight"])
    yield _by_model(CounterMetricFamily("janusd_relaxed", "deadline extensions granted to the model's queued "
                                        "requests (dispatch.requeue = relax)", labels=["model"]), s.get("relaxed", {}))
    tel = s.get("telemetry")
    if tel is not None:  # telemetry/: the sliding window the oracle and controller read
        for field, help_text in _WINDOW_FIELDS:
            g = GaugeMetricFamily(f"janusd_window_{field}", f"{help_text} (sliding window)", labels=["model"])
            for model, w in tel.models.items():
                g.add_metric([model], getattr(w, field))
            yield g
    d = s["dispatch"]
    for key in ("submitted", "assigned", "completed", "rejected", "relaxed", "cancelled"):
        c = CounterMetricFamily(f"janusd_dispatch_{key}", f"dispatcher: requests {key}")
        c.add_metric([], d.get(key, 0))
        yield c


def _instance_families(s: dict[str, Any]) -> Iterator[Any]:
    """Each instance's state and role, the count per state, D2D fork fallbacks."""
    st = GaugeMetricFamily("janusd_instance_state", "1 for the one state each (model, device) instance is in "
                           "(lifecycle/states.py: loading | active | draining | unloaded | warm | cold | "
                           "restoring | forking)", labels=["model", "device", "state"])
    counts: dict[tuple[str, str], int] = {}
    for model, device, state in s["instances"]:
        st.add_metric([model, str(device), state], 1)
        counts[(model, state)] = counts.get((model, state), 0) + 1
    yield st
    role = GaugeMetricFamily("janusd_instance_role", "1 for the engine role of each instance of a P/D model "
                             "(prefill | decode | mixed; the controller may change it at activation)",
                             labels=["model", "device", "role"])
    for model, device, r in s.get("roles", ()):
        role.add_metric([model, str(device), r], 1)
    yield role
    per = GaugeMetricFamily("janusd_instances", "instances of the model in each state", labels=["model", "state"])
    for model in {m for m, _, _ in s["instances"]}:
        for state in _STATES:
            per.add_metric([model, state], counts.get((model, state), 0))
    yield per
    fb = CounterMetricFamily("janusd_fork_fallbacks", "D2D forks that failed (source gone, transfer stalled, "
                             "verification) and came up by H2D or a Cold load instead")
    fb.add_metric([], s.get("fork_fallbacks", 0))
    yield fb


def _worker_families(s: dict[str, Any]) -> Iterator[Any]:
    """Each device's worker: up, restarts, hangs, given up."""
    up = GaugeMetricFamily("janusd_worker_up", "1 when the device's worker is ready", labels=["device"])
    rs = CounterMetricFamily("janusd_worker_restarts", "worker restarts", labels=["device"])
    for dev, (ready, restarts) in s["workers"].items():
        up.add_metric([str(dev)], 1 if ready else 0)
        rs.add_metric([str(dev)], restarts)
    yield up
    yield rs
    hangs = CounterMetricFamily("janusd_worker_hangs", "worker processes declared hung (no heartbeat answer, "
                                "or a step past worker_step_timeout_s) and killed", labels=["device"])
    failed = GaugeMetricFamily("janusd_device_failed", "1 when the device was given up after its restart "
                               "budget was spent", labels=["device"])
    for dev, n in s.get("worker_hangs", {}).items():
        hangs.add_metric([str(dev)], n)
    for dev, f in s.get("worker_failed", {}).items():
        failed.add_metric([str(dev)], 1 if f else 0)
    yield hangs
    yield failed


def _pool_families(s: dict[str, Any]) -> Iterator[Any]:
    """Each device's xTensor pool (pages apart from other figures) and KV usage per model."""
    pages = GaugeMetricFamily("janusd_pool_pages", "xTensor page pool of each device in pages (last poll)",
                              labels=["device", "kind"])
    other = GaugeMetricFamily("janusd_pool_stat", "other xTensor pool figures (bytes, counts, percent)",
                              labels=["device", "stat"])
    for dev, stats in s["pools"].items():
        for kind, v in stats.items():
            if _is_page_count(kind):
                pages.add_metric([str(dev), kind], v)
            else:
                other.add_metric([str(dev), kind], v)
    yield pages
    yield other
    kv = GaugeMetricFamily("janusd_kv_cache_usage_ratio", "fraction of the model's KV region in use on the "
                           "device (last poll; vLLM: gpu_cache_usage_perc)", labels=["model", "device"])
    for dev, usage in s.get("kv_usage", {}).items():
        for model, v in usage.items():
            kv.add_metric([model, str(dev)], v)
    yield kv


def _engine_families(s: dict[str, Any]) -> Iterator[Any]:
    """Each engine's own counters since its model was loaded."""
    steps = CounterMetricFamily("janusd_engine_steps", "engine steps (each reads the model's weights once) since "
                                "the model was loaded on the device (last poll)", labels=["model", "device"])
    dec = CounterMetricFamily("janusd_engine_decode_tokens", "tokens the engine decoded (one per running "
                              "sequence per step) since the model was loaded (last poll)", labels=["model", "device"])
    fwd = CounterMetricFamily("janusd_engine_forward_seconds", "seconds in the model's forward pass since it "
                              "was loaded (last poll)", labels=["model", "device"])
    for dev, per_model in s.get("engine", {}).items():
        for model, (n_steps, n_dec, fwd_s) in per_model.items():
            steps.add_metric([model, str(dev)], n_steps)
            dec.add_metric([model, str(dev)], n_dec)
            fwd.add_metric([model, str(dev)], fwd_s)
    yield steps
    yield dec
    yield fwd

def _is_page_count(kind: str) -> bool:
    """Pool stats measured in pages (free_pages, largest_free_run, ...), not page_size in
    bytes or fragmentation_pct, which must not share a metric whose unit is pages."""
    return kind.endswith("_pages") or kind == "largest_free_run"


class Metrics:
    def __init__(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("janusd_requests", "finished requests by outcome", ["model", "outcome"], registry=r)
        # vLLM's names, janusd_ in front: prompt_tokens, generation_tokens, e2e_request_latency_seconds,
        # request_queue_time_seconds
        self.prompt_tokens = Counter("janusd_prompt_tokens", "prompt tokens of requests that were prefilled",
                                     ["model"], registry=r)
        self.generation_tokens = Counter("janusd_generation_tokens", "output tokens delivered", ["model"],
                                         registry=r)
        self.e2e = Histogram("janusd_e2e_request_latency_seconds", "admission to the request's end (any outcome "
                             "but cancelled)", ["model"], buckets=_E2E_BUCKETS, registry=r)
        self.queue_time = Histogram("janusd_request_queue_time_seconds", "admission to being sent to a worker",
                                    ["model"], buckets=_TTFT_BUCKETS, registry=r)
        self.ttft = Histogram("janusd_ttft_seconds", "time to first token", ["model"], buckets=_TTFT_BUCKETS,
                              registry=r)
        self.tpot = Histogram("janusd_tpot_seconds", "mean time per output token after the first", ["model"],
                              buckets=_TPOT_BUCKETS, registry=r)
        self.tokens = Counter("janusd_slo_tokens", "tokens counted for per-token SLO attainment", ["model"],
                              registry=r)
        self.on_time = Counter("janusd_slo_tokens_on_time", "tokens delivered within their per-token SLO",
                               ["model"], registry=r)
        self.attainment = Gauge("janusd_slo_attainment", "per-token SLO attainment since start (on time / all)",
                                ["model"], registry=r)
        self.rejected = Counter("janusd_rejected", "requests refused before running", ["model", "reason"],
                                registry=r)
        # one per TTFT-SLO refusal (stage: admission | queue), with the figures it used, so a
        # wrong estimate shows: justified = "no" when the earliest-free instance could have
        # finished the prefill by the deadline by that very estimate (a false refusal), "guard"
        # when a held instance could have and the decode guard's trade declined (Refusal.justified)
        self.refusals = Counter("janusd_slo_refusals", "TTFT-SLO refusals by stage and whether the estimate "
                                "justified them", ["model", "stage", "justified"], registry=r)
        self.refusal_est = Histogram("janusd_slo_refusal_estimate_seconds", "the prefill estimate a refusal used",
                                     ["model", "stage"], buckets=_TPOT_BUCKETS, registry=r)
        self.refusal_deadline = Histogram("janusd_slo_refusal_deadline_seconds", "deadline - now at a refusal",
                                          ["model", "stage"], buckets=_TTFT_BUCKETS, registry=r)
        self.refusal_epdt = Histogram("janusd_slo_refusal_earliest_epdt_seconds", "the least instance EPDT - now "
                                      "at a refusal", ["model", "stage"], buckets=_TTFT_BUCKETS, registry=r)
        self.refusal_queued = Histogram("janusd_slo_refusal_queued", "the model's requests queued at a refusal",
                                        ["model", "stage"], buckets=(0, 1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.kv_transfers = Counter("janusd_kv_transfers", "P/D KV handoffs by outcome", ["model", "outcome"],
                                    registry=r)
        self.kv_bytes = Counter("janusd_kv_transfer_bytes", "P/D KV bytes moved to decode instances", ["model"],
                                registry=r)
        self.kv_seconds = Histogram("janusd_kv_transfer_seconds", "P/D KV transfer time on the decode worker",
                                    ["model"], buckets=_TPOT_BUCKETS, registry=r)
        self.estimate_error = Histogram(
            "janusd_prefill_estimate_error_seconds", "|observed - estimated| prefill time per request (the p_j "
            "the dispatcher charged)", ["model"], buckets=_TPOT_BUCKETS, registry=r)
        self.estimate_bias = Counter("janusd_prefill_estimate_undershoot_seconds", "sum of observed - estimated "
                                     "prefill time where the estimate was too low", ["model"], registry=r)
        self.estimate_overshoot = Counter("janusd_prefill_estimate_overshoot_seconds", "sum of estimated - "
                                          "observed prefill time where the estimate was too high", ["model"],
                                          registry=r)
        self._lifecycle_and_control(r)
        self.tick_errors = Counter("janusd_tick_errors", "core ticks that raised (logged rate-limited; the tick "
                                   "loop backs off, 10 ms doubling to 1 s, and goes on)", registry=r)
        self.worker_errors = Counter("janusd_worker_errors", "errors caught on a worker's request path and served "
                                     "past, by where: handler (the daemon handling one of the worker's outputs), "
                                     "abort (the worker could not abort a request: its KV pages may stay held), "
                                     "tokenize (the tokenizer failed on something other than bad input)",
                                     ["device", "where"], registry=r)
        r.register(_Live(snapshot))
        self._tot: dict[str, tuple[int, int]] = {}
        # the last minute's samples per model: percentiles and attainment for ctl and top
        self.recent = LatencyWindow(60.0)

    def _lifecycle_and_control(self, r: CollectorRegistry) -> None:
        """The lifecycle's and the controller's families (phases, ops, decisions, plans)."""
        self.phase = Histogram("janusd_lifecycle_phase_seconds", "seconds of each phase of an instance's state change "
                               "(op: activate | fork | deactivate | stage; phase: drain | prepare | transfer | restore "
                               "| first_token)", ["model", "op", "phase"], buckets=_PHASE_BUCKETS, registry=r)
        self.lifecycle_ops = Counter("janusd_lifecycle_ops", "instance state changes by outcome (ok | fallback | "
                                     "failed)", ["model", "op", "outcome"], registry=r)
        self.controller_ops = Counter("janusd_controller_ops", "lifecycle operations the controller started, by "
                                      "target state (active | warm | cold) and outcome (ok | failed)",
                                      ["target", "outcome"], registry=r)
        self.elastic = Gauge("janusd_controller_elastic_instances", "an elastic model's instances at the last fast "
                             "tick (kind: demand = the oracle's m*, count = given within the budget; a P/D "
                             "model's count split into prefill and decode: prefill 0 = all mixed)",
                             ["model", "kind"], registry=r)
        self.controller_decisions = Counter("janusd_controller_decisions", "operations the controller carried out "
                                            "(and wakes a request started), by kind (activate | rest | reassign) "
                                            "and the rule that decided (scale_out | scale_in | keepalive | wake | "
                                            "reassign | steady | other); `janus ctl events` lists them with reasons",
                                            ["kind", "rule"], registry=r)
        self.controller_moves = Counter("janusd_controller_moves", "steady placement moves the controller executed, "
                                        "by kind (place | migrate | remove) and outcome (ok | failed)",
                                        ["kind", "outcome"], registry=r)
        self.scale_outs_undone = Counter("janusd_controller_scale_outs_undone", "elastic replicas scaled in within "
                                         "control.scaling.scale_in_hold_s of their scale-out (flapping: only budget "
                                         "compression should cause one)", ["model"], registry=r)
        self.controller_plan = Gauge("janusd_controller_plan", "the controller's last plans (figure: steady_bins_used, "
                                     "steady_phi, steady_migrations, steady_pending_moves; elastic_budget, "
                                     "elastic_asked, elastic_given)", ["figure"], registry=r)

    def observe(self, req: Request, outcome: str) -> None:
        m = req.model
        self.requests.labels(m, outcome).inc()
        if req.prefill_seen:
            self.prompt_tokens.labels(m).inc(len(req.prompt_ids))
        if req.num_output_tokens:
            self.generation_tokens.labels(m).inc(req.num_output_tokens)
        if req.assigned_at is not None:
            self.queue_time.labels(m).observe(max(0.0, req.assigned_at - req.arrival))
        if outcome == "cancelled":
            return  # the client left; its tokens are not the server's miss or hit
        if req.ended_at is not None:
            self.e2e.labels(m).observe(max(0.0, req.ended_at - req.arrival))
        if req.ttft_s is not None:
            self.ttft.labels(m).observe(req.ttft_s)
        tpot = None
        if len(req.token_times) > 1:
            tpot = (req.token_times[-1] - req.token_times[0]) / (len(req.token_times) - 1)
            self.tpot.labels(m).observe(tpot)
        on, tot = req.slo_tokens  # computed once, by the core, when the request ended
        if req.ended_at is not None:
            self.recent.add(m, req.ended_at, req.ttft_s, tpot, on, tot)
        self.tokens.labels(m).inc(tot)
        self.on_time.labels(m).inc(on)
        a, b = self._tot.get(m, (0, 0))
        a, b = a + on, b + tot
        self._tot[m] = (a, b)
        if b:
            self.attainment.labels(m).set(a / b)

    def kv_transfer(self, model: str, outcome: str, nbytes: int = 0, seconds: float | None = None) -> None:
        self.kv_transfers.labels(model, outcome).inc()
        if nbytes:
            self.kv_bytes.labels(model).inc(nbytes)
        if seconds is not None:
            self.kv_seconds.labels(model).observe(seconds)

    def prefill_estimate_error(self, model: str, error_s: float) -> None:
        self.estimate_error.labels(model).observe(abs(error_s))
        # a Counter cannot go down; keep the signed sum as two counters' difference
        self.estimate_bias.labels(model).inc(max(error_s, 0.0))
        self.estimate_overshoot.labels(model).inc(max(-error_s, 0.0))

    def lifecycle(self, model: str, op: str, phases: dict[str, float], outcome: str) -> None:
        self.lifecycle_ops.labels(model, op, outcome).inc()
        for phase, seconds in phases.items():
            self.phase.labels(model, op, phase).observe(max(0.0, seconds))

    def controller_op(self, target: str, outcome: str) -> None:
        self.controller_ops.labels(target, outcome).inc()

    def controller_decision(self, kind: str, rule: str) -> None:
        self.controller_decisions.labels(kind, rule).inc()

    def controller_move(self, kind: str, outcome: str) -> None:
        self.controller_moves.labels(kind, outcome).inc()

    def controller_undone(self, model: str) -> None:
        self.scale_outs_undone.labels(model).inc()

    def controller_figure(self, figure: str, value: float) -> None:
        self.controller_plan.labels(figure).set(value)

    def controller_elastic(self, model: str, demand: int, count: int, split: tuple[int, int] | None = None) -> None:
        """`split`: a P/D model's (prefill, decode) instances of the count."""
        self.elastic.labels(model, "demand").set(demand)
        self.elastic.labels(model, "count").set(count)
        if split is not None:
            self.elastic.labels(model, "prefill").set(split[0])
            self.elastic.labels(model, "decode").set(split[1])

    def worker_error(self, device: int, where: str, n: int = 1) -> None:
        self.worker_errors.labels(str(device), where).inc(n)

    def refused(self, r: Refusal) -> None:
        self.refusals.labels(r.model, r.stage, r.justified).inc()
        self.refusal_est.labels(r.model, r.stage).observe(r.est_s)
        self.refusal_deadline.labels(r.model, r.stage).observe(max(0.0, r.deadline - r.now))
        if (e := r.earliest_s) is not None:
            self.refusal_epdt.labels(r.model, r.stage).observe(e)
        self.refusal_queued.labels(r.model, r.stage).observe(r.queued)

    def reject(self, model: str, reason: str) -> None:
        self.rejected.labels(model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
