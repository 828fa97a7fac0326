"""Trace statistics: volume, skew and burstiness, to check a trace has the paper's shape.

- top12pct_request_share: share of requests carried by the top k = max(1, round(0.12 x
  apps)) apps ranked by request count (PAPER.md §1: ~0.8).
- top30pct_token_share: share of tokens (input + output) carried by the top
  k = max(1, round(0.30 x apps)) apps ranked by token count (~0.8).
- max_burst_ratio: the arrival axis is cut into 10 s windows starting at the first
  arrival; for app a with n_a requests over the trace span D (at least one window),
  its mean rate is m_a = n_a / D and the ratio of a window is (requests of a in the
  window / 10 s) / m_a. The figure is the maximum over all windows and all *eligible*
  apps, those averaging at least 10 requests per window (m_a >= 1 req/s): below that a
  ratio is dominated by Poisson noise (a 0.1 req/s app hits 10x with just 10 requests
  in one window). None when no app is eligible. It includes the diurnal swing, so a
  5-10x burst at the daily peak shows as ~7-15.
"""

from __future__ import annotations

import numpy as np

from janusd.trace.formats import Trace
from janusd.trace.synth import top_k, top_share

BURST_WINDOW_S = 10.0
BURST_MIN_PER_WINDOW = 10.0


def max_burst_ratio(
    trace: Trace, window_s: float = BURST_WINDOW_S, min_per_window: float = BURST_MIN_PER_WINDOW
) -> float | None:
    """See the module docstring; None when no app qualifies."""
    if len(trace) == 0:
        return None
    t0 = float(trace.arrival_s[0])
    span = max(trace.duration_s, window_s)
    nwin = int((float(trace.arrival_s[-1]) - t0) // window_s) + 1
    n_apps = len(trace.apps)
    per_app = np.bincount(trace.app_id, minlength=n_apps)
    mean_rate = per_app / span
    eligible = mean_rate * window_s >= min_per_window
    if not eligible.any():
        return None
    win = ((trace.arrival_s - t0) // window_s).astype(np.int64)
    grid = np.bincount(trace.app_id.astype(np.int64) * nwin + win, minlength=n_apps * nwin).reshape(n_apps, nwin)
    peak = grid[eligible].max(axis=1) / window_s
    return float((peak / mean_rate[eligible]).max())


def trace_stats(trace: Trace) -> dict[str, float | int | None]:
    """The headline statistics printed by `janus trace stats --json` (keys in this order)."""
    n_apps = len(trace.apps)
    reqs = np.bincount(trace.app_id, minlength=n_apps)
    toks = np.bincount(trace.app_id, weights=trace.input_tokens + trace.output_tokens, minlength=n_apps)
    present = int((reqs > 0).sum())
    return {
        "requests": len(trace),
        "apps": present,
        "duration_s": round(trace.duration_s, 6),
        "top12pct_request_share": round(top_share(reqs, top_k(present, 0.12)), 4) if len(trace) else None,
        "top30pct_token_share": round(top_share(toks, top_k(present, 0.30)), 4) if len(trace) else None,
        "max_burst_ratio": None if (r := max_burst_ratio(trace)) is None else round(r, 3),
    }


def app_table(trace: Trace) -> list[dict[str, float | int | str]]:
    """Per-app rows (sorted by requests, descending) for the human-readable stats output."""
    n_apps = len(trace.apps)
    reqs = np.bincount(trace.app_id, minlength=n_apps)
    inp = np.bincount(trace.app_id, weights=trace.input_tokens, minlength=n_apps)
    out = np.bincount(trace.app_id, weights=trace.output_tokens, minlength=n_apps)
    rows = []
    for a in np.argsort(-reqs, kind="stable"):
        if reqs[a] == 0:
            continue
        rows.append({
            "app": trace.apps[a], "requests": int(reqs[a]), "share": float(reqs[a] / len(trace)),
            "mean_input": float(inp[a] / reqs[a]), "mean_output": float(out[a] / reqs[a]),
        })  # fmt: skip
    return rows
