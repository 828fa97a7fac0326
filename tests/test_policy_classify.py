"""Bursty isolation (policy/classify.py): thresholds, operator pins, hysteresis and the
quiet-time demotion of an elastic app."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.policy.classify import ClassifyError, classify, traffic_from_counts
from janusd.policy.policy_config import ClassifyConfig
from janusd.policy.snapshot import AppTraffic

CFG = ClassifyConfig()  # elastic at 5/s or peak/mean 3; quiet below 2/s and peak/mean 2, for 120 s


def run(seq, dt=30.0, pin=None, cfg=CFG):
    """Pools over a sequence of (rate, peak) for one app, evaluated every dt seconds."""
    state, out = (), []
    for k, (rate, peak) in enumerate(seq):
        c = classify([AppTraffic(app="x", rate=rate, peak_rate=peak, pin=pin)], state, k * dt, cfg)
        state = c.state
        out.append(c.decisions[0].pool)
    return out


def test_hot_and_bursty_apps_go_elastic_at_once():
    c = classify([AppTraffic(app="hot", rate=6.0, peak_rate=7.0), AppTraffic(app="burst", rate=1.0, peak_rate=4.0),
                  AppTraffic(app="tail", rate=1.0, peak_rate=1.5), AppTraffic(app="trickle", rate=0.1, peak_rate=2.0)],
                 (), 0.0, CFG)
    got = {d.app: (d.pool, d.reason.split(":")[0]) for d in c.decisions}
    assert got == {"burst": ("elastic", "bursty"), "hot": ("elastic", "hot"), "tail": ("steady", "steady"),
                   "trickle": ("steady", "steady")}  # 0.1/s: below min_burst_rate, peak/mean is noise


def test_an_elastic_app_returns_only_after_quiet_s():
    seq = [(6, 6)] + [(1, 1)] * 6
    assert run(seq) == ["elastic"] * 5 + ["steady"] * 2  # quiet from t=30, back at t=150
    # a busy tick in between restarts the quiet clock
    seq = [(6, 6), (1, 1), (1, 1), (3, 3), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1)]
    assert run(seq) == ["elastic"] * 8 + ["steady"]


def test_an_operator_pin_wins_over_traffic():
    assert run([(50, 60), (0, 0)], pin="steady") == ["steady", "steady"]
    assert run([(0, 0), (0, 0)], pin="elastic") == ["elastic", "elastic"]


@given(st.lists(st.floats(0.0, 10.0), min_size=2, max_size=40))
@settings(max_examples=200)
def test_a_rate_wandering_inside_the_band_never_flips(rates):
    """Rates that stay within [steady_rate, elastic_rate) keep whatever pool the app
    entered with: the band is the hysteresis."""
    inside = [min(max(r, CFG.steady_rate), CFG.elastic_rate - 1e-6) for r in rates]
    for first in (0.5, 6.0):  # enters steady, or elastic
        out = run([(first, first)] + [(r, r) for r in inside])
        assert len(set(out[1:])) == 1 and out[1] == out[0]


@given(st.lists(st.sampled_from([1.0, 6.0]), min_size=4, max_size=60))
@settings(max_examples=200)
def test_pool_changes_are_bounded_by_quiet_s_on_adversarial_input(rates):
    """However the rate jumps between 1/s and 6/s, the app goes back to steady at most
    once per quiet_s: at most 1 + 2 * horizon / quiet_s changes."""
    dt = 30.0
    out = run([(r, r) for r in rates], dt=dt)
    changes = sum(a != b for a, b in zip(out, out[1:]))
    back = sum(a == "elastic" and b == "steady" for a, b in zip(out, out[1:]))
    assert back <= len(rates) * dt / CFG.quiet_s
    assert changes <= 2 * back + 1


def test_bad_figures_and_bands_are_refused():
    with pytest.raises(ClassifyError, match="'x' appears twice"):
        classify([AppTraffic(app="x", rate=1, peak_rate=1)] * 2, (), 0.0, CFG)
    with pytest.raises(ClassifyError, match="peak_rate"):
        classify([AppTraffic(app="x", rate=2, peak_rate=1)], (), 0.0, CFG)
    with pytest.raises(ClassifyError, match="finite"):
        classify([AppTraffic(app="x", rate=float("nan"), peak_rate=1)], (), 0.0, CFG)
    with pytest.raises(msgspec.ValidationError, match="steady_rate"):
        msgspec.convert({"steady_rate": 6.0}, ClassifyConfig)


def test_traffic_from_counts_sees_a_short_burst_the_mean_hides():
    # 60 s at 1/s, then a 5 s burst at 8/s: mean 1.54/s, peak over 5 s windows 8/s
    counts = [1] * 60 + [8] * 5
    t = traffic_from_counts("x", counts, 1.0, 5)
    assert t.rate == pytest.approx(100 / 65) and t.peak_rate == pytest.approx(8.0)
    d = classify([t], (), 0.0, CFG).decisions[0]
    assert (d.pool, d.reason.split(":")[0]) == ("elastic", "bursty")
    assert traffic_from_counts("x", [0, 0], 1.0, 5).peak_rate == 0.0
    with pytest.raises(ClassifyError, match="short_buckets"):
        traffic_from_counts("x", [1], 1.0, 0)


@given(st.lists(st.integers(0, 50), min_size=1, max_size=80), st.integers(1, 10))
@settings(max_examples=100)
def test_peak_is_the_brute_force_max_window(counts, k):
    t = traffic_from_counts("x", counts, 0.5, k)
    kk = min(k, len(counts))
    brute = max(sum(counts[i:i + kk]) for i in range(len(counts) - kk + 1)) / (kk * 0.5)
    assert t.peak_rate == pytest.approx(max(brute, t.rate))
