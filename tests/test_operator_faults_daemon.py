"""Operator faults on a real daemon ([U]): held requests never wait out a timeout for
something that has already happened (a model removed by a SIGHUP reload ends the
requests waiting for it at once with 404, as a new request for it gets; it used to leave
them waiting the full model_wait_timeout_s for a 503), and `ctl state` refuses a device a
pinned model has no instance on, and an activation a worker's death interrupted ends
Active once the worker is back, its held requests served (it used to stay Cold, the
requests waiting 30 s for a 503)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from daemon_harness import DEMO_MODELS, server_section, start_daemon, wait_until
from janusd.wire import admin_msgs as am


@pytest.fixture(scope="module")
def daemon():
    text = server_section(Path("@RUN@")) + "[devices]\ncount = 2\nmemory_mib = 256\n" + DEMO_MODELS
    d = start_daemon(text)
    yield d
    d.stop()


def test_an_activation_a_worker_death_interrupted_ends_active_when_the_worker_is_back(daemon):
    r = daemon.ctl(am.StateReq("demo-qwen2", 1, "cold"))
    assert isinstance(r, am.AdminResult), r
    pid = daemon.worker_pids()[1]
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: daemon.ctl(am.StatusReq()).data["workers"][1]["state"] != "ready", 5.0, 0.02)
    r = daemon.ctl(am.StateReq("demo-qwen2", 1, "active"))  # while the worker is away
    assert isinstance(r, am.AdminError) and "becomes active when the worker is back" in r.message, r
    results: list[int] = []
    held = threading.Thread(target=lambda: results.append(daemon.http(
        "POST", "/v1/completions", {"model": "demo-qwen2", "prompt": "hi", "max_tokens": 2, "ignore_eos": True})[0]))
    t0 = time.monotonic()
    held.start()

    def active() -> bool:
        insts = daemon.ctl(am.InstancesReq()).data["instances"]
        return any(i["model"] == "demo-qwen2" and i["state"] == "active" for i in insts)

    assert wait_until(active, 25.0, 0.1), daemon.log_text()[-3000:]
    held.join(25.0)
    assert results == [200] and time.monotonic() - t0 < 25.0, (results, daemon.log_text()[-2000:])
    assert daemon.ctl(am.StatusReq()).data["workers"][1]["pid"] != pid


def test_a_reload_that_removes_a_model_ends_its_held_requests_at_once(daemon):
    r = daemon.ctl(am.UnloadReq("demo-qwen2"))
    assert isinstance(r, am.AdminResult) and r.data["unloaded"] == "demo-qwen2"
    states = {i["state"] for i in daemon.ctl(am.InstancesReq()).data["instances"] if i["model"] == "demo-qwen2"}
    assert states == {"unloaded"}
    results: list[tuple[int, float]] = []

    def ask() -> None:
        t0 = time.monotonic()
        st, _, _ = daemon.http("POST", "/v1/completions", {"model": "demo-qwen2", "prompt": "hi", "max_tokens": 2})
        results.append((st, time.monotonic() - t0))

    waiting = [threading.Thread(target=ask) for _ in range(3)]
    for t in waiting:
        t.start()
    time.sleep(1.0)  # they wait: the model is unloaded, nothing wakes it
    assert results == []
    text = daemon.config.read_text()
    head, qwen = text.split('[[models]]\nname = "demo-qwen2"', 1)
    daemon.config.write_text(head + qwen.split("\n\n", 1)[1] if "\n\n" in qwen else head)  # removed, nothing added
    t_reload = time.monotonic()
    daemon.proc.send_signal(signal.SIGHUP)
    for t in waiting:
        t.join(30.0)
    took = time.monotonic() - t_reload
    assert [st for st, _ in results] == [404, 404, 404], results
    assert took < 10.0, (took, results)  # the reload itself, not the 30 s wait
    assert daemon.http("POST", "/v1/completions", {"model": "demo-qwen2", "prompt": "hi"})[0] == 404
    assert {m["name"] for m in daemon.ctl(am.ModelsReq()).data["models"]} == {"demo-llama"}


def test_ctl_state_refuses_a_device_a_pinned_model_has_no_instance_on(daemon):
    """`ctl state demo-llama warm --device 1` for a model configured on device 0 is refused
    by name (it used to be accepted and make a host copy there)."""
    r = daemon.ctl(am.StateReq("demo-llama", 1, "warm"))
    assert isinstance(r, am.AdminError) and "configured on devices [0], not 1" in r.message and "ctl fork" in r.message
    insts = {i["device"]: i["state"] for i in daemon.ctl(am.InstancesReq()).data["instances"]
             if i["model"] == "demo-llama"}
    assert insts == {0: "active"}  # nothing made, nothing moved
