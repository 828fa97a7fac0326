"""Daemon life cycle with real processes: systemd notify, kill -9 of a worker, SIGHUP
reload, SIGTERM drain. One daemon for the module; the tests run in file order and the
last one stops it."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest

from daemon_harness import (DEMO_MODELS, kill_mid_stream, open_stream, server_section, sse_events, start_daemon,
                            wait_until)
from janusd.wire import admin_msgs as am


class NotifyListener:
    """A bound AF_UNIX datagram socket standing in for systemd's $NOTIFY_SOCKET."""

    def __init__(self) -> None:
        self.path = os.path.join(tempfile.mkdtemp(prefix="jdn-"), "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(4096)
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def saw(self, line: str) -> list[float]:
        return [t for t, m in self.messages if line in m.splitlines()]

    def close(self) -> None:
        self._stop = True
        self.thread.join(2)
        self.sock.close()


@pytest.fixture(scope="module")
def notify():
    n = NotifyListener()
    yield n
    n.close()


@pytest.fixture(scope="module")
def daemon(notify):
    text = server_section(Path("@RUN@")) + "[devices]\ncount = 2\nmemory_mib = 256\n" + DEMO_MODELS
    d = start_daemon(text, env={"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "400000"})
    yield d
    d.stop()


def test_ready_and_watchdog_notifications(daemon, notify):
    assert wait_until(lambda: notify.saw("READY=1"), 5.0)
    assert wait_until(lambda: len(notify.saw("WATCHDOG=1")) >= 2, 3.0), notify.messages
    pings = notify.saw("WATCHDOG=1")
    assert all(0.1 < b - a < 0.6 for a, b in zip(pings, pings[1:])), pings  # every WATCHDOG_USEC / 2


def test_kill9_worker_mid_stream(daemon):
    pids = daemon.worker_pids()
    rest, errors = kill_mid_stream(daemon, "demo-llama", pids[0])
    assert len(errors) == 1, rest[-3:]
    t_err, err = errors[0]
    assert t_err < 1.0, t_err
    assert err["error"]["code"] == "worker_died"
    assert rest[-1][1] == "[DONE]"
    # the other device's model is unaffected, right away
    st, _, out = daemon.http("POST", "/v1/completions", {"model": "demo-qwen2", "prompt": "hi", "max_tokens": 5, "ignore_eos": True})
    assert st == 200 and out["usage"]["completion_tokens"] == 5
    # the worker comes back with a new pid and its model is served again
    def back():
        s = daemon.ctl(am.StatusReq()).data["workers"][0]
        inst = daemon.ctl(am.InstancesReq()).data["instances"]
        ok = s["state"] == "ready" and s["pid"] != pids[0] and s["restarts"] == 1
        return ok and all(i["state"] == "active" for i in inst)

    assert wait_until(back, 20.0, 0.2), daemon.log_text()
    st, _, out = daemon.http("POST", "/v1/completions", {"model": "demo-llama", "prompt": "hi", "max_tokens": 4, "ignore_eos": True})
    assert st == 200 and out["usage"]["completion_tokens"] == 4
    st, _, m = daemon.http("GET", "/metrics")
    assert 'janusd_worker_restarts_total{device="0"} 1.0' in m
    assert 'janusd_requests_total{model="demo-llama",outcome="failed"} 1.0' in m


def test_kill9_worker_during_a_non_streaming_request_gives_503(daemon):
    pids = daemon.worker_pids()
    result = {}

    def call():
        result["r"] = daemon.http("POST", "/v1/completions", {"model": "demo-llama", "prompt": "once upon a time",
                                                              "max_tokens": 1500, "ignore_eos": True})
        result["t"] = time.monotonic()

    th = threading.Thread(target=call)
    th.start()
    busy = lambda: daemon.ctl(am.PoolsReq()).data["pools"][0]["engine_requests"] == 1  # noqa: E731
    assert wait_until(busy, 10.0), daemon.ctl(am.PoolsReq()).data
    t_kill = time.monotonic()
    os.kill(pids[0], signal.SIGKILL)
    th.join(10)
    st, _, out = result["r"]
    assert st == 503 and out["error"]["code"] == "worker_died", out
    assert result["t"] - t_kill < 1.0, result["t"] - t_kill

    def back():
        s = daemon.ctl(am.StatusReq()).data["workers"][0]
        inst = daemon.ctl(am.InstancesReq()).data["instances"]
        return s["state"] == "ready" and s["restarts"] == 2 and all(i["state"] == "active" for i in inst)

    assert wait_until(back, 20.0, 0.2), daemon.log_text()
    st, _, out = daemon.http("POST", "/v1/completions", {"model": "demo-llama", "prompt": "hi", "max_tokens": 3, "ignore_eos": True})
    assert st == 200 and out["usage"]["completion_tokens"] == 3


def test_sighup_with_a_broken_config_keeps_serving(daemon):
    good = daemon.config.read_text()
    daemon.config.write_text(good + "\n[[models]]\nname = 'x'\ncheckpoint = 'demo:llama-tiny'\ntp = 0\n")
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "reload refused" in daemon.log_text(), 5.0)
    assert "models[2].tp" in daemon.log_text()
    daemon.config.write_text(good)
    st, _, out = daemon.http("GET", "/v1/models")
    assert {m["id"] for m in out["data"]} == {"demo-llama", "demo-qwen2"}


def test_sighup_applies_model_additions_and_removals(daemon):
    text = daemon.config.read_text()
    text = text.replace('name = "demo-qwen2"', 'name = "demo-added"')
    daemon.config.write_text(text)
    daemon.proc.send_signal(signal.SIGHUP)

    def models():
        st, _, out = daemon.http("GET", "/v1/models")
        names = {m["id"]: m["active_instances"] for m in out["data"]}
        return names if names == {"demo-llama": 1, "demo-added": 1} else None

    assert wait_until(models, 20.0, 0.1), daemon.http("GET", "/v1/models")
    assert daemon.http("POST", "/v1/completions", {"model": "demo-qwen2", "prompt": "hi"})[0] == 404
    st, _, out = daemon.http("POST", "/v1/completions", {"model": "demo-added", "prompt": "hi", "max_tokens": 2, "ignore_eos": True})
    assert st == 200 and out["usage"]["completion_tokens"] == 2
    assert daemon.ctl(am.PoolsReq()).data["pools"][1]["models"] == ["demo-added"]


def test_sighup_changing_only_slos_applies_them_without_a_reload(daemon):
    text = daemon.config.read_text()
    head, tail = text.split('name = "demo-llama"', 1)
    tail = tail.replace("ttft_slo_ms = 1000.0", "ttft_slo_ms = 750.0", 1).replace("tpot_slo_ms = 100.0",
                                                                                   "tpot_slo_ms = 80.0", 1)
    daemon.config.write_text(head + 'name = "demo-llama"' + tail)
    loads_before = daemon.log_text().count("demo-llama active on device")
    daemon.proc.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "new SLOs ['demo-llama']" in daemon.log_text(), 10.0), daemon.log_text()[-2000:]
    models = {m["name"]: m for m in daemon.ctl(am.ModelsReq()).data["models"]}
    assert (models["demo-llama"]["ttft_slo_ms"], models["demo-llama"]["tpot_slo_ms"]) == (750.0, 80.0)
    assert models["demo-llama"]["active"] == 1
    assert daemon.log_text().count("demo-llama active on device") == loads_before  # not reloaded
    st, _, out = daemon.http("POST", "/v1/completions", {"model": "demo-llama", "prompt": "hi", "max_tokens": 2,
                                                         "ignore_eos": True})
    assert st == 200 and out["usage"]["completion_tokens"] == 2


def test_sigterm_drains_in_flight_and_exits_zero(daemon, notify):
    pids = daemon.worker_pids()
    conn, resp = open_stream(daemon, "demo-llama", 1500)
    events = sse_events(resp)
    next(events)
    daemon.proc.send_signal(signal.SIGTERM)
    assert wait_until(lambda: notify.saw("STOPPING=1"), 3.0)
    st, _, out = daemon.http("POST", "/v1/completions", {"model": "demo-added", "prompt": "hi", "max_tokens": 2, "ignore_eos": True})
    assert st == 503 and out["error"]["code"] == "shutting_down"
    st, _, h = daemon.http("GET", "/health")
    assert st == 503 and h["status"] == "draining"
    rest = list(events)
    conn.close()
    assert rest[-1][1] == "[DONE]"
    usage = rest[-2][1]["usage"]
    assert usage["completion_tokens"] == 1500, rest[-3:]  # the in-flight request finished in full
    assert rest[-3][1]["choices"][0]["finish_reason"] == "length"
    assert daemon.proc.wait(20) == 0
    assert not os.path.exists(daemon.admin_socket)
    for pid in pids.values():
        assert wait_until(lambda: not _alive(pid), 5.0), f"worker {pid} outlived the daemon"
    assert "Traceback" not in daemon.log_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except OSError:
        return False
