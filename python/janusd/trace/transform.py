"""Trace transforms used to build a replay from a long trace (PAPER.md §9).

The paper samples ~603 k of a day's 45.6 M requests and compresses 24 h into 30 min,
keeping app identity, order, input/output lengths and relative timing. `sample` keeps
a uniformly random subset (exact size, order kept); `compress` divides every gap by a
constant factor; `remap_models` points apps at the models a small deployment serves
and `clip_lengths` fits lengths to its context.
"""

from __future__ import annotations

import numpy as np

from janusd.trace.formats import Trace


def sample(trace: Trace, fraction: float, seed: int = 0) -> Trace:
    """Keep round(fraction x n) requests chosen uniformly without replacement, in order."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = int(round(fraction * len(trace)))
    rng = np.random.default_rng(seed)
    keep = np.sort(rng.choice(len(trace), size=k, replace=False))
    return trace.take(keep)


def compress(trace: Trace, factor: float | None = None, to_duration_s: float | None = None) -> Trace:
    """Divide the time axis by `factor` (or by span / to_duration_s), anchored at the first arrival.

    New arrival = (arrival - first) / factor, so the first request lands at 0, order is
    unchanged and every gap shrinks by exactly the same factor. Give one of the two.
    """
    if (factor is None) == (to_duration_s is None):
        raise ValueError("give exactly one of factor and to_duration_s")
    if to_duration_s is not None:
        if not to_duration_s > 0:
            raise ValueError(f"to_duration_s must be > 0, got {to_duration_s}")
        if trace.duration_s <= 0:
            raise ValueError("the trace spans no time (fewer than two distinct arrivals); use --factor")
        factor = trace.duration_s / to_duration_s
        if factor < np.finfo(float).tiny:  # a span of denormals: the factor underflows or loses its digits
            raise ValueError(f"the trace spans {trace.duration_s:g} s, too little to stretch to {to_duration_s:g} s; "
                             "use --factor")
    if factor is None or not (np.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a finite number > 0, got {factor}")
    if len(trace) == 0:
        return trace
    return trace.with_arrivals((trace.arrival_s - trace.arrival_s[0]) / factor)


def remap_models(trace: Trace, models: list[str]) -> Trace:
    """Assign apps to the given models round-robin by popularity (most requests first).

    Used to replay a 62-app trace against a daemon that serves a few models: each app
    keeps its identity, only the model column changes.
    """
    if not models or any(not m for m in models):
        raise ValueError("give at least one non-empty model name")
    counts = np.bincount(trace.app_id, minlength=len(trace.apps))
    order = np.argsort(-counts, kind="stable")
    uniq = list(dict.fromkeys(models))
    app_model = np.empty(len(trace.apps), dtype=np.int32)
    for rank, a in enumerate(order):
        app_model[a] = uniq.index(models[rank % len(models)])
    return Trace(
        trace.arrival_s, trace.app_id, app_model[trace.app_id], trace.input_tokens, trace.output_tokens,
        trace.ttft_slo_ms, trace.tpot_slo_ms, trace.apps, tuple(uniq),
    )  # fmt: skip


def clip_lengths(trace: Trace, max_input: int | None = None, max_output: int | None = None) -> Trace:
    """Cap input/output lengths (e.g. to a small model's context); everything else unchanged."""
    for name, v in (("max_input", max_input), ("max_output", max_output)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    inp = trace.input_tokens if max_input is None else np.minimum(trace.input_tokens, max_input)
    out = trace.output_tokens if max_output is None else np.minimum(trace.output_tokens, max_output)
    return Trace(
        trace.arrival_s, trace.app_id, trace.model_id, inp, out, trace.ttft_slo_ms, trace.tpot_slo_ms, trace.apps, trace.models
    )


def parse_duration(text: str) -> float:
    """'30m' -> 1800.0; accepts s, m, h suffixes or plain seconds."""
    t = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:], None)
    try:
        value = float(t[:-1]) * scale if scale is not None else float(t)
    except ValueError:
        raise ValueError(f"bad duration {text!r}: use e.g. 1800, 90s, 30m or 2h") from None
    if not value > 0:
        raise ValueError(f"duration must be > 0, got {text!r}")
    return value
