"""The controller with a tensor-parallel model in a real daemon ([P]; control.managed, short
ticks): an elastic tp 2 model without `devices` on four cpu devices starts on the free
aligned group 0-1 (server/steady_start.py); under load (m* above one, by the tight
configured SLO, as test_controller_extras_daemon.py) the fast loop scales it out onto the
whole free group 2-3 by a D2D fork from the live group, shard by shard (server/tp_fork.py),
and every request is served, token for token as before the scale-out; idle, it rests
whole groups (keep-alive: every shard's host copy on its own worker, no shard left in a
pool); a request then wakes a group."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from daemon_harness import managed_header, server_section, start_daemon, wait_until
from janusd.wire import admin_msgs as am

CONFIG = managed_header(4) + """
[[models]]
name = "e"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
tp = 2
pool = "elastic"
ttft_slo_ms = 0.01
tpot_slo_ms = 0.001
"""
BODY = {"model": "e", "prompt": "the quick brown fox", "max_tokens": 8, "temperature": 0, "ignore_eos": True,
        "slo": {"ttft_ms": 20000, "tpot_ms": 5000}}


def _states(d) -> dict[tuple[str, int], str]:
    return {(i["model"], i["device"]): i["state"] for i in d.ctl(am.InstancesReq()).data["instances"]}


def _complete(d) -> tuple[int, str]:
    st, _, out = d.http("POST", "/v1/completions", BODY)
    return st, out["choices"][0]["text"] if st == 200 else str(out)


def _pool(d, device: int) -> dict:
    return next(p for p in d.ctl(am.PoolsReq()).data["pools"] if p["device"] == device)


def test_an_elastic_tp2_model_scales_out_onto_a_free_group_by_fork_and_rests_whole_groups():
    d = start_daemon(server_section(Path("@RUN@"), model_wait_timeout_s=30.0) + CONFIG)
    try:
        assert wait_until(lambda: _states(d).get(("e", 0)) in ("active", "warm"), 60.0, 0.1), _states(d)
        assert set(_states(d)) == {("e", 0)}  # one instance, led by 0: the group 0-1
        assert wait_until(lambda: any(o["model"] == "e" and o["source"] == "prior"
                                      for o in d.ctl(am.OracleReq()).data["oracle"]), 60.0, 0.2)
        st, ref = _complete(d)  # (keep-alive may have sent it Warm already: this wakes it)
        assert st == 200 and ref
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futs = [pool.submit(_complete, d) for _ in range(24)]
            assert wait_until(lambda: _states(d).get(("e", 2)) == "active", 20.0, 0.02), _states(d)
            answers = [f.result() for f in futs]
        assert answers == [(200, ref)] * 24
        ups = [e for e in d.ctl(am.EventsReq()).data["events"] if e["model"] == "e" and e["device"] == 2
               and e["target"] == "active"]
        assert ups and ups[0]["source"] == 0 and ups[0]["outcome"] == "ok", ups  # forked from the group 0-1
        metrics = d.http("GET", "/metrics")[2]  # both shards pulled over Mooncake: no fallback
        assert 'janusd_lifecycle_ops_total{model="e",op="fork",outcome="ok"} 1.0' in metrics
        assert 'op="fork",outcome="fallback"' not in metrics
        assert "e" in (_pool(d, 3).get("models") or [])  # the new group's follower shard, on device 3
        assert not {dev for (m, dev) in _states(d) if m == "e"} - {0, 2}  # only aligned leads
        # idle: keep-alive rests whole groups (each shard's host copy on its worker, no shard in a pool)
        assert wait_until(lambda: {s for (m, _), s in _states(d).items() if m == "e"} == {"warm"}, 30.0, 0.1), \
            _states(d)
        for dev in range(4):
            p = _pool(d, dev)
            assert not p.get("models") and "e" in p.get("host_copies", {}), (dev, p)
        assert _complete(d) == (200, ref)  # a request wakes a group
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
