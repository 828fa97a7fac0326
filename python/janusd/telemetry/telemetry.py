"""Per-model sliding-window telemetry: the one place load and length figures are derived.

The daemon (real time) and the simulator (virtual time) feed the same request events;
the performance oracle and the controller read snapshots; /metrics and `janus ctl`
render them. Nobody re-derives these figures, so the daemon, the simulator and the
plots agree. Pure: no I/O, no asyncio, no clock reads; every time is an argument in
seconds from the caller's clock.

What each figure counts (all windowed figures use windows.py's bucket rule):
- An event counts in the window of the time it happened: arrivals (request_rate,
  input_token_rate, input_len_*) at on_arrival, delivered tokens (output_token_rate) at
  on_tokens, first tokens (ttft_mean_s) at on_first_token, ends (finished, failed,
  output lengths, tokens_on_time/counted) at on_end. (trace/slo.py's offline windows
  attribute a request to its arrival instead; a live window cannot wait for the end.)
- window_s is the span the rates divide by: min(covered, max(bucket_s, now - first
  arrival of the model)), covered the seconds the window's buckets span at now
  (windows.py covered_s: from the start of the oldest bucket to now, between window_s -
  bucket_s and window_s when window_s is a whole number of buckets). The floor of one
  bucket keeps a burst seen at its first instant a finite rate (membership is per whole
  bucket anyway); rate * window_s is the count. (Until 2026-12-06 the span was window_s
  itself, which read a steady rate up to one bucket's share low.)
- output_len_mean/var cover requests that ended ok in the window plus, as a prior, every
  in-flight request at its max_tokens, until on_end replaces that guess with the real
  count. The oracle thus sees long outputs while they are still decoding, instead of a
  mean biased to the short requests that finish first. A failed request's count is
  censored (cut short), so it leaves the prior and adds no length; it still counts in
  finished and failed.
- Variances are population variances (ddof=0), merged Welford/Chan-style per bucket and
  exactly from integer sums for the prior: stable at large means (see windows.py).
- in_flight is not windowed: arrivals not yet ended (or forgotten). Every on_arrival must
  be paired with an on_end or a forget_model, or the request stays in flight.

Robustness (events come from a live daemon; none of this may raise):
- Unknown rids in on_first_token/on_tokens/on_end are ignored (late events after
  forget_model, or after the request already ended). A second on_first_token is ignored.
- A rid that arrives again while in flight replaces the earlier request, which leaves
  in_flight (and the prior) without counting as finished.
- Time is clamped to the latest time seen by any call (snapshots included); a
  non-finite time counts as that latest time (and is ignored before any finite time).
  Negative token counts count as 0.
"""

from __future__ import annotations

import math

import msgspec

from janusd.telemetry.windows import Moments, SlidingWindow, check_window_args

# Channels of a model's window.
_ARR, _TOK, _TTFT, _END, _FAIL, _OUT, _ONTIME, _COUNTED = range(8)
_CHANNELS = 8


class ModelWindow(msgspec.Struct, frozen=True):
    """One model's figures over the window ending at the snapshot time (see module doc)."""

    model: str
    window_s: float  # span the rates divide by: min(buckets' span, max(bucket_s, now - first arrival))
    request_rate: float  # arrivals per second in the window
    input_token_rate: float  # prompt tokens of arrivals per second
    output_token_rate: float  # output tokens delivered per second (from on_tokens)
    input_len_mean: float
    input_len_var: float
    output_len_mean: float  # ended ok in the window + in-flight max_tokens as a prior
    output_len_var: float
    in_flight: int  # admitted, not ended
    finished: int  # ended in the window (ok or failed)
    failed: int  # ended with failure in the window
    ttft_mean_s: float  # over first tokens in the window (0 if none)
    tokens_on_time: int  # per-token SLO figures of requests ended in the window
    tokens_counted: int
    last_arrival_s: float | None = None  # the latest arrival ever (keep-alive: idle since then)
    arrivals_total: int = 0  # arrivals ever (the controller buckets differences of it)


class TelemetrySnapshot(msgspec.Struct, frozen=True):
    now: float
    models: dict[str, ModelWindow]  # every model seen and not forgotten, by name


def _zeros(model: str) -> ModelWindow:
    return ModelWindow(model, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0, 0.0, 0, 0)


class _Live:
    __slots__ = ("model", "arrival", "max_tokens", "first_seen")

    def __init__(self, model: str, arrival: float, max_tokens: int) -> None:
        self.model = model
        self.arrival = arrival
        self.max_tokens = max_tokens
        self.first_seen = False


