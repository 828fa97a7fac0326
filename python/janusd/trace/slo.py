"""SLO accounting: per-token, TTFT, TPOT and end-to-end attainment, goodput.

Pure functions (no clock, no I/O) shared by the replayer, the daemon and the simulator,
so that the three report the same numbers for the same token timestamps.

Definitions (PAPER.md §9). For a request with TTFT target F and TPOT target P (seconds),
token i (1-based) delivered t_i seconds after submission is *on time* iff
    t_i <= F + (i - 1) * P            (equality counts; 1 ns tolerance absorbs float rounding)
- The request's token count is max(expected, produced): tokens never produced (the
  stream ended early, failed or timed out) count as missed.
- Every token of a failed or timed-out request (ok=False) is missed, even ones delivered.
- TTFT met: ok, and the first token arrived by F (or no token was expected nor produced).
- TPOT met: ok, every expected token was produced, and the mean inter-token time after the
  first, (t_n - t_1) / (n - 1), is <= P (vacuously true for n <= 1). A mean, not a max:
  one stall is allowed if the rest catch up, which is what the per-token rule also allows.
- End-to-end met: ok and every one of the request's tokens on time. Goodput is the number
  of requests meeting it per second.
- Zero tokens expected and none produced: no tokens count; TTFT/TPOT/end-to-end are met
  iff ok.
Windowed series attribute a request (and all its tokens) to the window of its
submission (arrival) time, so a late token lowers the window whose load caused it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

EPS_S = 1e-9  # tolerance for "exactly on the deadline" after ms -> s conversions


class RequestAttainment(NamedTuple):
    """SLO outcome of one request."""

    on_time_tokens: int
    total_tokens: int  # max(expected, produced)
    ttft_met: bool
    tpot_met: bool
    e2e_met: bool


def request_attainment(
    token_times_s: Sequence[float], expected_tokens: int, ttft_slo_s: float, tpot_slo_s: float, ok: bool = True
) -> RequestAttainment:
    """Attainment of one request from its token delivery times (seconds after submission).

    The daemon calls this when a request finishes; `ok` is False for failed, rejected or
    timed-out requests. Times must be non-decreasing.
    """
    # One request, in plain Python: the daemon calls this at the end of every request, and
    # `evaluate`'s numpy set-up costs ~100 us at that size. Same rules as `evaluate`
    # (tests/test_slo.py checks the two agree on random requests).
    if expected_tokens < 0:
        raise ValueError("expected_tokens must be >= 0")
    n = len(token_times_s)
    on_time = 0
    if ok:
        i = 0
        while i < n:
            t = token_times_s[i]
            j = i + 1
            if j < n and token_times_s[j] == t:
                # tokens delivered together (one delta of many, as the simulator sends
                # them): the test below only turns true as i grows (a deadline that grows
                # with i, IEEE + and * being monotone), so bisect for the first on time
                j = bisect_right(token_times_s, t, j)
                lo, hi = i, j
                while lo < hi:
                    mid = (lo + hi) // 2
                    if t <= ttft_slo_s + mid * tpot_slo_s + EPS_S:
                        hi = mid
                    else:
                        lo = mid + 1
                on_time += j - lo
            elif t <= ttft_slo_s + i * tpot_slo_s + EPS_S:
                on_time += 1
            i = j
    total = max(expected_tokens, n)
    ttft_met = ok and ((n > 0 and token_times_s[0] <= ttft_slo_s + EPS_S) or (expected_tokens == 0 and n == 0))
    complete = n >= expected_tokens
    mean_itl = (token_times_s[-1] - token_times_s[0]) / (n - 1) if n > 1 else 0.0
    tpot_met = ok and complete and mean_itl <= tpot_slo_s + EPS_S
    e2e_met = ok and complete and on_time == total
    return RequestAttainment(on_time, total, bool(ttft_met), bool(tpot_met), bool(e2e_met))


class Outcomes(NamedTuple):
    """Per-request SLO outcomes (arrays of length n_requests)."""

    on_time: np.ndarray  # int64 tokens on time
    total: np.ndarray  # int64 max(expected, produced)
    ttft_met: np.ndarray  # bool
    tpot_met: np.ndarray  # bool
    e2e_met: np.ndarray  # bool
    ok: np.ndarray  # bool


def evaluate(
    token_times_s: np.ndarray,
    token_counts: np.ndarray,
    expected_tokens: np.ndarray,
    ok: np.ndarray,
    ttft_slo_s: np.ndarray,
    tpot_slo_s: np.ndarray,
) -> Outcomes:
    """Vectorised attainment of many requests.

    `token_times_s` is every request's token times concatenated in request order (times
    relative to each request's submission); `token_counts[r]` says how many belong to
    request r. All other arguments are per request. Raises ValueError on shape mismatch.
    """
    counts = np.asarray(token_counts, dtype=np.int64)
    times = np.asarray(token_times_s, dtype=np.float64)
    n = len(counts)
    expected = np.asarray(expected_tokens, dtype=np.int64)
    okv = np.asarray(ok, dtype=bool)
    ttft = np.asarray(ttft_slo_s, dtype=np.float64)
    tpot = np.asarray(tpot_slo_s, dtype=np.float64)
    for name, arr in (("expected_tokens", expected), ("ok", okv), ("ttft_slo_s", ttft), ("tpot_slo_s", tpot)):
        if arr.shape != (n,):
            raise ValueError(f"{name} has shape {arr.shape}, expected ({n},)")
    if np.any(counts < 0) or int(counts.sum()) != len(times):
        raise ValueError(f"token_counts sum to {int(counts.sum())} but there are {len(times)} token times")
    if np.any(expected < 0):
        raise ValueError("expected_tokens must be >= 0")

    starts = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(counts[:-1], out=starts[1:])
    owner = np.repeat(np.arange(n), counts)
    index0 = np.arange(len(times)) - starts[owner]  # 0-based token index in its request
    deadline = ttft[owner] + index0 * tpot[owner]
    on = (times <= deadline + EPS_S) & okv[owner]
    on_time = np.bincount(owner, weights=on, minlength=n).astype(np.int64)
    total = np.maximum(expected, counts)
    has = counts > 0
    if len(times):
        top = len(times) - 1
        first = np.where(has, times[np.minimum(starts, top)], np.inf)
        last = np.where(has, times[np.clip(starts + counts - 1, 0, top)], np.inf)
    else:
        first = last = np.full(n, np.inf)
    nothing = (expected == 0) & (counts == 0)
    ttft_met = okv & ((has & (first <= ttft + EPS_S)) | nothing)
    complete = counts >= expected
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_itl = np.where(counts > 1, (last - first) / np.maximum(counts - 1, 1), 0.0)
    tpot_met = okv & complete & (mean_itl <= tpot + EPS_S)
    e2e_met = okv & complete & (on_time == total)
    return Outcomes(on_time, total, ttft_met, tpot_met, e2e_met, okv)


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den > 0 else float("nan")


def summarize(outcomes: Outcomes, app_id: np.ndarray, n_apps: int, duration_s: float) -> dict[str, float | int]:
    """Headline figures over a whole run.

    Attainments are fractions in [0, 1] (NaN when nothing counts): token = on-time tokens /
    all tokens; ttft/tpot/e2e = share of requests. goodput_rps = e2e-met requests /
    duration_s. app_mean/app_worst: mean and minimum over apps of each app's per-token
    attainment (apps with no tokens are left out).
    """
    per = per_app(outcomes, app_id, n_apps)
    app_tok = per["token_attainment"]
    valid = ~np.isnan(app_tok)
    n = len(outcomes.ok)
    return {
        "requests": int(n),
        "ok_requests": int(outcomes.ok.sum()),
        "tokens": int(outcomes.total.sum()),
        "tokens_on_time": int(outcomes.on_time.sum()),
        "token_attainment": _ratio(outcomes.on_time.sum(), outcomes.total.sum()),
        "ttft_attainment": _ratio(outcomes.ttft_met.sum(), n),
        "tpot_attainment": _ratio(outcomes.tpot_met.sum(), n),
        "e2e_attainment": _ratio(outcomes.e2e_met.sum(), n),
        "goodput_rps": _ratio(outcomes.e2e_met.sum(), duration_s),
        "app_mean_token_attainment": float(app_tok[valid].mean()) if valid.any() else float("nan"),
        "app_worst_token_attainment": float(app_tok[valid].min()) if valid.any() else float("nan"),
    }


def per_app(outcomes: Outcomes, app_id: np.ndarray, n_apps: int) -> dict[str, np.ndarray]:
    """Per-app attainment arrays of length n_apps (NaN for an app with nothing to count)."""
    app = np.asarray(app_id, dtype=np.int64)
    reqs = np.bincount(app, minlength=n_apps).astype(np.float64)
    tok = np.bincount(app, weights=outcomes.total, minlength=n_apps)
    on = np.bincount(app, weights=outcomes.on_time, minlength=n_apps)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "requests": reqs.astype(np.int64),
            "token_attainment": np.where(tok > 0, on / np.where(tok > 0, tok, 1), np.nan),
            "ttft_attainment": np.where(reqs > 0, np.bincount(app, weights=outcomes.ttft_met, minlength=n_apps) / np.maximum(reqs, 1), np.nan),
            "tpot_attainment": np.where(reqs > 0, np.bincount(app, weights=outcomes.tpot_met, minlength=n_apps) / np.maximum(reqs, 1), np.nan),
            "e2e_attainment": np.where(reqs > 0, np.bincount(app, weights=outcomes.e2e_met, minlength=n_apps) / np.maximum(reqs, 1), np.nan),
        }


def windows(
    outcomes: Outcomes, arrival_s: np.ndarray, window_s: float, start_s: float = 0.0, end_s: float | None = None
) -> dict[str, np.ndarray]:
    """Time series over fixed windows [start_s + k*window_s, start_s + (k+1)*window_s).

    Each request counts in the window of its arrival. Returns arrays: start_s, requests,
    load_rps, token_attainment, ttft_attainment, tpot_attainment, e2e_attainment,
    goodput_rps (NaN attainment where a window has no request).
    """
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    arr = np.asarray(arrival_s, dtype=np.float64)
    if end_s is None:
        end_s = float(arr.max()) if len(arr) else start_s
    k = max(1, int((end_s - start_s) // window_s) + 1)
    w = np.clip(((arr - start_s) // window_s).astype(np.int64), 0, k - 1)
    reqs = np.bincount(w, minlength=k).astype(np.float64)
    tok = np.bincount(w, weights=outcomes.total, minlength=k)
    on = np.bincount(w, weights=outcomes.on_time, minlength=k)

    def share(x: np.ndarray, den: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, np.bincount(w, weights=x, minlength=k) / np.maximum(den, 1e-300), np.nan)

    with np.errstate(invalid="ignore", divide="ignore"):
        token_att = np.where(tok > 0, on / np.maximum(tok, 1e-300), np.nan)
    return {
        "start_s": start_s + np.arange(k) * window_s,
        "requests": reqs.astype(np.int64),
        "load_rps": reqs / window_s,
        "token_attainment": token_att,
        "ttft_attainment": share(outcomes.ttft_met, reqs),
        "tpot_attainment": share(outcomes.tpot_met, reqs),
        "e2e_attainment": share(outcomes.e2e_met, reqs),
        "goodput_rps": np.bincount(w, weights=outcomes.e2e_met, minlength=k) / window_s,
    }
