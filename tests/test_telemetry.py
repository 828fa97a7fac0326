"""Telemetry (janusd.telemetry): a brute-force reference, hand cases, robustness and cost.

The reference keeps every raw event and recomputes each figure from scratch with exact
fractions, sharing only the bucket rule (bucket_index, span_buckets) with the code under
test; hypothesis drives both with the same random event sequences.
"""

import math
import random
import tracemalloc
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from janusd.telemetry import ModelWindow, Telemetry, TelemetrySnapshot
from janusd.telemetry.windows import bucket_index, span_buckets

FLOAT_FIELDS = [
    "window_s", "request_rate", "input_token_rate", "output_token_rate", "input_len_mean",
    "input_len_var", "output_len_mean", "output_len_var", "ttft_mean_s",
]  # fmt: skip
INT_FIELDS = ["in_flight", "finished", "failed", "tokens_on_time", "tokens_counted"]


class Reference:
    """Every figure recomputed from the raw events in the window (module doc rules)."""

    def __init__(self, window_s, bucket_s):
        self.w, self.b, self.nb = window_s, bucket_s, span_buckets(window_s, bucket_s)
        self.now = None
        self.models = {}  # name -> {"first": t, "arr": [(t, p)], "tok": [(t, n)], "ttft": [(t, s)], "end": [...]}
        self.live = {}  # rid -> [model, arrival, max_tokens, first_seen]

    def clock(self, now):
        self.now = now if self.now is None else max(self.now, now)
        return self.now

    def arrival(self, rid, model, now, prompt, max_tokens):
        t = self.clock(now)
        m = self.models.setdefault(model, {"first": t, "arr": [], "tok": [], "ttft": [], "end": []})
        self.live[rid] = [model, t, max_tokens, False]
        m["arr"].append((t, prompt))

    def first_token(self, rid, now):
        t = self.clock(now)
        if rid in self.live and not self.live[rid][3]:
            self.live[rid][3] = True
            self.models[self.live[rid][0]]["ttft"].append((t, t - self.live[rid][1]))

    def tokens(self, rid, now, n):
        t = self.clock(now)
        if rid in self.live:
            self.models[self.live[rid][0]]["tok"].append((t, n))

    def end(self, rid, now, ok, out, on_time, counted):
        t = self.clock(now)
        if rid in self.live:
            model = self.live.pop(rid)[0]
            self.models[model]["end"].append((t, ok, out, on_time, counted))

    def forget(self, model):
        self.models.pop(model, None)
        self.live = {r: v for r, v in self.live.items() if v[0] != model}

    def figures(self, name):
        m, now = self.models[name], self.now
        k_now = bucket_index(now, self.b)

        def inside(rows):
            return [r for r in rows if k_now - bucket_index(r[0], self.b) < self.nb]

        def mean_var(xs):
            if not xs:
                return 0.0, 0.0
            mean = Fraction(sum(xs), len(xs))
            return float(mean), float(sum((Fraction(x) - mean) ** 2 for x in xs) / len(xs))

        covered = max(self.b, now - (k_now - self.nb + 1) * self.b)  # the window's buckets' span
        span = min(covered, max(self.b, now - m["first"]))
        arr, ends = inside(m["arr"]), inside(m["end"])
        ttfts = [Fraction(s) for _, s in inside(m["ttft"])]
        outs = [e[2] for e in ends if e[1]] + [v[2] for v in self.live.values() if v[0] == name]
        in_mean, in_var = mean_var([p for _, p in arr])
        out_mean, out_var = mean_var(outs)
        return {
            "window_s": span,
            "request_rate": len(arr) / span,
            "input_token_rate": sum(p for _, p in arr) / span,
            "output_token_rate": sum(n for _, n in inside(m["tok"])) / span,
            "input_len_mean": in_mean,
            "input_len_var": in_var,
            "output_len_mean": out_mean,
            "output_len_var": out_var,
            "in_flight": sum(1 for v in self.live.values() if v[0] == name),
            "finished": len(ends),
            "failed": sum(1 for e in ends if not e[1]),
            "ttft_mean_s": float(sum(ttfts) / len(ttfts)) if ttfts else 0.0,
            "tokens_on_time": sum(e[3] for e in ends),
            "tokens_counted": sum(e[4] for e in ends),
        }


def assert_matches(got: ModelWindow, want: dict) -> None:
    for f in INT_FIELDS:
        assert getattr(got, f) == want[f], f
    for f in FLOAT_FIELDS:
        assert math.isclose(getattr(got, f), want[f], rel_tol=1e-9, abs_tol=1e-6), (f, getattr(got, f), want[f])


