"""Scale-in on a falling m*, on a real daemon (control.managed, cpu devices, a demo model):
a burst scales the elastic model out to every device it has; once its traffic falls to a
trickle that never stops, the fast loop's m* falls to one and the surplus instances drain
to Warm through the scaling path ("scale in: m*=1 ..."), not through keep-alive (whose
windows here are far longer than the test), once m* stayed below the count for the
2 s hold the test sets (the default's 10 s would only make the test slower). Every request is answered 200, none refused
or routed to an instance that is not Active (such a request would fail), and ctl plan
shows m* going down.

m* must follow the request rate here, which the roofline prior does only when the time a
request takes on the device is a sizeable part of a second: the test's cache dir holds
this machine's cpu peaks (hw/cpu_peaks.py) set to a device 10^4 times slower than it is
(a hardware figure, the one fake of the test), so that one 12-token prompt with 16
output tokens costs the prior about 0.6 s of device time: m* is about rate x 0.9
(PEAK_FLOPS, MEM_BW below; `expected_m` checks that arithmetic in process).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import msgspec

from daemon_harness import managed_header, start_daemon, wait_until
from janusd.hw.cpu_peaks import CACHE_VERSION, machine_identity
from janusd.wire import admin_msgs as am

PEAK_FLOPS, MEM_BW = 1.0e7, 4.0e6  # a cpu some 10^4 times slower than this one (module doc)
BURST_RPS, BURST_S = 3.0, 4.0
TRICKLE_RPS = 0.25

CONFIG = """
[server]
host = "127.0.0.1"
port = 0
admin_socket = "@RUN@/admin.sock"
cache_dir = "@CACHE@"
drain_timeout_s = 10.0
worker_ready_timeout_s = 120.0
model_wait_timeout_s = 30.0
""" + managed_header(3, warm_after_s=600.0, cold_after_s=1200.0) + """
[control.scaling]
scale_in_hold_s = 2.0
debounce_plans = 2

