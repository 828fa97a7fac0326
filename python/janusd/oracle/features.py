"""Load features, attainment and resource usage from what a run observed: pure.

One rule for load features: telemetry/telemetry.py's windows. A live daemon reads them
from its Telemetry; a replay's results (or the simulator's events) are fed through a
Telemetry of their own here, as the daemon would have seen them, so the three never
compute a rate or a length variance two ways.

Usage is counted from the model config (hw/model_spec.py) over a measured window and set
against the device's peaks (hw/devices.py), per instance (an instance is one device):
the work the engine did in the window [t0, t1), from the tokens that landed in it
(usage_in_window), so a profile point's warm-up and drain stay out of its figures:
- compute: FLOPs of every prefill whose first token landed in the window (prompt tokens,
  causal attention) and of every decode token that did (at its context), per second,
  over peak FLOP/s;
- bandwidth: every decode step reads the weights once and every decoding sequence's KV;
  the steps are counted from the decode tokens and how many requests were decoding when
  each landed (usage_in_window), plus the KV bytes each decode token reads and every
  prefill's weight read; over peak bytes/s;
- HBM: weight pages plus peak KV pages, as a fraction of the device's memory (from the
  worker pools, passed in: the client cannot see them).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np

from janusd.hw.devices import DeviceSpec
from janusd.hw.model_spec import ModelSpec
from janusd.oracle.types import LoadFeatures
from janusd.telemetry.telemetry import ModelWindow, Telemetry
from janusd.trace import slo
from janusd.trace.results import RequestResult, results_from


def features_from_window(w: ModelWindow) -> LoadFeatures:
    return LoadFeatures.from_window(w)


def window_attainment(w: ModelWindow) -> float | None:
    """Per-token attainment of the requests that ended in the window; None if none counted."""
    return w.tokens_on_time / w.tokens_counted if w.tokens_counted > 0 else None


def window_from_results(rows: Sequence[RequestResult], span_s: float, model: str | None = None,
                        t0: float | None = None) -> ModelWindow:
    """The window a daemon's Telemetry would show at t0 + span_s for the requests of one
    model of a replay: arrivals at their trace times, ends at the last token (ok requests;
    failed ones end at their last token or arrival), a window as long as the span so every
    arrival counts. Requests still decoding at that instant keep their max_tokens prior,
    as live telemetry does. t0: the start of the load (default: the first arrival; a
    profile passes its schedule's start, since its first arrival comes a random gap later)."""
    if not span_s > 0:
        raise ValueError(f"span_s must be > 0, got {span_s}")
    mine = [r for r in rows if model is None or r.model == model]
    if not mine:
        raise ValueError(f"no results{'' if model is None else f' for model {model!r}'}")
    name = model or mine[0].model
    if t0 is None:
        t0 = min(r.arrival_s for r in mine)
    end = t0 + span_s
    bucket = min(1.0, span_s)
    # one bucket longer than the span: the window holds (K - n, K], so the bucket of the
    # first arrival stays in; the rates still divide by now - first arrival = span_s
    tel = Telemetry(window_s=span_s + bucket, bucket_s=bucket)
    events: list[tuple[float, int, int, RequestResult]] = []
    for i, r in enumerate(mine):
        events.append((r.arrival_s, 0, i, r))
        sent = r.arrival_s + r.send_lag_ms / 1000.0
        events.append((sent + (r.token_times_s[-1] if r.token_times_s else 0.0), 1, i, r))
    for t, kind, i, r in sorted(events, key=lambda e: (e[0], e[1], e[2])):
        if t > end:
            break
        if kind == 0:
            tel.on_arrival(i, name, t, r.input_tokens, r.output_tokens)
        else:
            ok = r.status == "ok"
            tel.on_end(i, t, ok, len(r.token_times_s) if ok else 0)
    w = tel.model(name, end)
    if w.window_s > 0 and w.window_s != span_s:
        # telemetry divides by the time since the first arrival; over a schedule that
        # started at t0 the same counts divide by the whole span
        k = w.window_s / span_s
        w = msgspec.structs.replace(w, window_s=span_s, request_rate=w.request_rate * k,
                                    input_token_rate=w.input_token_rate * k, output_token_rate=w.output_token_rate * k)
    return w


def features_from_results(rows: Sequence[RequestResult], span_s: float, model: str | None = None,
                          t0: float | None = None) -> LoadFeatures:
    return LoadFeatures.from_window(window_from_results(rows, span_s, model, t0))


def token_attainment(rows: Sequence[RequestResult]) -> float:
    """Per-token SLO attainment of a run's requests (trace/slo.py rules: failures miss)."""
    o = results_from(list(rows)).outcomes()
    total = int(o.total.sum())
    return float(o.on_time.sum()) / total if total else 1.0


def in_window(rows: Sequence[RequestResult], t0: float, t1: float) -> list[RequestResult]:
    """The requests that arrived in [t0, t1): a profile point's measured requests (the
    ones before t0 are its warm-up, the ones after t1 its cool-down)."""
    return [r for r in rows if t0 <= r.arrival_s < t1]


def _decode_intervals(rows: Sequence[RequestResult]) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends), each sorted, on the trace's time axis, of every request's decode:
    its first to its last decode token (the token before them came from its prefill),
    widened by half the request's mean gap on each side, so that the tokens of one step,
    which reach the client a little apart, all see each other."""
    se = []
    for r in rows:
        n = len(r.token_times_s)
        if n > 1:
            sent = r.arrival_s + r.send_lag_ms / 1000.0
            half = (r.token_times_s[-1] - r.token_times_s[0]) / (n - 1) / 2.0
            se.append((sent + r.token_times_s[1] - half, sent + r.token_times_s[-1] + half))
    a = np.array(se, dtype=np.float64).reshape(-1, 2)
    return np.sort(a[:, 0]), np.sort(a[:, 1])


def usage_in_window(rows: Sequence[RequestResult], t0: float, t1: float, instances: int, spec: ModelSpec,
                    device: DeviceSpec) -> tuple[float, float]:
    """(compute, bandwidth) per instance as fractions of the device's peaks: the work the
    engine did in [t0, t1) (module doc), whichever request it was for.

    rows: every request of the run (the warm-up's and cool-down's share the engine). A
    prefill counts when its first token lands in the window, a decode token when it lands
    there, each at its own context. Decode steps (one weight read each) are counted from
    the tokens, not from a step time: a token delivered while n(t) requests decode on m
    instances stands for 1 / max(1, n(t) / m) of a step (n(t) / m sequences share each
    busy instance's step; fewer than m decoding requests each have an instance to
    themselves). For one instance that is exactly one per step whatever the batch, and it
    needs no step time: the client receives a step's tokens in bursts (the daemon forwards
    several steps at once when it is busy), so inter-token gaps are not step times."""
    if not (t1 > t0 and instances >= 1):
        raise ValueError("need t1 > t0 and instances >= 1")
    starts, ends = _decode_intervals(rows)
    flops = 0.0
    bytes_ = 0.0
    steps = 0.0
    for r in rows:
        n = len(r.token_times_s)
        if n == 0:
            continue
        t = r.arrival_s + r.send_lag_ms / 1000.0 + np.asarray(r.token_times_s, dtype=np.float64)
        p = float(r.input_tokens)
        if t0 <= t[0] < t1:
            flops += spec.prefill_flops(p)
            bytes_ += spec.prefill_bytes(p)
        if n < 2:
            continue
        ctx = p + np.arange(1, n, dtype=np.float64)  # decode token j reads p + j - 1 cached tokens and its own
        inside = (t[1:] >= t0) & (t[1:] < t1)
        k = int(inside.sum())
        if not k:
            continue
        ctx_sum = float(ctx[inside].sum())
        flops += spec.decode_step_flops(k, ctx_sum)
        bytes_ += spec.kv_bytes_per_token * (ctx_sum + k)
        tt = t[1:][inside]
        running = np.searchsorted(starts, tt, side="right") - np.searchsorted(ends, tt, side="left")
        steps += float(np.sum(1.0 / np.maximum(1.0, np.maximum(running, 1) / instances)))
    bytes_ += steps * spec.weight_bytes
    per = (t1 - t0) * instances
    return flops / per / device.peak_flops, bytes_ / per / device.hbm_bw


def hbm_fraction(weight_pages: int, peak_kv_pages: int, page_bytes: int, device: DeviceSpec) -> float:
    return (weight_pages + peak_kv_pages) * page_bytes / device.hbm_bytes
