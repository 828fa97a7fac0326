"""The steady placement in a real daemon on cpu devices (control.managed, models without
`devices`). With control.place_at_start off, two small demo models start round-robin on
devices 0 and 1; the slow loop packs their capacity vectors (the oracle's roofline
prior) onto one device and executes the migration: the target comes up by a D2D fork from the live source, and only then
does the source drain (to Cold). Requests to the moving model keep being served (every
one 200: none is routed to an instance that is not Active); a model with `devices`
never moves; `ctl plan` and /metrics show the move. With it on (the default), they start
one device each (nothing has served yet to pack by) and the slow loop packs them the same
way; a model a reload adds is packed beside what serves."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from daemon_harness import server_section, start_daemon, wait_until
from janusd.wire import admin_msgs as am

CONFIG = """
[devices]
count = 3
memory_mib = 64

[oracle]
online = false
state_dir = "@RUN@/state"

[control]
managed = true
window_s = 5.0
slow_period_s = 1.0
fast_period_s = 0.25
pool_devices = [0, 1]
place_at_start = false      # start round robin: the slow loop's migration is what this test is about

[[models]]
name = "a"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
pool = "steady"

[[models]]
name = "b"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 8
pool = "steady"

[[models]]
name = "pinned"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 8
devices = [2]
"""


def _states(d) -> dict[tuple[str, int], str]:
    return {(i["model"], i["device"]): i["state"] for i in d.ctl(am.InstancesReq()).data["instances"]}


def _complete(d, model: str) -> int:
    return d.http("POST", "/v1/completions", {"model": model, "prompt": "the quick brown fox", "max_tokens": 8,
                                              "ignore_eos": True, "slo": {"ttft_ms": 20000, "tpot_ms": 5000}})[0]


def _active(d, model: str) -> list[int]:
    return sorted(dev for (m, dev), s in _states(d).items() if m == model and s == "active")


def test_the_slow_loop_packs_two_models_onto_one_device_make_before_break():
    d = start_daemon(server_section(Path("@RUN@"), model_wait_timeout_s=30.0) + CONFIG)
    statuses: list[int] = []
    stop = threading.Event()

    def client() -> None:  # keeps both managed models busy while they may move
        while not stop.is_set():
            for m in ("a", "b"):
                statuses.append(_complete(d, m))
                # a pause: back to back, one client keeps one device all but 100% busy, and
                # the cpu prior (which counts the engine's host time since [W]) then reads
                # the two models as one device's worth: whether they pack hung on noise
                stop.wait(0.3)

    t = threading.Thread(target=client, daemon=True)
    try:
        t.start()
        assert wait_until(lambda: len(set(_active(d, "a") + _active(d, "b"))) == 1
                          and not d.ctl(am.PlanReq()).data["plan"]["steady"]["running"], 90.0, 0.1), _states(d)
        stop.set()
        t.join(60.0)
        assert statuses and set(statuses) == {200}, statuses
        plan = d.ctl(am.PlanReq()).data["plan"]["steady"]
        moves = [r for r in plan["recent"] if r["kind"] == "migrate"]
        assert len(moves) == 1 and moves[0]["outcome"] == "ok", plan
        mv = moves[0]
        assert (mv["model"], mv["src"]) in (("a", 0), ("b", 1)) and mv["dst"] in (0, 1)  # from round-robin at start
        assert mv["up"]["path"] == "d2d" and mv["up"]["source_device"] == mv["src"], mv
        assert _states(d)[(mv["model"], mv["src"])] == "cold"
        assert plan["bins_used"] == 2 and plan["phi"] is not None  # a and b on one device, pinned on device 2
        assert [x["device"] for x in plan["devices"]] == sorted([mv["dst"], 2])
        assert _active(d, "pinned") == [2]
        # settled: later slow ticks plan no move
        time.sleep(2.5)
        again = d.ctl(am.PlanReq()).data["plan"]["steady"]
        assert [r for r in again["recent"] if r["kind"] == "migrate"] == moves and again["moves"] == []
        text = d.http("GET", "/metrics")[2]
        assert 'janusd_controller_moves_total{kind="migrate",outcome="ok"} 1.0' in text
        assert 'janusd_controller_plan{figure="steady_bins_used"} 2.0' in text
        assert "Traceback" not in d.log_text()
    finally:
        stop.set()
        d.stop()


def test_models_without_devices_start_one_device_each_and_a_reload_packs_beside_what_serves():
    """control.place_at_start (the default): the oracle's prior reads both models before
    they load and, with a free pool device for each, they come up one device each (nothing
    has served: there is no load to pack by; a zero-load packing put every model on one
    device); the slow loop then packs them by what they serve; a third model added by a
    SIGHUP reload is packed beside what serves (server/steady_start.py added_placement),
    not round robin."""
    d = start_daemon(server_section(Path("@RUN@"), model_wait_timeout_s=30.0)
                     + CONFIG.replace("place_at_start = false", "place_at_start = true"))
    try:
        log = d.log_text()  # the slow loop may have packed them already: the start is in the log
        assert "start placement: one device each, 2 model(s) on 2 free device(s)" in log
        assert "a active on device 0 (loaded" in log and "b active on device 1 (loaded" in log, log[-2000:]
        assert _active(d, "pinned") == [2]
        assert [_complete(d, m) for m in ("a", "b", "a", "b")] == [200] * 4
        assert wait_until(lambda: len(set(_active(d, "a") + _active(d, "b"))) == 1
                          and not d.ctl(am.PlanReq()).data["plan"]["steady"]["running"], 90.0, 0.1), _states(d)
        home = _active(d, "a")[0]
        # a model added by a SIGHUP reload is packed beside what serves (round robin: device 2)
        d.config.write_text(d.config.read_text() + '\n[[models]]\nname = "c"\ncheckpoint = "demo:llama-tiny"\n'
                            'kv_cache_mib = 8\npool = "steady"\n')
        d.proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: _active(d, "c") == [home], 60.0, 0.1), (_states(d), d.log_text()[-2000:])
        assert f"start placement: c -> [{home}]" in d.log_text()
        assert _complete(d, "c") == 200 and _active(d, "a") == [home] and _active(d, "b") == [home]
        assert "Traceback" not in d.log_text()
    finally:
        d.stop()