class _ModelState:
    """A model's window, first arrival and in-flight prior (exact integer sums)."""

    __slots__ = ("window", "first_arrival", "last_arrival", "arrivals", "live", "prior_s1", "prior_s2")

    def __init__(self, window_s: float, bucket_s: float, now: float) -> None:
        self.window = SlidingWindow(window_s, bucket_s, _CHANNELS)
        self.first_arrival = now
        self.last_arrival = now
        self.arrivals = 0
        self.live = 0
        self.prior_s1 = 0
        self.prior_s2 = 0

    def admit(self, max_tokens: int) -> None:
        self.live += 1
        self.prior_s1 += max_tokens
        self.prior_s2 += max_tokens * max_tokens

    def release(self, max_tokens: int) -> None:
        self.live -= 1
        self.prior_s1 -= max_tokens
        self.prior_s2 -= max_tokens * max_tokens


class Telemetry:
    """Listens to request events; keeps a sliding window per model (see module doc)."""

    def __init__(self, window_s: float = 60.0, bucket_s: float = 1.0) -> None:
        check_window_args(window_s, bucket_s)
        self.window_s = float(window_s)
        self.bucket_s = float(bucket_s)
        self._models: dict[str, _ModelState] = {}
        self._live: dict[int, _Live] = {}
        self._now: float | None = None

    def _clock(self, now: float) -> float | None:
        """Clamp to the latest time seen; None before any finite time."""
        if math.isfinite(now) and (self._now is None or now > self._now):
            self._now = float(now)
        return self._now

    def _drop(self, rid: int) -> _Live | None:
        live = self._live.pop(rid, None)
        if live is not None:
            self._models[live.model].release(live.max_tokens)
        return live

    def on_arrival(self, rid: int, model: str, now: float, prompt_tokens: int, max_tokens: int) -> None:
        t = self._clock(now)
        if t is None:
            return
        self._drop(rid)
        st = self._models.get(model)
        if st is None:
            st = self._models[model] = _ModelState(self.window_s, self.bucket_s, t)
        max_tokens = max(0, int(max_tokens))
        self._live[rid] = _Live(model, t, max_tokens)
        st.admit(max_tokens)
        st.last_arrival = t
        st.arrivals += 1
        st.window.add(t, _ARR, max(0, int(prompt_tokens)))

    def on_first_token(self, rid: int, now: float) -> None:
        t = self._clock(now)
        live = self._live.get(rid)
        if t is None or live is None or live.first_seen:
            return
        live.first_seen = True
        self._models[live.model].window.add(t, _TTFT, t - live.arrival)

    def on_tokens(self, rid: int, now: float, n: int) -> None:
        t = self._clock(now)
        live = self._live.get(rid)
        if t is None or live is None:
            return
        self._models[live.model].window.add(t, _TOK, max(0, int(n)))

    def on_end(
        self, rid: int, now: float, ok: bool, output_tokens: int, on_time_tokens: int = 0, counted_tokens: int = 0
    ) -> None:
        t = self._clock(now)
        if t is None:
            return
        live = self._drop(rid)
        if live is None:
            return
        ch = self._models[live.model].window.at(t)  # one bucket for the five values
        ch[_END].add(1)
        if ok:
            ch[_OUT].add(max(0, int(output_tokens)))
        else:
            ch[_FAIL].add(1)
        ch[_ONTIME].add(max(0, int(on_time_tokens)))
        ch[_COUNTED].add(max(0, int(counted_tokens)))

    def forget_model(self, model: str) -> None:
        """Drop a model's window and its in-flight requests; their late events are ignored."""
        if self._models.pop(model, None) is None:
            return
        for rid in [r for r, live in self._live.items() if live.model == model]:
            del self._live[rid]

    def model(self, name: str, now: float) -> ModelWindow:
        """One model's figures at `now`; zeros for a model not seen (or forgotten)."""
        t = self._clock(now)
        st = self._models.get(name)
        if t is None or st is None:
            return _zeros(name)
        return self._figures(name, st, t)

    def snapshot(self, now: float) -> TelemetrySnapshot:
        """Every known model's figures at `now` (clamped to the latest time seen)."""
        t = self._clock(now)
        if t is None:
            return TelemetrySnapshot(now, {})
        return TelemetrySnapshot(t, {m: self._figures(m, self._models[m], t) for m in sorted(self._models)})

    def _figures(self, name: str, st: _ModelState, now: float) -> ModelWindow:
        arr, tok, ttft, end, fail, out, ontime, counted = st.window.totals(now)
        span = min(st.window.covered_s(now), max(self.bucket_s, now - st.first_arrival))
        out.merge(Moments.from_sums(st.live, st.prior_s1, st.prior_s2))
        return ModelWindow(
            model=name,
            window_s=span,
            request_rate=arr.n / span,
            input_token_rate=arr.total / span,
            output_token_rate=tok.total / span,
            input_len_mean=float(arr.mean),
            input_len_var=arr.var,
            output_len_mean=float(out.mean),
            output_len_var=out.var,
            in_flight=st.live,
            finished=end.n,
            failed=fail.n,
            ttft_mean_s=float(ttft.mean),
            tokens_on_time=int(ontime.total),
            tokens_counted=int(counted.total),
            last_arrival_s=st.last_arrival,
            arrivals_total=st.arrivals,
        )