CONFIGS = [(60.0, 1.0), (3.0, 1.0), (2.0, 0.5), (1.0, 0.25), (1.0, 0.3), (2.5, 2.5), (0.7, 0.1)]
rids = st.integers(0, 5)  # few rids: most events hit a live request
models = st.sampled_from(["a", "b", "c"])
# mostly forward, sometimes exactly a bucket or a window ahead, sometimes backwards
dts = st.one_of(
    st.floats(0, 1), st.sampled_from([0.0, 0.1, 0.25, 0.3, 0.5, 1.0, 2.0, 2.5, 10.0, 100.0]), st.floats(-2, 0)
)  # fmt: skip
ops = st.one_of(  # (kind, dt, args...): every call is dt after the previous one
    st.tuples(st.just("arrival"), dts, rids, models, st.integers(0, 4000), st.integers(0, 4000)),
    st.tuples(st.just("first"), dts, rids),
    st.tuples(st.just("tokens"), dts, rids, st.integers(0, 40)),
    st.tuples(st.just("end"), dts, rids, st.booleans(), st.integers(0, 4000), st.integers(0, 50), st.integers(0, 50)),
    st.tuples(st.just("forget"), dts, models),
    st.tuples(st.just("snapshot"), dts),
)


@given(st.sampled_from(CONFIGS), st.floats(-50, 5000), st.lists(ops, min_size=20, max_size=100))
def test_snapshot_matches_brute_force_reference(config, t0, seq):
    tel, ref = Telemetry(*config), Reference(*config)
    t = t0

    def compare():
        snap = tel.snapshot(t)
        assert snap.now == ref.clock(t)
        assert sorted(snap.models) == sorted(ref.models)
        for name, mw in snap.models.items():
            assert mw.model == name
            assert_matches(mw, ref.figures(name))
            assert_matches(tel.model(name, t), ref.figures(name))
            assert len(tel._models[name].window) <= config[0] / config[1] + 1
        assert tel.model("nobody", t) == ModelWindow("nobody", *([0.0] * 8), 0, 0, 0, 0.0, 0, 0)

    for kind, dt, *args in seq:
        t += dt
        if kind == "arrival":
            tel.on_arrival(args[0], args[1], t, args[2], args[3])
            ref.arrival(args[0], args[1], t, args[2], args[3])
        elif kind == "first":
            tel.on_first_token(args[0], t)
            ref.first_token(args[0], t)
        elif kind == "tokens":
            tel.on_tokens(args[0], t, args[1])
            ref.tokens(args[0], t, args[1])
        elif kind == "end":
            tel.on_end(args[0], t, *args[1:])
            ref.end(args[0], t, *args[1:])
        elif kind == "forget":
            tel.forget_model(args[0])
            ref.forget(args[0])
        else:
            compare()
    compare()


def test_rates_means_and_variances_by_hand():
    tel = Telemetry(window_s=10.0, bucket_s=1.0)
    tel.on_arrival(1, "m", 0.0, prompt_tokens=10, max_tokens=100)
    tel.on_first_token(1, 0.5)
    tel.on_tokens(1, 0.5, 1)
    tel.on_arrival(2, "m", 1.0, prompt_tokens=20, max_tokens=50)
    tel.on_first_token(2, 1.25)
    tel.on_tokens(2, 1.25, 1)
    tel.on_first_token(2, 1.5)  # a second first token is ignored
    tel.on_arrival(3, "m", 2.0, prompt_tokens=30, max_tokens=0)
    tel.on_tokens(1, 4.0, 9)
    w = tel.model("m", 5.0)
    assert w.window_s == 5.0  # 5 s since the first arrival
    assert w.request_rate == 3 / 5
    assert w.input_token_rate == 60 / 5
    assert w.output_token_rate == 11 / 5
    assert (w.input_len_mean, w.input_len_var) == (20.0, pytest.approx(200 / 3))
    # nothing ended: the prior is every in-flight max_tokens (100, 50, 0)
    assert (w.output_len_mean, w.output_len_var) == (50.0, pytest.approx(5000 / 3))
    assert w.ttft_mean_s == pytest.approx((0.5 + 0.25) / 2)
    assert (w.in_flight, w.finished, w.failed) == (3, 0, 0)


