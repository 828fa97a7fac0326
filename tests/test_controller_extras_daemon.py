"""A model without `devices` in the elastic pool, in a real daemon on cpu devices: it is
isolated (PAPER.md §2): under load (m* above one, by the tight configured SLO: see
test_controller_daemon.py) the fast loop forks a replica of its own onto the device the
steady pool leaves free (D2D from the live instance); the instance it started with,
alone on its device, counts as one of its own (nothing to hand over); every request is
served; idle, keep-alive sends every instance Warm."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from daemon_harness import managed_header, server_section, start_daemon, wait_until
from janusd.wire import admin_msgs as am

CONFIG = managed_header(2) + """
[[models]]
name = "e"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
pool = "elastic"
ttft_slo_ms = 0.01
tpot_slo_ms = 0.001
"""


def _states(d) -> dict[tuple[str, int], str]:
    return {(i["model"], i["device"]): i["state"] for i in d.ctl(am.InstancesReq()).data["instances"]}


def _complete(d) -> int:
    return d.http("POST", "/v1/completions", {"model": "e", "prompt": "the quick brown fox", "max_tokens": 8,
                                              "ignore_eos": True, "slo": {"ttft_ms": 20000, "tpot_ms": 5000}})[0]


def test_an_elastic_model_without_devices_forks_a_replica_of_its_own_onto_a_free_device():
    d = start_daemon(server_section(Path("@RUN@"), model_wait_timeout_s=30.0) + CONFIG)
    try:
        assert wait_until(lambda: any(o["model"] == "e" and o["source"] == "prior"
                                      for o in d.ctl(am.OracleReq()).data["oracle"]), 60.0, 0.2)
        # (idle since the start, keep-alive may have sent it Warm already: the load wakes it)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futs = [pool.submit(_complete, d) for _ in range(24)]
            assert wait_until(lambda: _states(d).get(("e", 1)) == "active", 15.0, 0.02), _states(d)
            statuses = [f.result() for f in futs]
        assert statuses == [200] * 24
        plan = d.ctl(am.PlanReq()).data["plan"]
        ups = [r for r in plan["recent"] if r["model"] == "e" and r["target"] == "active" and r["device"] == 1]
        assert ups and ups[0]["outcome"] == "ok" and "own replicas" in ups[0]["reason"], plan["recent"]
        assert not [r for r in plan["steady"]["recent"] if r["model"] == "e"]  # the placement never moved it

        assert not [r for r in plan["recent"] if r["model"] == "e" and "handed over" in r["reason"]]
        assert wait_until(lambda: {s for (m, _), s in _states(d).items() if m == "e"} == {"warm"}, 30.0, 0.1), \
            _states(d)
        assert _complete(d) == 200
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
