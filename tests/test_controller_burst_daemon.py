"""A burst on one app, replayed open-loop against a real daemon with demo models on 4 cpu
devices (control.managed): the bursty model gets an elastic replica within 2 s of the
burst's first arrival (measured), every request is served (none routed to an instance
that is not Active), the co-located steady model's per-token attainment during the burst
is compared with a replay of the same steady traffic without the burst (printed; bound
below), and after the burst the bursty model's instances go back to Warm, its next
request waking one.

As in test_controller_daemon.py, the bursty model's configured SLOs are so tight that the
roofline prior asks for every device it has once it has traffic, while its requests carry
a generous SLO of their own: this test is about execution and isolation, the arithmetic
of m* is test_controller.py's."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np

from daemon_harness import managed_header, server_section, start_daemon, wait_until
from janusd.trace.formats import Trace
from janusd.trace.replay import ReplayConfig, replay
from janusd.wire import admin_msgs as am

CONFIG = managed_header(4) + """
[[models]]
name = "hot"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
devices = [0, 1, 2]
warm_devices = [1, 2]
pool = "elastic"
ttft_slo_ms = 0.01
tpot_slo_ms = 0.001

[[models]]
name = "calm"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 8
devices = [1]
pool = "steady"
ttft_slo_ms = 3000.0
tpot_slo_ms = 300.0

[[models]]
name = "other"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 8
devices = [3]
pool = "steady"
"""

CALM_RPS, CALM_S = 2.0, 5.0


def _trace(model: str, arrivals: np.ndarray, out_tokens: int, ttft_ms: float, tpot_ms: float) -> Trace:
    n = len(arrivals)
    return Trace.build(arrivals, [model] * n, [model] * n, np.full(n, 12), np.full(n, out_tokens),
                       np.full(n, ttft_ms), np.full(n, tpot_ms), sort=True)


def _replay(d, trace: Trace, out: Path, result: dict, start_at: float | None = None) -> None:
    """Open loop: each request is sent at its arrival (time 0 = the trace's first arrival,
    at the wall-clock instant `start_at` when given), whatever the answers so far."""
    cfg = ReplayConfig(url=f"http://127.0.0.1:{d.port}", devices_poll_s=0.0, max_lag_ms=500.0, timeout_s=60.0)
    result.update(asyncio.run(replay(trace, cfg, out, start_at=start_at)))


def _states(d) -> dict[tuple[str, int], str]:
    return {(i["model"], i["device"]): i["state"] for i in d.ctl(am.InstancesReq()).data["instances"]}


def test_a_burst_gets_an_elastic_replica_in_2_s_and_leaves_the_colocated_model_alone(tmp_path):
    d = start_daemon(server_section(Path("@RUN@"), model_wait_timeout_s=30.0) + CONFIG)
    try:
        assert wait_until(lambda: any(o["model"] == "hot" and o["source"] == "prior"
                                      for o in d.ctl(am.OracleReq()).data["oracle"]), 60.0, 0.2)
        calm = _trace("calm", np.arange(0.0, CALM_S, 1.0 / CALM_RPS), 16, 3000.0, 300.0)
        # 1. the steady model alone (no burst, so no scaling): its attainment as the reference
        alone: dict = {}
        _replay(d, calm, tmp_path / "alone", alone)
        # 2. the same steady traffic while "hot" bursts: 16 requests within 0.5 s, both
        # replays on one schedule starting at the same instant
        burst = _trace("hot", np.linspace(0.0, 0.5, 16), 16, 20000.0, 5000.0)
        during: dict = {}
        hot: dict = {}
        wall0 = time.time() + 1.0
        burst_at = time.monotonic() + (wall0 - time.time())  # the burst's first arrival, on the monotonic clock
        threads = [threading.Thread(target=_replay, args=(d, calm, tmp_path / "calm", during, wall0)),
                   threading.Thread(target=_replay, args=(d, burst, tmp_path / "hot", hot, wall0))]
        assert sum(s == "active" for (m, _), s in _states(d).items() if m == "hot") <= 1
        for t in threads:
            t.start()
        assert wait_until(lambda: sum(s == "active" for (m, _), s in _states(d).items() if m == "hot") >= 2,
                          15.0, 0.02), _states(d)
        took = time.monotonic() - burst_at
        for t in threads:
            t.join(90.0)
        print(f"burst -> elastic replica active {took:.2f} s after the burst's first arrival; calm token "
              f"attainment alone {alone['token_attainment']:.3f}, during the burst {during['token_attainment']:.3f}")
        assert took < 2.0, took
        assert hot["requests"] == 16 and hot["errors"] == 0 and hot["ok_requests"] == 16, hot
        assert during["errors"] == 0 and during["ok_requests"] == alone["ok_requests"] == len(calm)
        # the co-located steady model keeps its attainment (a 2-core machine: a small margin)
        assert during["token_attainment"] >= alone["token_attainment"] - 0.1, (alone, during)
        plan = d.ctl(am.PlanReq()).data["plan"]
        ups = [r for r in plan["recent"] if r["model"] == "hot" and r["target"] == "active"]
        assert ups and all(r["outcome"] == "ok" for r in ups) and ups[0]["reason"].startswith("scale out")
        assert all(r["model"] == "hot" for r in plan["recent"])  # the steady models were never touched
        # 3. after the burst: idle past warm_after_s, every instance of "hot" goes Warm
        assert wait_until(lambda: {s for (m, _), s in _states(d).items() if m == "hot"} == {"warm"}, 30.0, 0.1), \
            _states(d)
        assert _states(d)[("calm", 1)] == "active" and _states(d)[("other", 3)] == "active"
        status = d.http("POST", "/v1/completions", {"model": "hot", "prompt": "the quick brown fox", "max_tokens": 4,
                                                    "slo": {"ttft_ms": 20000, "tpot_ms": 5000}})[0]
        assert status == 200  # held while it came back, not refused
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
