"""The controller in a real daemon (control.managed): a burst on an elastic model brings
a Warm replica Active within ~2 s of the burst's start (measured); every request is
served (none routed to a non-Active instance); after the burst the idle model goes Warm
on every device (keep-alive) and its next request wakes it and is served; a steady model
on another device is never touched; `ctl plan` reports the operations and their reasons.

The elastic model's configured SLOs are so tight that the oracle's roofline prior asks for
every device it has as soon as it sees traffic (m* is the fewest instances meeting the
SLO, capped by its devices), while each request carries a generous SLO of its own (the
`slo` extension) so that the dispatcher serves it: this test is about the execution; the
arithmetic of m* is tests/test_controller.py's."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

from daemon_harness import managed_header, server_section, start_daemon, wait_until
from janusd.wire import admin_msgs as am

CONFIG = managed_header(3) + """
[[models]]
name = "hot"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
devices = [0, 1]
warm_devices = [1]
pool = "elastic"
ttft_slo_ms = 0.01
tpot_slo_ms = 0.001

[[models]]
name = "steady"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 8
devices = [2]
pool = "steady"
"""


def _states(d) -> dict[tuple[str, int], str]:
    return {(i["model"], i["device"]): i["state"] for i in d.ctl(am.InstancesReq()).data["instances"]}


def _complete(d, model: str) -> int:
    return d.http("POST", "/v1/completions", {"model": model, "prompt": "the quick brown fox", "max_tokens": 16,
                                              "ignore_eos": True, "slo": {"ttft_ms": 20000, "tpot_ms": 5000}})[0]


def test_a_burst_scales_out_within_two_seconds_and_the_idle_model_goes_warm_then_wakes():
    d = start_daemon(server_section(Path("@RUN@"), model_wait_timeout_s=30.0) + CONFIG)
    try:
        # the oracle's prior for "hot" is read from its checkpoint in a helper process
        assert wait_until(lambda: any(o["model"] == "hot" and o["source"] == "prior"
                                      for o in d.ctl(am.OracleReq()).data["oracle"]), 60.0, 0.2)
        assert _states(d)[("hot", 1)] == "warm"
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            t0 = time.monotonic()
            futs = [pool.submit(_complete, d, "hot") for _ in range(16)]
            assert wait_until(lambda: _states(d)[("hot", 1)] == "active", 10.0, 0.02), _states(d)
            took = time.monotonic() - t0
            statuses = [f.result() for f in futs]
        assert statuses == [200] * 16
        print(f"burst -> second replica active in {took:.2f} s")
        assert took < 2.0, took
        plan = d.ctl(am.PlanReq()).data["plan"]
        ups = [r for r in plan["recent"] if r["model"] == "hot" and r["target"] == "active"]
        assert ups and ups[0]["outcome"] == "ok" and ups[0]["reason"].startswith("scale out: m*=2")
        # the fast tick's demand, read while the burst is still in its window (after the idle
        # spell and the wake below, the last tick's demand depends on how late that tick ran)
        text = d.http("GET", "/metrics")[2]
        assert 'janusd_controller_elastic_instances{kind="demand",model="hot"} 2.0' in text
        # idle: after the window and warm_after_s, every instance of "hot" goes Warm
        assert wait_until(lambda: {s for (m, _), s in _states(d).items() if m == "hot"} == {"warm"}, 30.0, 0.1), \
            _states(d)
        assert _states(d)[("steady", 2)] == "active"  # a steady model is not the keep-alive's
        # the next request wakes it (held, then served)
        assert _complete(d, "hot") == 200
        assert "active" in {s for (m, _), s in _states(d).items() if m == "hot"}
        text = d.http("GET", "/metrics")[2]
        assert 'janusd_controller_ops_total{outcome="ok",target="active"}' in text
        assert 'janusd_controller_elastic_instances{kind="demand",model="hot"}' in text
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
