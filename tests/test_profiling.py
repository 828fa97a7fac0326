"""`janus profile` end to end on a real daemon (short budget), and its pure parts."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from janusd.oracle.dataset import read_points
from janusd.profiling.daemon import split_cores
from janusd.profiling.load import MIXES, in_knee, make_trace, point_seconds, settle_seconds
from janusd.profiling.measure import engine_counters, pool_pages
from daemon_harness import ROOT, SHARED_CACHE

METRICS = """# TYPE janusd_pool_pages gauge
janusd_pool_pages{device="0",kind="weight_pages"} 3.0
janusd_pool_pages{device="0",kind="kv_pages"} 5.0
janusd_pool_pages{device="0",kind="num_pages"} 128.0
# TYPE janusd_pool_stat gauge
janusd_pool_stat{device="0",stat="page_size"} 2097152.0
"""


def test_pool_pages_and_traces():
    assert pool_pages(METRICS) == {"0": {"weight_pages": 3.0, "kv_pages": 5.0, "num_pages": 128.0,
                                         "page_size": 2097152.0}}
    assert point_seconds(1.0, 8.0) == 16.0 and point_seconds(10.0, 8.0) == 8.0 and point_seconds(0.01, 8.0) == 24.0
    assert settle_seconds(4.0) == 2.0 and settle_seconds(20.0) == 5.0


def test_traces_are_stratified_so_repeats_offer_the_same_load():
    a = make_trace(20.0, (30.0,), "short", np.random.default_rng(0), 500.0, 50.0, 2048)
    b = make_trace(20.0, (30.0,), "short", np.random.default_rng(1), 500.0, 50.0, 2048)
    assert len(a) == len(b) == 600 and a.arrival_s.min() >= 0 and a.arrival_s.max() < 30.0
    assert not np.array_equal(a.arrival_s, b.arrival_s) and not np.array_equal(a.input_tokens, b.input_tokens)
    # the same lengths in another order: the mean and the spread are the setting's, not the draw's
    assert np.array_equal(np.sort(a.input_tokens), np.sort(b.input_tokens))
    assert np.array_equal(np.sort(a.output_tokens), np.sort(b.output_tokens))
    assert abs(a.input_tokens.mean() / MIXES["short"][0] - 1) < 0.01
    assert abs(a.output_tokens.mean() / MIXES["short"][1] - 1) < 0.02
    assert 0.45 < np.log(a.input_tokens).std() < 0.5  # LENGTH_SIGMA, less the rounding and the clip
    # a profile point: the measured window (2 s to 10 s) holds exactly the rate's requests and its own quantiles
    windows = []
    for seed in (2, 3):
        t = make_trace(2.0, (2.0, 8.0, 2.0), "long", np.random.default_rng(seed), 500.0, 50.0, 2048)
        inside = (t.arrival_s >= 2.0) & (t.arrival_s < 10.0)
        assert len(t) == 24 and inside.sum() == 16 and t.arrival_s.max() < 12.0
        windows.append(np.sort(t.input_tokens[inside]))
    assert np.array_equal(*windows)
    with pytest.raises(ValueError, match="segments"):
        make_trace(2.0, (2.0, 0.0), "long", np.random.default_rng(0), 500.0, 50.0, 2048)


def test_the_knee_bracket_is_where_attainment_falls_below_high():
    measured = [(1.0, 1.0), (3.0, 0.95), (9.0, 0.2)]
    assert in_knee(measured, 5.0) and not in_knee(measured, 2.0) and not in_knee(measured, 12.0)
    assert not in_knee([(1.0, 1.0), (3.0, 1.0)], 2.0) and not in_knee([], 1.0)


def test_profile_writes_points_of_a_real_run(tmp_path):
    out = tmp_path / "p.npz"
    # short: the daemon's admin socket goes under TMPDIR, and AF_UNIX paths stop at 108
    # bytes (pytest-xdist's tmp_path is deeper than one process's)
    scratch = Path(tempfile.mkdtemp(prefix="jp-"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python"), "TMPDIR": str(scratch)}
    proc = subprocess.run(
        [sys.executable, "-m", "janusd.cli", "profile", "demo:llama-tiny", "--budget-s", "40", "--point-s", "2",
         "--max-instances", "1", "--mixes", "tiny", "--start-rate", "4", "--memory-mib", "128", "--kv-cache-mib", "32",
         "--cache-dir", str(SHARED_CACHE), "--out", str(out), "--repeats", "2", "--quiet", "--pin-cores"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    pts = read_points(out)
    assert summary["points"] == len(pts) >= 2 and summary["elapsed_s"] < 80
    assert set(pts.instances.tolist()) == {1}
    assert pts.header["model"] == "demo:llama-tiny" and pts.header["device"]["name"] == "cpu"
    assert pts.header["model_spec"]["layers"] == 2 and pts.header["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 200.0}
    # rates follow knee.py from the start rate; features measure what was offered
    assert pts.features[0, 0] > 0 and np.all(pts.resources[:, 0] > 0) and np.all(pts.resources[:, 1] > 0)
    # every load point measured twice (a replay dropped for client lag would leave one): one point_id each
    ids, counts = np.unique(pts.point_id, return_counts=True)
    assert summary["load_points"] == len(ids) and set(counts.tolist()) <= {1, 2} and counts.max() == 2
    assert pts.header["notes"]["repeats"] == 2 and pts.header["notes"]["noise"]["repeated_points"] >= 1
    assert summary["noise"] == pts.header["notes"]["noise"]
    # the steady-state window's settings travel with the points; the per-point results were not kept
    assert pts.header["notes"]["trace"] == "stratified" and pts.header["notes"]["settle_min_s"] == 2.0
    assert not list(scratch.glob("janus-profile-*"))
    shutil.rmtree(scratch, ignore_errors=True)
    # the host time per step was measured with the peaks and travels with the points
    assert pts.header["device"]["layer_overhead_s"] > 0
    # the engine's own counters per row: it stepped and decoded, and its forward time is part of
    # the replay's wall time (a step may prefill only, so steps and decoded tokens are not ordered)
    assert pts.engine.shape == (len(pts), 4) and "engine_per_row" not in pts.header["notes"]
    for steps, decoded, fwd, wall in pts.engine:
        assert steps > 0 and decoded > 0 and 0 < fwd < wall
    # --pin-cores: the worker on the top core, the daemon and the replayer on the others
    cores = sorted(os.sched_getaffinity(0))
    want = {"workers": [[cores[-1]]], "host": cores[:-1]} if len(cores) > 1 else "not pinned"
    assert pts.header["notes"]["pinning"] == {"1": want}


def test_engine_counters_sum_the_profiled_models_instances():
    text = METRICS + (
        "# TYPE janusd_engine_steps counter\n"
        'janusd_engine_steps_total{model="profiled",device="0"} 10.0\n'
        'janusd_engine_steps_total{model="profiled",device="1"} 5.0\n'
        'janusd_engine_steps_total{model="other",device="0"} 99.0\n'
        "# TYPE janusd_engine_forward_seconds counter\n"
        'janusd_engine_forward_seconds_total{model="profiled",device="0"} 1.5\n')
    assert engine_counters(text) == {"steps": 15.0, "decode_tokens": 0.0, "forward_seconds": 1.5}


def test_cores_split_between_workers_and_the_host():
    assert split_cores([0, 1], 1, 1) == ([[1]], [0])
    assert split_cores([3, 0, 1, 2], 2, 1) == ([[2], [3]], [0, 1])
    assert split_cores(range(8), 3, 2) == ([[2, 3], [4, 5], [6, 7]], [0, 1])
    assert split_cores([0, 1], 2, 1) is None  # no core left for the daemon and the replayer: not pinned
    assert split_cores([0, 1, 2], 1, 0) == ([[2]], [0, 1])  # torch's default threads: a core each


def test_a_rate_the_client_could_not_offer_ends_the_mixs_growth():
    from janusd.oracle.knee import GROWTH, series_next_rate

    served = [(2.0, 1.0), (6.0, 1.0), (18.0, 1.0), (54.0, 1.0)]
    assert series_next_rate(served, 1, 0.0, math.inf, 2.0, 1000.0) == 54.0 * GROWTH  # still served: grow
    cap = 54.0 * GROWTH / 1.12  # that rate lagged
    nxt = series_next_rate(served, 1, 0.0, cap, 2.0, 1000.0)
    assert nxt is not None and nxt < 54.0  # no retry at or past the lag: fill the served range instead
    assert series_next_rate([], 2, 54.0, cap, 2.0, 1000.0) == 54.0  # m x half the knee, under the cap
    assert series_next_rate([], 2, 0.0, math.inf, 2.0, 1000.0) == 2.0  # another mix: no knee, no cap
