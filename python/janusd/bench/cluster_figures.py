"""The figures of `janus bench cluster` (bench/cluster.py), from a run's results.jsonl and
the Active instances it sampled: one owner for how a real run and a simulated one are
scored, so the two columns of the table mean the same thing. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from janusd.trace import slo
from janusd.trace.formats import Trace
from janusd.trace.results import RequestResult, results_from


@dataclass
class ModelTimeline:
    """(t, {model: Active devices}) samples on the trace's time axis."""

    samples: list[tuple[float, dict[str, set[int]]]] = field(default_factory=list)

    def add(self, t: float, active: dict[str, set[int]]) -> None:
        self.samples.append((t, active))

    def device_seconds(self) -> float:
        """Seconds x devices with at least one Active instance, from t = 0 (a sample
        holds until the next one)."""
        pts = [(t, len(set().union(*a.values())) if a else 0) for t, a in self.samples if t >= 0.0]
        return sum((t1 - t0) * n for (t0, n), (t1, _) in zip(pts, pts[1:]))

    def count(self, model: str) -> list[tuple[float, int]]:
        return [(t, len(a.get(model, ()))) for t, a in self.samples]


def scale_out_delays(tl: ModelTimeline, bursts: dict[str, list[float]]) -> dict[str, list[float | None]]:
    """Per bursty model and burst: seconds from the burst's start to the first sample
    (after it) with two or more Active instances; 0 when it already had them; None when it
    never got them within the burst's 15 s."""
    out: dict[str, list[float | None]] = {}
    for model, starts in bursts.items():
        series = tl.count(model)
        got: list[float | None] = []
        for b in starts:
            before = [n for t, n in series if t <= b]
            if before and before[-1] >= 2:
                got.append(0.0)
                continue
            hit = next((t for t, n in series if b < t <= b + 15.0 and n >= 2), None)
            got.append(None if hit is None else round(hit - b, 3))
        out[model] = got
    return out


def undone_scale_outs(tl: ModelTimeline, models: list[str], hold_s: float) -> int:
    """Times a model's count fell and rose again within `hold_s` (a scale-in undone by the
    next scale-out: the flapping [W] forbids), over the given models."""
    n = 0
    for model in models:
        series = tl.count(model)
        drops = [t for (t0, a), (t, b) in zip(series, series[1:]) if b < a]
        rises = [t for (t0, a), (t, b) in zip(series, series[1:]) if b > a]
        n += sum(1 for d in drops if any(d < r <= d + hold_s for r in rises))
    return n


def figures(results: Path, trace: Trace, device_seconds: float) -> dict[str, Any]:
    """Token attainment (overall, worst app, per app), refusals (HTTP 503), other errors
    and p99 TTFT of a run's results, with its Active device-seconds."""
    dec = msgspec.json.Decoder(RequestResult)
    rows = [dec.decode(line) for line in Path(results).read_bytes().splitlines() if line.strip()]
    res = results_from(rows)
    o = res.outcomes()
    s = slo.summarize(o, res.app_id, len(res.apps), float(trace.arrival_s.max()) if len(trace.arrival_s) else 0.0)
    per = slo.per_app(o, res.app_id, len(res.apps))["token_attainment"]
    ttft = [r.token_times_s[0] * 1000.0 for r in rows if r.token_times_s]
    refused = sum(1 for r in rows if r.status != "ok" and r.http_status == 503)
    return {"token_attainment": s["token_attainment"], "app_worst_token_attainment": s["app_worst_token_attainment"],
            "per_app": {a: float(per[i]) for i, a in enumerate(res.apps)}, "refused": refused,
            "errors": sum(1 for r in rows if r.status != "ok") - refused,
            "ttft_p99_ms": float(np.percentile(ttft, 99)) if ttft else float("nan"),
            "device_seconds": round(float(device_seconds), 1)}