def test_prior_is_replaced_by_the_real_count_at_end():
    tel = Telemetry(window_s=60.0, bucket_s=1.0)
    tel.on_arrival(7, "m", 0.0, 5, max_tokens=1000)
    tel.on_arrival(8, "m", 0.0, 5, max_tokens=10)
    assert tel.model("m", 1.0).output_len_mean == 505.0
    tel.on_end(7, 2.0, ok=True, output_tokens=40, on_time_tokens=30, counted_tokens=40)
    w = tel.model("m", 2.0)
    assert (w.output_len_mean, w.output_len_var) == (25.0, 225.0)  # 40 (real) and 10 (prior)
    assert (w.in_flight, w.finished, w.failed, w.tokens_on_time, w.tokens_counted) == (1, 1, 0, 30, 40)
    # a failure is censored: it leaves the prior, adds no length, counts as finished and failed
    tel.on_end(8, 3.0, ok=False, output_tokens=2, on_time_tokens=0, counted_tokens=10)
    w = tel.model("m", 3.0)
    assert (w.output_len_mean, w.output_len_var) == (40.0, 0.0)
    assert (w.in_flight, w.finished, w.failed, w.tokens_on_time, w.tokens_counted) == (0, 2, 1, 30, 50)


def test_events_leave_the_window_as_time_passes():
    tel = Telemetry(window_s=10.0, bucket_s=1.0)
    tel.on_arrival(1, "m", 0.5, 100, 10)
    tel.on_end(1, 3.5, True, 8, 8, 8)
    tel.on_arrival(2, "m", 5.5, 300, 10)
    w = tel.model("m", 9.99)  # buckets 0..9: all three events
    assert (w.request_rate, w.input_len_mean, w.finished) == (2 / 9.49, 200.0, 1)
    w = tel.model("m", 10.0)  # buckets 1..10, [1, 10]: the first arrival has left
    assert (w.window_s, w.request_rate, w.input_len_mean, w.finished) == (9.0, 1 / 9.0, 300.0, 1)
    w = tel.model("m", 14.0)  # buckets 5..14, [5, 14]: the end has left too; request 2 is in flight
    assert (w.window_s, w.request_rate, w.finished, w.output_len_mean, w.in_flight) == (9.0, 1 / 9.0, 0, 10.0, 1)
    w = tel.model("m", 14.5)  # [5, 14.5]
    assert (w.window_s, w.request_rate) == (9.5, 1 / 9.5)
    w = tel.model("m", 16.0)  # buckets 7..16: empty window, the in-flight prior stays
    assert (w.request_rate, w.input_len_mean, w.output_len_mean, w.in_flight) == (0.0, 0.0, 10.0, 1)


def test_a_steady_rate_reads_steady_at_any_phase_of_a_bucket():
    """One arrival every 0.1 s for a minute, read every 0.05 s past the first window: the
    rate is 10/s at every phase of the current bucket (it divides by the seconds its buckets
    span, not by window_s: that read 6.7-10/s with three 1 s buckets, low just after each
    boundary, and the controller's m* dipped)."""
    tel = Telemetry(window_s=3.0, bucket_s=1.0)
    for i in range(600):
        tel.on_arrival(i, "m", 0.1 * i + 0.05, 1, 1)
        now = 0.1 * i + 0.05
        if now > 3.5:
            assert tel.model("m", now).request_rate == pytest.approx(10.0, abs=0.5), now


def test_rates_of_a_burst_at_its_first_instant_divide_by_one_bucket():
    tel = Telemetry(window_s=60.0, bucket_s=0.5)
    for rid in range(10):
        tel.on_arrival(rid, "m", 100.0, 1, 1)
    w = tel.model("m", 100.0)
    assert (w.window_s, w.request_rate) == (0.5, 20.0)


def test_forget_model_drops_it_and_ignores_its_late_events():
    tel = Telemetry(window_s=10.0, bucket_s=1.0)
    tel.on_arrival(1, "a", 0.0, 10, 10)
    tel.on_arrival(2, "b", 0.0, 10, 10)
    tel.forget_model("a")
    tel.forget_model("never-seen")
    assert list(tel.snapshot(1.0).models) == ["b"]
    tel.on_first_token(1, 2.0)
    tel.on_tokens(1, 2.0, 5)
    tel.on_end(1, 3.0, True, 5)
    assert tel.model("a", 3.0) == ModelWindow("a", *([0.0] * 8), 0, 0, 0, 0.0, 0, 0)
    tel.on_arrival(3, "a", 4.0, 30, 30)  # a fresh start: first arrival is now 4.0
    w = tel.model("a", 6.0)
    assert (w.window_s, w.request_rate, w.input_len_mean, w.in_flight) == (2.0, 0.5, 30.0, 1)
    assert tel.model("b", 6.0).in_flight == 1


