"""Keep-alive in the simulator (the control room's, policy/keepalive.residency) sends an idle
model Warm, then Cold; a request wakes it (control/wake.py), restored in the time its bytes take on the modelled path."""

from __future__ import annotations

import numpy as np
import pytest

from janusd.config import DispatchConfig
from janusd.hw import device_spec
from janusd.lifecycle.restore_path import Bandwidths
from janusd.policy import keepalive as policy_keepalive
from janusd.policy.policy_config import ControllerConfig, KeepAliveConfig
from janusd.control import room as control_room
from janusd.sim.cluster import Cluster
from janusd.sim.served import served_models
from janusd.sim.control_shell import Periods
from janusd.sim.control_shell import SimControl as Controller
from janusd.sim.perfmodel import PerfModel
from janusd.sim.specs import resolve
from janusd.trace.formats import Trace

QUIET_AT = (80.0, 170.0)  # the idle app's late requests: Warm by 80 s, Cold by 170 s


def trace() -> Trace:
    """`busy` at 1 req/s for 200 s; `idle`: 5 requests in the first 10 s, then one at
    80 s and one at 170 s."""
    busy = np.arange(0.5, 200.0, 1.0)
    idle = np.array([1.0, 3.0, 5.0, 7.0, 9.0, *QUIET_AT])
    t = np.concatenate([busy, idle])
    apps = ["busy"] * len(busy) + ["idle"] * len(idle)
    order = np.argsort(t, kind="stable")
    n = len(t)
    return Trace.build(t[order], [apps[i] for i in order], ["qwen3-1.7b"] * n, np.full(n, 200), np.full(n, 20))


def run(warm_after_s: float, cold_after_s: float, mode: str = "janus"):
    tr = trace()
    served, req_model = served_models(tr, resolve(tr.models))
    perf = PerfModel(device_spec("ascend-910c-die"))
    cluster = Cluster(tr, served, req_model, perf, 4, DispatchConfig(), keep_times=True)
    cfg = ControllerConfig(keepalive=KeepAliveConfig(warm_after_s=warm_after_s, cold_after_s=cold_after_s))
    ctl = Controller(cluster, served, mode, cfg)
    ctl.start()
    cluster.run()
    return tr, cluster, ctl


@pytest.fixture(scope="module")
def runs():
    return {"keep": run(20.0, 60.0), "never": run(1e5, 2e5), "keep_elastic": run(20.0, 60.0, "elastic-only"),
            "never_elastic": run(1e5, 2e5, "elastic-only")}


def test_the_simulator_asks_the_daemons_policy():
    assert control_room.residency is policy_keepalive.residency


def test_an_idle_model_rests_and_a_request_restores_it(runs):
    tr, cluster, ctl = runs["keep"]
    r = cluster.outcome()
    assert all(s == "ok" for s in r.status)  # held while restored, never refused
    # slow ticks every 30 s; an Active model's idle time counts from no earlier than when
    # it was first seen Active (30 s): Warm at 60 s, woken at 80 s, Warm at 120 s, Cold at
    # 150 s, woken at 170 s, Warm at 210 s (the last tick, after the trace's end)
    assert ctl.counts["rested"] == 3 and ctl.counts["woken"] == 2
    late = [int(np.flatnonzero((tr.arrival_s == t) & (tr.app_id == tr.apps.index("idle")))[0]) for t in QUIET_AT]
    ttft = [r.token_times[i][0] for i in late]
    arch = cluster.served["idle"].arch
    nbytes = arch.weight_bytes / arch.tp
    dev = cluster.perf.device
    bw = Bandwidths(memcpy=dev.h2d_bw, measured={"d2d": dev.d2d_bw, "h2d": dev.h2d_bw})
    warm_s = Periods().control_overhead_s + bw.estimate_s("h2d", int(nbytes))
    cold_s = Periods().control_overhead_s + bw.estimate_s("checkpoint", int(nbytes))
    assert cold_s > warm_s + 0.5
    assert warm_s <= ttft[0] < warm_s + 0.2  # the restore, then one prefill
    assert cold_s <= ttft[1] < cold_s + 0.2
    # the busy app never rested: its requests never waited for a restore
    busy = np.flatnonzero(tr.app_id == tr.apps.index("busy"))
    assert max(r.token_times[int(i)][0] for i in busy) < 0.2


def test_resting_frees_the_device(runs):
    """janus starts the two small apps one device each and the first slow tick (30 s) packs
    them onto one (a fork, then the source drains: 2 -> 3 -> 2 instances); from then on
    resting `idle` frees its weights there and wakes it in place (device-hours equal)."""
    keep, never = runs["keep"][1], runs["never"][1]
    insts = {t: k for t, _, k in keep.device_series}
    assert insts[60.0] == 1 and insts[80.0] == 2 and insts[120.0] == 1  # `idle` rests from 60 s, back at 80 s
    assert [k for _, _, k in never.device_series] == [2, 3, 2] and runs["never"][2].counts["rested"] == 0
    assert [d for _, d, _ in never.device_series] == [2, 2, 1]  # packed onto one device at 30 s
    assert keep.device_hours == pytest.approx(never.device_hours)
    # elastic-only pins every app elastic: each is isolated on a device of its own (the one it
    # started on, alone there, counts as its own), so resting `idle` frees that device over
    # [60, 80) and [120, 170) s: 70 s (a restore holds its device from its first byte)
    ke, ne = runs["keep_elastic"][1], runs["never_elastic"][1]
    assert ne.device_hours - ke.device_hours == pytest.approx(70 / 3600)
    assert runs["keep_elastic"][2].counts["rested"] == 3 and runs["keep_elastic"][2].counts["woken"] == 2
    for _, c, _ in runs.values():
        assert all(s == "ok" for s in c.outcome().status)
