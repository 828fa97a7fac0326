"""`janus profile` end to end on a real daemon (short budget), and its pure parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from janusd.oracle.dataset import read_points
from janusd.oracle.profile import MIXES, make_trace, point_seconds, pool_pages
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
    assert point_seconds(0.5, 8.0) == 16.0 and point_seconds(10.0, 8.0) == 8.0 and point_seconds(0.01, 8.0) == 24.0
    t = make_trace(20.0, 30.0, "short", np.random.default_rng(0), 500.0, 50.0, 2048)
    assert 500 < len(t) < 700 and t.arrival_s.min() >= 0 and t.arrival_s.max() < 30.0
    assert abs(t.input_tokens.mean() / MIXES["short"][0] - 1) < 0.1
    assert abs(t.output_tokens.mean() / MIXES["short"][1] - 1) < 0.1


def test_profile_writes_points_of_a_real_run(tmp_path):
    out = tmp_path / "p.npz"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python")}
    proc = subprocess.run(
        [sys.executable, "-m", "janusd.cli", "profile", "demo:llama-tiny", "--budget-s", "40", "--point-s", "2",
         "--max-instances", "1", "--mixes", "tiny", "--start-rate", "4", "--memory-mib", "128", "--kv-cache-mib", "32",
         "--cache-dir", str(SHARED_CACHE), "--out", str(out), "--repeats", "2", "--quiet"],
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
    # the host time per step was measured with the peaks and travels with the points
    assert pts.header["device"]["layer_overhead_s"] > 0
