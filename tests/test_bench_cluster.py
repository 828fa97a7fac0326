"""`janus bench cluster`'s pure parts (bench/cluster_setup.py, bench/cluster_figures.py):
the trace has the shape the bench claims, the two configs are what the daemon accepts and
differ only where they should, and the figures score a timeline as documented."""

from __future__ import annotations

import numpy as np
import pytest

from janusd.bench.cluster_figures import ModelTimeline, scale_out_delays, undone_scale_outs
from janusd.bench.cluster_setup import APPS, BURST_RPS, BURST_S, burst_starts, config, make_trace
from janusd.config import parse_config


def test_the_trace_has_two_bursts_per_bursty_app_quiet_gaps_and_is_deterministic():
    t = make_trace(240.0, 3)
    again = make_trace(240.0, 3)
    assert np.array_equal(t.arrival_s, again.arrival_s) and not np.array_equal(t.arrival_s, make_trace(240.0, 4).arrival_s)
    names = np.array(t.apps)[t.app_id]
    for app, starts in burst_starts(240.0).items():
        a = t.arrival_s[names == app]
        for b in starts:
            inside = np.sum((a >= b) & (a < b + BURST_S)) / BURST_S
            assert 0.7 * BURST_RPS < inside < 1.3 * BURST_RPS
        assert np.sum(a < starts[0]) / starts[0] < 2.0  # the base rate before the first burst
    a, b = burst_starts(240.0)["burst-a"], burst_starts(240.0)["burst-b"]
    assert all(abs(x - y) >= BURST_S for x in a for y in b), "the two apps' bursts do not overlap"
    q = np.sort(t.arrival_s[names == "quiet-a"])
    assert np.diff(q).max() >= 40.0, "a quiet app has a gap long enough to go Warm (warm_after_s 25)"
    assert set(t.ttft_slo_ms) == {1000.0} and set(t.tpot_slo_ms) == {100.0}
    with pytest.raises(ValueError, match="60 s"):
        make_trace(30.0, 1)


def test_both_configs_parse_and_split_as_documented(tmp_path):
    static = parse_config(config("static", str(tmp_path)))
    janus = parse_config(config("janus", str(tmp_path)))
    assert not static.control.managed and janus.control.managed
    assert {m.name: m.devices for m in static.models} == {a: [d] for a, (_, d, _) in APPS.items()}
    bursty = {m.name: (m.devices, m.warm_devices, m.pool) for m in janus.models if m.pool == "elastic"}
    assert bursty == {"burst-a": ([0, 1], [1], "elastic"), "burst-b": ([0, 1], [1], "elastic")}
    assert all(m.devices == [0] for m in janus.models if m.pool != "elastic")
    assert janus.control.keepalive.demote_pinned and janus.control.scaling.scale_in_hold_s == 10.0
    with pytest.raises(ValueError):
        config("elastic", str(tmp_path))


def _timeline(points: list[tuple[float, int]]) -> ModelTimeline:
    tl = ModelTimeline()
    for t, n in points:
        tl.add(t, {"m": set(range(n)), "other": {0}})
    return tl


def test_scale_out_delays_undone_scale_outs_and_device_seconds():
    tl = _timeline([(0.0, 1), (10.0, 1), (10.5, 1), (11.2, 2), (30.0, 2), (31.0, 1), (35.0, 2), (60.0, 1),
                    (100.0, 1)])
    assert scale_out_delays(tl, {"m": [10.2, 32.0, 36.0, 80.0]}) == {"m": [1.0, 3.0, 0.0, None]}
    assert undone_scale_outs(tl, ["m"], hold_s=10.0) == 1  # down at 31, up at 35; down at 60 stays down
    assert undone_scale_outs(tl, ["m"], hold_s=3.0) == 0
    # devices with an Active instance: 1 until 11.2, 2 until 31, 1 until 35, 2 until 60, then 1
    assert tl.device_seconds() == pytest.approx(11.2 + 2 * 19.8 + 4.0 + 2 * 25.0 + 40.0)
