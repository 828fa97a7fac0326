"""An elastic P/D model on a real managed daemon (3 cpu devices, the demo tiny model,
Mooncake over loopback TCP): a burst raises its count, the controller splits it into
prefill and decode instances (scaling.py by the measured per-token costs, roles.py) and
brings a Warm instance up in a role its host copy was not made in; every request of the
burst is served (none sent to an instance that is not Active, none failing at its KV
handoff), the split model gives the same greedy text as a mixed instance of the same
checkpoint, and after going Warm on keep-alive a request wakes it as one mixed instance.

"pd"'s configured SLOs are so tight that the roofline prior asks for every device it
has once it has traffic (as in test_controller_burst_daemon.py); its requests carry a
generous SLO of their own. Outputs are long against prompts, so decode is most of the
work: of 3 instances 1 prefills and 2 decode, and device 2 (configured as prefill,
starting Warm) comes up as decode, or, when keep-alive sent the model Warm before the
burst, the instance its first request woke as mixed is reassigned."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np

from daemon_harness import managed_header, server_section, start_daemon, wait_until
from janusd.wire import admin_msgs as am
from test_controller_burst_daemon import _replay, _trace

CONFIG = managed_header(3, warm_after_s=4.0) + """
[[models]]
name = "pd"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
devices = [0, 1, 2]
prefill_devices = [0, 2]
warm_devices = [2]
pool = "elastic"
ttft_slo_ms = 0.01
tpot_slo_ms = 0.001

[[models]]
name = "ref"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
devices = [1]
pool = "steady"
"""

SLO = {"ttft_ms": 20000, "tpot_ms": 5000}


def _instances(d) -> dict[int, tuple[str, str]]:
    return {i["device"]: (i["role"], i["state"]) for i in d.ctl(am.InstancesReq()).data["instances"]
            if i["model"] == "pd"}


def _text(d, model: str, prompt: str, n: int) -> str:
    st, _, out = d.http("POST", "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": n,
                                                    "ignore_eos": True, "temperature": 0.0, "slo": SLO})
    assert st == 200, out
    assert out["usage"]["completion_tokens"] == n
    return out["choices"][0]["text"]


def _transfers(d) -> float:
    st, _, m = d.http("GET", "/metrics")
    line = next((x for x in m.splitlines() if x.startswith('janusd_kv_transfers_total{model="pd",outcome="ok"}')), "")
    return float(line.split()[-1]) if line else 0.0


def test_a_burst_splits_an_elastic_pd_model_into_new_roles_and_it_serves_exact_text(tmp_path):
    d = start_daemon(server_section(Path("@RUN@"), model_wait_timeout_s=30.0) + CONFIG)
    try:
        assert _instances(d) == {0: ("prefill", "active"), 1: ("decode", "active"), 2: ("prefill", "warm")}
        assert wait_until(lambda: any(o["model"] == "pd" and o["source"] == "prior"
                                      for o in d.ctl(am.OracleReq()).data["oracle"]), 60.0, 0.2)
        # 1. a burst: 12 requests within 0.5 s, 12 prompt tokens, 32 output tokens each. The
        # model may have gone Warm meanwhile (keep-alive): then the first request wakes one
        # mixed instance and the split reassigns it; else Warm device 2 comes up as decode
        burst: dict = {}
        t0 = time.monotonic()
        _replay(d, _trace("pd", np.linspace(0.0, 0.5, 12), 32, SLO["ttft_ms"], SLO["tpot_ms"]), tmp_path / "b", burst)
        assert burst["requests"] == 12 and burst["errors"] == 0 and burst["ok_requests"] == 12, burst

        def split() -> bool:
            return sorted(r for r, s in _instances(d).values() if s == "active") == ["decode", "decode", "prefill"]

        # a trickle of requests until the split stands keeps the app's traffic in the
        # window (a loaded machine may take a few ticks) and must be served too
        statuses: list[int] = []
        stop = threading.Event()

        def trickle() -> None:
            while not stop.is_set():
                statuses.append(d.http("POST", "/v1/completions", {"model": "pd", "prompt": "hello there",
                                                                   "max_tokens": 8, "slo": SLO})[0])
                stop.wait(0.3)

        th = threading.Thread(target=trickle)
        th.start()
        try:
            assert wait_until(split, 20.0, 0.05), (_instances(d), d.log_text()[-3000:])
        finally:
            stop.set()
            th.join(30.0)
        assert statuses and set(statuses) == {200}, statuses
        print(f"burst -> 1 prefill + 2 decode instances {time.monotonic() - t0:.2f} s after the burst began")
        plan = d.ctl(am.PlanReq()).data["plan"]
        app = next(a for a in plan["elastic"]["apps"] if a["model"] == "pd")
        assert (app["count"], app["prefill"], app["decode"]) == (3, 1, 2), app
        assert sorted(i["role"] for i in app["instances"]) == ["decode", "decode", "prefill"]
        configured = {0: "prefill", 1: "decode", 2: "prefill"}
        ups = [r for r in plan["recent"] if r["model"] == "pd" and r["target"] == "active"]
        assert ups and all(r["outcome"] == "ok" for r in ups), plan["recent"]
        assert any(r["role"] != configured[r["device"]] for r in ups), ups  # (re)activated in a new role
        st, _, m = d.http("GET", "/metrics")
        def gauge(name: str, label: str) -> list[tuple[str, str]]:  # (label value, sample) of model pd
            return sorted((x.split(f'{label}="')[1].split('"')[0], x.split()[-1]) for x in m.splitlines()
                          if x.startswith(name + "{") and 'model="pd"' in x)

        split_now = dict(gauge("janusd_controller_elastic_instances", "kind"))
        assert (split_now["prefill"], split_now["decode"]) == ("1.0", "2.0"), split_now
        assert [r for r, _ in gauge("janusd_instance_role", "role")] == ["decode", "decode", "prefill"]
        # 2. the split model's greedy text is a mixed instance's, and it went through P/D
        before = _transfers(d)
        for prompt in ("the cat sat on", "a long time ago in a"):
            assert _text(d, "pd", prompt, 24) == _text(d, "ref", prompt, 24)
        assert _transfers(d) >= before + 2
        # 3. idle past warm_after_s: every instance Warm; the next request wakes one mixed instance
        assert wait_until(lambda: {s for _, s in _instances(d).values()} == {"warm"}, 20.0, 0.1), _instances(d)
        assert _text(d, "pd", "once upon a time", 12) == _text(d, "ref", "once upon a time", 12)
        woke = re.findall(r"a request for pd woke its warm instance on device \d as (\w+)", d.log_text())
        assert woke and woke[-1] == "mixed", woke  # (then the fast loop splits it again: traffic in the window)
        st, _, m = d.http("GET", "/metrics")
        assert "no_decode_instance" not in m and 'outcome="failed"' not in m.split("janusd_kv_transfers_total")[-1]
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