def test_unknown_rids_are_ignored():
    tel = Telemetry()
    tel.on_first_token(99, 1.0)
    tel.on_tokens(99, 1.0, 3)
    tel.on_end(99, 1.0, False, 3)
    assert tel.snapshot(1.0) == TelemetrySnapshot(1.0, {})
    tel.on_arrival(1, "m", 2.0, 4, 4)
    tel.on_end(1, 3.0, True, 4)
    tel.on_end(1, 3.0, True, 4)  # a second end of the same request
    tel.on_tokens(1, 3.0, 4)  # tokens after the end
    w = tel.model("m", 3.0)
    assert (w.finished, w.output_token_rate, w.in_flight) == (1, 0.0, 0)


def test_a_repeated_rid_replaces_the_in_flight_request():
    tel = Telemetry()
    tel.on_arrival(1, "a", 0.0, 4, 100)
    tel.on_arrival(1, "b", 1.0, 4, 10)
    assert (tel.model("a", 1.0).in_flight, tel.model("a", 1.0).output_len_mean) == (0, 0.0)
    assert (tel.model("b", 1.0).in_flight, tel.model("b", 1.0).finished) == (1, 0)


def test_backwards_time_is_clamped_to_the_latest_seen():
    tel = Telemetry(window_s=10.0, bucket_s=1.0)
    tel.on_arrival(1, "m", 20.0, 10, 10)
    tel.on_first_token(1, 15.0)  # out of order: counts at 20.0, ttft 0 (not negative)
    tel.on_end(1, 5.0, True, 6)
    snap = tel.snapshot(3.0)
    assert snap.now == 20.0
    w = snap.models["m"]
    assert (w.ttft_mean_s, w.finished, w.request_rate, w.window_s) == (0.0, 1, 1.0, 1.0)
    assert tel.model("m", 29.99).finished == 1  # the window still ends at the clamped time
    assert tel.model("m", 30.0).finished == 0
    tel.on_arrival(2, "m", float("nan"), 1, 1)  # a non-finite time counts as the latest
    assert tel.snapshot(float("inf")).now == 30.0
    assert tel.model("m", 30.0).request_rate == 1 / 9.0  # one arrival in [21, 30]


@pytest.mark.parametrize(
    "kw", [{"window_s": 0}, {"window_s": -1}, {"bucket_s": 0}, {"bucket_s": -1}, {"window_s": 1, "bucket_s": 2}]
)
def test_bad_constructor_args(kw):
    with pytest.raises(ValueError):
        Telemetry(**kw)


def test_100k_events_in_bounded_memory():
    """Memory is the window's, not the history's: a raw-event design would hold ~100k rows."""
    window_s, bucket_s, names = 10.0, 0.5, ["m0", "m1", "m2", "m3"]
    rng = random.Random(0)
    tracemalloc.start()
    try:
        tel = Telemetry(window_s=window_s, bucket_s=bucket_s)
        t, events = 0.0, 0
        for rid in range(25_000):  # 4 events each, 100 requests/s: 250 s, 25 windows
            t += 0.01
            tel.on_arrival(rid, names[rid % 4], t, rng.randint(1, 2000), 256)
            tel.on_first_token(rid - 3, t)
            tel.on_tokens(rid - 3, t, 1)
            tel.on_end(rid - 5, t, True, rng.randint(1, 256), 1, 1)
            events += 4
            if rid % 500 == 0:
                for st_ in tel._models.values():
                    assert len(st_.window) <= window_s / bucket_s + 1
        snap = tel.snapshot(t)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert events == 100_000
    assert held < 512 * 1024, held
    assert len(tel._live) == 5
    for w in snap.models.values():
        assert window_s - bucket_s <= w.window_s <= window_s  # the buckets' span at t
        assert 24.9 <= w.request_rate <= 25.0 + 1e-9  # 25/s at any phase: the span is what the buckets hold
        assert 1 <= w.in_flight <= 2


def test_variances_are_stable_at_large_means():
    tel = Telemetry(window_s=60.0, bucket_s=1.0)
    big = 10**12
    for rid in range(300):  # spread over 30 buckets, merged across them at the snapshot
        tel.on_arrival(rid, "m", rid / 10, big + rid % 3, big + rid % 3)
    w = tel.model("m", 30.0)
    assert (w.input_len_mean, w.output_len_mean) == (big + 1, big + 1)
    # Welford/Chan in floats: relative error ~ ulp(mean) / std (1e-4 / 0.8 here); a naive
    # E[x^2] - E[x]^2 would be off by ~1e8. The prior comes from exact integer sums.
    assert w.input_len_var == pytest.approx(2 / 3, rel=1e-4)
    assert w.output_len_var == pytest.approx(2 / 3, rel=1e-12)
