"""Load features, attainment and resource usage from what a run observed: pure.

One rule for load features: telemetry/telemetry.py's windows. A live daemon reads them
from its Telemetry; a replay's results (or the simulator's events) are fed through a
Telemetry of their own here, as the daemon would have seen them, so the three never
compute a rate or a length variance two ways.

Usage is counted from the model config (hw/model_spec.py) over measured time and set
against the device's peaks (hw/devices.py), per instance (an instance is one device):
- compute: FLOPs of every prefill (prompt tokens, causal attention) and every decode
  token (at its context) done during the run, per second, over peak FLOP/s;
- bandwidth: every decode step reads the weights once and every decoding sequence's KV;
  steps per second = the time some request was decoding (union of first-to-last-token
  intervals, over the instances) / the mean inter-token gap (the measured step time);
  plus the KV bytes each decode token reads and every prefill's weight read; over peak
  bytes/s;
- HBM: weight pages plus peak KV pages, as a fraction of the device's memory (from the
  worker pools, passed in: the client cannot see them).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def window_from_results(rows: Sequence[RequestResult], span_s: float, model: str | None = None) -> ModelWindow:
    """The window a daemon's Telemetry would show at the end of the arrivals (t0 + span_s)
    for the requests of one model of a replay: arrivals at their trace times, ends at the
    last token (ok requests; failed ones end at their last token or arrival), a window as
    long as the span so every arrival counts. Requests still decoding at that instant keep
    their max_tokens prior, as live telemetry does."""
    if not span_s > 0:
        raise ValueError(f"span_s must be > 0, got {span_s}")
    mine = [r for r in rows if model is None or r.model == model]
    if not mine:
        raise ValueError(f"no results{'' if model is None else f' for model {model!r}'}")
    name = model or mine[0].model
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
    return tel.model(name, end)


def features_from_results(rows: Sequence[RequestResult], span_s: float, model: str | None = None) -> LoadFeatures:
    return LoadFeatures.from_window(window_from_results(rows, span_s, model))


def token_attainment(rows: Sequence[RequestResult]) -> float:
    """Per-token SLO attainment of a run's requests (trace/slo.py rules: failures miss)."""
    o = results_from(list(rows)).outcomes()
    total = int(o.total.sum())
    return float(o.on_time.sum()) / total if total else 1.0


def _union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts)
    s, e = starts[order], ends[order]
    total, cur_s, cur_e = 0.0, s[0], e[0]
    for a, b in zip(s[1:], e[1:], strict=True):
        if a > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return float(total + cur_e - cur_s)


def usage_from_results(rows: Sequence[RequestResult], wall_s: float, instances: int, spec: ModelSpec,
                       device: DeviceSpec) -> tuple[float, float]:
    """(compute, bandwidth) per instance as fractions of the device's peaks (module doc)."""
    if not (wall_s > 0 and instances >= 1):
        raise ValueError("wall_s must be > 0 and instances >= 1")
    flops = 0.0
    bytes_ = 0.0
    starts, ends, gaps, gap_n = [], [], 0.0, 0
    for r in rows:
        n = len(r.token_times_s)
        if n == 0:
            continue
        p = float(r.input_tokens)
        flops += spec.prefill_flops(p)
        bytes_ += spec.prefill_bytes(p)
        d = n - 1  # tokens after the first come from decode steps, at contexts p+1 .. p+d
        if d > 0:
            ctx_sum = d * p + d * (d + 1) / 2.0
            flops += spec.decode_step_flops(d, ctx_sum)
            bytes_ += spec.kv_bytes_per_token * (ctx_sum + d)
            sent = r.arrival_s + r.send_lag_ms / 1000.0
            starts.append(sent + r.token_times_s[0])
            ends.append(sent + r.token_times_s[-1])
            gaps += r.token_times_s[-1] - r.token_times_s[0]
            gap_n += d
    if gap_n:
        step_s = gaps / gap_n
        busy = _union_length(np.array(starts), np.array(ends))
        steps = busy / step_s  # decode steps of one instance over the busy time ...
        steps *= min(instances, max(1.0, sum(e - s for s, e in zip(starts, ends, strict=True)) / max(busy, 1e-9)))
        bytes_ += steps * spec.weight_bytes  # ... one weight read each, on every instance busy
    per = wall_s * instances
    return flops / per / device.peak_flops, bytes_ / per / device.hbm_bw


def hbm_fraction(weight_pages: int, peak_kv_pages: int, page_bytes: int, device: DeviceSpec) -> float:
    return (weight_pages + peak_kv_pages) * page_bytes / device.hbm_bytes
