"""The simulator's evidence stays honest once it runs the daemon's controller ([U]): the
room can be handed an oracle with a measured error (`janus sim --oracle-error`), and
static is reported right-sized beside "all devices" (`janus sim --vs-static`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from janusd.oracle.types import LoadFeatures
from janusd.sim.oracle_error import MisjudgingOracle, OracleErrorError
from janusd.sim.placement import PlacementError
from janusd.sim.right_size import fewest_devices, vs_static
from janusd.sim.run import simulate
from janusd.sim.specs import resolve
from janusd.trace.formats import write_trace
from test_sim_controller import burst_trace

LOAD = LoadFeatures(request_rate=2.0, input_token_rate=400.0, output_token_rate=100.0, input_len_mean=200.0,
                    input_len_var=0.0, output_len_mean=50.0, output_len_var=0.0)


class _Seen:
    """A base oracle that records the loads it is asked about."""

    def __init__(self) -> None:
        self.loads: list[tuple[str, LoadFeatures]] = []

    def capacity(self, model, load):  # type: ignore[no-untyped-def]
        self.loads.append((model, load))
        return "c"

    def min_instances(self, model, load, target, margin, limit):  # type: ignore[no-untyped-def]
        self.loads.append((model, load))
        return "m"


def test_each_model_is_misjudged_by_one_fixed_factor_within_the_error():
    base = _Seen()
    o = MisjudgingOracle(base, ["a", "b", "c"], 0.3, seed=5)
    assert all(0.7 <= k <= 1.3 for k in o.factor.values()) and len(set(o.factor.values())) == 3
    assert MisjudgingOracle(base, ["c", "b", "a"], 0.3, seed=5).factor == o.factor  # seeded, order-free
    assert o.capacity("a", LOAD) == "c" and o.min_instances("a", LOAD, 0.95, 1.0, 8) == "m"
    for _, seen in base.loads:
        k = o.factor["a"]
        assert seen.request_rate == pytest.approx(2.0 * k) and seen.output_token_rate == pytest.approx(100.0 * k)
        assert seen.input_len_mean == 200.0  # lengths are not the misjudged part
    assert MisjudgingOracle(base, ["a"], 0.0).factor == {"a": 1.0}
    for bad in (-0.1, 1.0, 2.0):
        with pytest.raises(OracleErrorError, match="oracle-error"):
            MisjudgingOracle(base, ["a"], bad)


def test_a_misjudging_oracle_changes_the_run_and_the_seed_repeats_it():
    tr = burst_trace(2)
    archs = resolve(tr.models)
    exact = simulate(tr, archs, 8, "janus")[1]
    off = simulate(tr, archs, 8, "janus", oracle_error=0.6, oracle_seed=3)[1]
    again = simulate(tr, archs, 8, "janus", oracle_error=0.6, oracle_seed=3)[1]
    assert off["oracle_error"] == 0.6 and exact["oracle_error"] == 0.0
    assert (off["token_attainment"], off["device_hours"]) != (exact["token_attainment"], exact["device_hours"])
    assert (off["token_attainment"], off["device_hours"]) == (again["token_attainment"], again["device_hours"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=30), st.floats(0.0, 1.0), st.integers(1, 5))
def test_fewest_devices_is_the_brute_force_answer_on_monotone_attainment(steps, target, lo):
    """Against a reference: a nondecreasing attainment per device count (static's, where
    fewer devices than models cannot be placed at all)."""
    att = sorted(steps)
    hi = lo + len(att) - 1

    def run(n: int) -> dict:
        if n < lo:
            raise PlacementError("too few devices")
        return {"token_attainment": att[n - lo], "device_hours": float(n)}

    want = next((n for n in range(lo, hi + 1) if att[n - lo] >= target), None)
    assert fewest_devices(run, target, max(lo - 2, 1), hi, {}) == want


def test_vs_static_reports_all_devices_right_sized_and_at_the_controllers_devices():
    calls: list[int] = []

    def run(n: int) -> dict:
        calls.append(n)
        return {"token_attainment": min(1.0, n / 10.0), "device_hours": n * 0.5}

    out = vs_static(run, {"token_attainment": 0.55, "device_hours": 2.0, "sim_end_s": 3600.0}, 12, 2)
    assert out["all_devices"] == {"devices": 12, "token_attainment": 1.0, "device_hours": 6.0}
    assert out["right_sized"]["devices"] == 6 and out["right_sized"]["token_attainment"] == 0.6
    assert out["at_controller_devices"] == {"devices": 2, "token_attainment": 0.2, "device_hours": 1.0}
    assert len(calls) == len(set(calls)) == out["runs"]  # each device count run once


def test_the_cli_prints_static_beside_the_controller(tmp_path):
    tr = burst_trace(0)
    path = tmp_path / "burst.csv"
    write_trace(tr, path)
    p = subprocess.run([sys.executable, "-m", "janusd.cli", "sim", "--trace", str(path), "--devices", "8",
                        "--policy", "janus", "--vs-static", "--oracle-error", "0.2", "--json"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout.strip().splitlines()[-1])
    assert s["oracle_error"] == 0.2 and s["static"]["all_devices"]["devices"] == 8
    # static on all 8 devices does not reach janus's attainment on this burst: no right size
    assert s["static"]["all_devices"]["token_attainment"] < s["token_attainment"]
    assert s["static"]["right_sized"]["devices"] is None
    bad = subprocess.run([sys.executable, "-m", "janusd.cli", "sim", "--trace", str(path), "--devices", "8",
                          "--policy", "janus", "--oracle-error", "1.5"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "oracle-error must be in [0, 1)" in bad.stderr
