"""`janus bench placement` on a small run: the documented figures, last line in the
issue's order, and numbers that mean what they say."""

from __future__ import annotations

import argparse

from janusd.bench import placement


def test_small_run_reports_consistent_figures():
    p = argparse.ArgumentParser()
    placement.add_arguments(p)
    args = p.parse_args(["--snapshots", "30", "--max-items", "8", "--devices", "64", "--apps", "8",
                         "--items", "40", "--reps", "1", "--trace-hours", "1"])
    out = placement.run(args)
    assert list(out)[-5:] == ["snapshots", "optimal_match_fraction", "worst_gap_bins", "decision_ms_p50",
                              "decision_ms_p99"]
    assert out["snapshots"] == 30 and 0.9 <= out["optimal_match_fraction"] <= 1.0 and out["worst_gap_bins"] <= 1
    assert 0 < out["decision_ms_p50"] <= out["decision_ms_p99"]
    # the figures come from the trace's capacity vectors; the random families apart
    assert out["random_snapshots"] == 30 and out["random_worst_gap_bins"] <= 1
    assert 2 <= out["items_mean"] <= 8 and 1 <= out["optimal_bins_mean"] <= out["optimal_bins_max"] <= 8
    assert 0.0 <= out["at_lower_bound_fraction"] <= out["optimal_match_fraction"]
    assert out["slow_tick_migrations"] <= 8  # PlacementConfig().migration_budget
    assert out["elastic_budget"] == 64 - out["slow_tick_bins"]
    assert out["elastic_given"] <= out["elastic_budget"]
    per = out["bins_per_period"]
    assert per[0] == out["slow_tick_bins"] and all(a >= b for a, b in zip(per, per[1:]))  # never more devices
