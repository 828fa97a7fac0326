"""The simulator's figures for a seed, recorded before its hot paths moved (the per-request
on-time count to Rust, the prior's m* search, request_slo's view of a run; 2026-12-03, code
at 58c1791): a faster simulator must give the same run, request for request. A deliberate change of
policy or prior changes these figures: re-record them in the same commit and say why
(burst/janus's device-hours: the prior counts the LM head on the sampled row only, [O])."""

from __future__ import annotations

import pytest

from janusd.sim.run import simulate
from janusd.sim.specs import resolve
from sim_fixtures import poisson_trace
from test_sim_controller import burst_trace

RECORDED = {
    "burst/janus": {  # re-recorded 2026-12-07: the simulator runs the daemon's controller (control/room.py,
        # [U]): the hot app keeps its steady instance and gets extra replicas beside it (was: whole
        # devices from an elastic pool of its own), and the apps start one device each (was: packed at
        # zero load); was on_time 212700, ok 1432, attainment 0.96250, 0.12293 h
        "on_time": 211283,
        "ok": 1421,
        "ttft_met": 1416,
        "tpot_met": 1421,
        "token_attainment": 0.9560922411374476,
        "device_hours": 0.1295383916067034,
        "sim_end_s": 90.60013112645477
    },
    "burst/static": {
        "on_time": 183893,
        "ok": 1243,
        "ttft_met": 1241,
        "tpot_met": 1243,
        "token_attainment": 0.8321477378657471,
        "device_hours": 0.14168720579633878,
        "sim_end_s": 63.75924260835245
    },
    "poisson/janus": {  # re-recorded 2026-12-07 with the daemon's controller ([U]); was on_time 691114,
        # ok 2031, ttft 1566, tpot 1992, attainment 0.57974, 0.09959 h. Three apps at ~50 req/s in all on 3
        # devices is past capacity: every app turns elastic at once, but the daemon's rule keeps each
        # placed model's steady instance and gives extras only on devices the steady plan leaves free,
        # and here there are none, so janus runs them one device each, as static does (static 0.693:
        # its even split is the same three devices from t = 0, the controller's first 0.5 s of loading
        # and its re-checks cost the rest). Janus losing to static is the overload case, not the paper's
        # regime (bench/RESULTS.md "sim: one controller").
        "on_time": 779931,
        "ok": 2382,
        "ttft_met": 1634,
        "tpot_met": 2351,
        "token_attainment": 0.6542425088896774,
        "device_hours": 0.07583242563477316,
        "sim_end_s": 91.1983005793643
    },
    "poisson/static": {
        "on_time": 826217,
        "ok": 2357,
        "ttft_met": 1672,
        "tpot_met": 2313,
        "token_attainment": 0.6930693650685799,
        "device_hours": 0.06971938524292084,
        "sim_end_s": 83.66326229150502
    }
}


def _trace(name: str):
    if name == "burst":
        return burst_trace(0), 8
    return poisson_trace(3000, 60.0, {"a": "qwen3-8b", "b": "llama3-8b", "c": "qwen3-1.7b"}, seed=4, max_out=800), 3


@pytest.mark.parametrize("key", sorted(RECORDED))
def test_same_run_as_recorded(key):
    name, policy = key.split("/")
    tr, devices = _trace(name)
    c, s = simulate(tr, resolve(tr.models), devices, policy)
    r = c.outcome()
    got = {"on_time": int(r.on_time.sum()), "ok": int(r.ok.sum()), "ttft_met": int(r.ttft_met.sum()),
           "tpot_met": int(r.tpot_met.sum()), "token_attainment": s["token_attainment"],
           "device_hours": s["device_hours"], "sim_end_s": s["sim_end_s"]}
    want = RECORDED[key]
    assert {k: got[k] for k in ("on_time", "ok", "ttft_met", "tpot_met")} == \
        {k: want[k] for k in ("on_time", "ok", "ttft_met", "tpot_met")}
    for k in ("token_attainment", "device_hours", "sim_end_s"):
        assert got[k] == pytest.approx(want[k], rel=1e-12), k