[[models]]
name = "hot"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
devices = [0, 1, 2]
warm_devices = [1, 2]
pool = "elastic"
ttft_slo_ms = 20000.0
tpot_slo_ms = 5000.0
"""


def _slow_cpu_cache(cache: Path) -> None:
    (cache / "hw").mkdir(parents=True, exist_ok=True)
    (cache / "hw" / "cpu-peaks.json").write_text(json.dumps({
        "version": CACHE_VERSION, "machine": machine_identity(),
        "threads": {"1": {"peak_flops": PEAK_FLOPS, "mem_bw": MEM_BW}}}))


def expected_m(cache: Path, rate: float) -> int | None:
    """m* the daemon's prior gives at `rate` for the test's requests (same code, same spec),
    floored as the room floors it by the replicas whose capacity carries the load. One
    trickle request in the 3 s window reads as up to 0.5 req/s (the window's span is 2-3 s,
    telemetry.py): at MEM_BW 2e6 that already needed two devices (a prefill reading the
    weights for about 1 s), so the trickle flapped back out; at 4e6 it fits one."""
    from janusd.engine.loader import open_checkpoint
    from janusd.hw.devices import device_spec
    from janusd.hw.model_spec import ModelSpec
    from janusd.oracle.elasticity import min_instances
    from janusd.oracle.prior import RooflinePrior
    from janusd.oracle.types import LoadFeatures
    from janusd.policy.demand import replicas_to_fit

    ck = open_checkpoint("demo:llama-tiny", cache)
    spec = ModelSpec.from_config(msgspec.to_builtins(ck.arch), dtype="float32")
    prior = RooflinePrior(spec, device_spec("cpu", hbm_bytes=64 * 2**20, cache_dir=cache), 20.0, 5.0)
    z = LoadFeatures(rate, rate * 12, rate * 16, 12.0, 1.0, 16.0, 0.0)
    m = min_instances(prior, z, 0.95, 1.0, 3, "prior").m
    fit, _ = replicas_to_fit("hot", z, prior, 0.0, 64)
    return None if m is None else max(m, 64 if fit is None else fit)



def _states(d) -> dict[int, str]:
    return {i["device"]: i["state"] for i in d.ctl(am.InstancesReq()).data["instances"] if i["model"] == "hot"}


def _send(d, statuses: list[int], lock: threading.Lock) -> None:
    s = d.http("POST", "/v1/completions", {"model": "hot", "prompt": "the quick brown fox", "max_tokens": 16,
                                           "ignore_eos": True, "slo": {"ttft_ms": 20000, "tpot_ms": 5000}})[0]
    with lock:
        statuses.append(s)


def _open_loop(d, rps: float, seconds: float, statuses: list[int], lock: threading.Lock,
               stop: threading.Event | None = None) -> list[threading.Thread]:
    """One request every 1/rps s for `seconds` (or until `stop`), each on its own thread."""
    threads: list[threading.Thread] = []
    t0 = time.monotonic()
    k = 0
    while time.monotonic() - t0 < seconds and not (stop is not None and stop.is_set()):
        t = threading.Thread(target=_send, args=(d, statuses, lock))
        t.start()
        threads.append(t)
        k += 1
        time.sleep(max(0.0, t0 + k / rps - time.monotonic()))
    return threads


def test_a_falling_m_star_drains_the_surplus_instances_to_warm_while_traffic_goes_on(tmp_path):
    cache = tmp_path / "cache"
    _slow_cpu_cache(cache)
    assert expected_m(cache, BURST_RPS) >= 3 and expected_m(cache, 2 * TRICKLE_RPS) == 1
    d = start_daemon(CONFIG.replace("@CACHE@", str(cache)))
    statuses: list[int] = []
    lock = threading.Lock()
    try:
        assert wait_until(lambda: any(o["model"] == "hot" and o["source"] == "prior"
                                      for o in d.ctl(am.OracleReq()).data["oracle"]), 60.0, 0.2)
        assert _states(d) == {0: "active", 1: "warm", 2: "warm"}
        # 1. the burst: every device of "hot" comes up
        threads = _open_loop(d, BURST_RPS, BURST_S, statuses, lock)
        assert wait_until(lambda: list(_states(d).values()) == ["active"] * 3, 15.0, 0.05), _states(d)
        # 2. the trickle, which goes on until the end: m* falls to 1, two instances drain to Warm
        stop = threading.Event()
        trickle: list[threading.Thread] = []
        feeder = threading.Thread(target=lambda: trickle.extend(_open_loop(d, TRICKLE_RPS, 60.0, statuses, lock,
                                                                           stop)))
        burst_end = time.monotonic()
        feeder.start()
        try:
            assert wait_until(lambda: sorted(_states(d).values()) == ["active", "warm", "warm"], 25.0, 0.1), \
                _states(d)
            back = time.monotonic() - burst_end
            plan = d.ctl(am.PlanReq()).data["plan"]
            time.sleep(2.0)  # still one Active instance, still serving the trickle
            assert sorted(_states(d).values()) == ["active", "warm", "warm"], _states(d)
        finally:
            stop.set()
            feeder.join(10.0)
        for t in threads + trickle:
            t.join(60.0)
        ops = [r for r in plan["recent"] if r["model"] == "hot"]
        assert ops and all(r["outcome"] == "ok" and r["reason"].startswith("scale ") for r in ops), plan["recent"]
        # the drains after the burst: those after the last scale-out. During the burst m*
        # may dip to 2 and come back (then device 2 drains and returns): the 3 s window is
        # three 1 s buckets, so just after a bucket boundary it holds the 2 full buckets'
        # 6 arrivals and little more, 6 / 3 s = 2 rps gives m* = 2 (7 gives 3), and when
        # the next arrival comes more than a tick later the debounce's two ticks see it
        last_up = max(i for i, r in enumerate(ops) if r["target"] == "active")
        downs = [r for r in ops[last_up + 1:] if r["target"] == "warm"]
        assert len(downs) == 2 and len(ops) == last_up + 3, plan["recent"]
        # m* falls with the 3 s window's rate: 3 -> 2 -> 1, or 3 -> 1 at once
        assert all(r["reason"].startswith("scale in: m*=") for r in downs) and "m*=1" in downs[-1]["reason"], downs
        assert [a["demand"] for a in plan["elastic"]["apps"] if a["model"] == "hot"] == [1], plan["elastic"]
        assert all(k["residency"] == "active" for k in plan["keepalive"] if k["model"] == "hot")
        print(f"scale-in: back to one Active instance {back:.2f} s after the burst's last request (window "
              f"3 s, debounce 2 ticks of 0.25 s, hold 2 s); drains: "
              + ", ".join(f"device {r['device']} {r['reason'].split(' (')[0]} in {r['seconds']:.3f} s" for r in downs))
        n = len(statuses)
        assert n >= BURST_RPS * BURST_S + 2 and statuses == [200] * n, statuses
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
