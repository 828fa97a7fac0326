"""Worker liveness with real processes: a SIGSTOPped worker is found by the heartbeat,
its requests end with worker_hung, it is killed and restarted while the other device
serves on; a worker that keeps dying uses up its restart budget and its device is marked
failed instead of being restarted for ever."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from daemon_harness import DEMO_MODELS, open_stream, server_section, sse_events, start_daemon, wait_until
from janusd.wire import admin_msgs as am


def _metric(d, name: str) -> float:
    _, _, text = d.http("GET", "/metrics")
    found = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")]
    return found[0] if found else 0.0


def test_a_stopped_worker_is_declared_hung_killed_and_restarted():
    cfg = server_section(Path("@RUN@"), worker_heartbeat_s=0.2, worker_heartbeat_timeout_s=1.0) + DEMO_MODELS
    d = start_daemon(cfg)
    stopped = None
    try:
        pids = d.worker_pids()
        conn, resp = open_stream(d, "demo-llama", 1500)
        events = sse_events(resp)
        next(events)
        stopped = pids[0]
        t_stop = time.monotonic()
        os.kill(stopped, signal.SIGSTOP)
        rest = list(events)
        conn.close()
        errors = [(t, e) for t, e in rest if isinstance(e, dict) and "error" in e]
        assert len(errors) == 1, rest[-3:]
        t_err, err = errors[0]
        assert err["error"]["code"] == "worker_hung"
        assert t_err - t_stop < 3.0, t_err - t_stop  # heartbeat 0.2 s + timeout 1 s, plus slack
        # the other device serves on, untouched
        st, _, out = d.http("POST", "/v1/completions", {"model": "demo-qwen2", "prompt": "hi", "max_tokens": 3,
                                                         "ignore_eos": True})
        assert st == 200 and out["usage"]["completion_tokens"] == 3
        assert _metric(d, 'janusd_worker_hangs_total{device="0"}') == 1.0
        assert "is hung: no heartbeat answer" in d.log_text()

        def back():
            w = d.ctl(am.StatusReq()).data["workers"][0]
            return w["state"] == "ready" and w["pid"] != stopped

        assert wait_until(back, 30.0, 0.2), d.log_text()[-3000:]
        assert wait_until(lambda: not os.path.exists(f"/proc/{stopped}"), 5.0)  # killed and reaped
        assert wait_until(lambda: d.http("GET", "/health")[2]["status"] == "ok", 20.0, 0.2)
        st, _, out = d.http("POST", "/v1/completions", {"model": "demo-llama", "prompt": "hi", "max_tokens": 2,
                                                         "ignore_eos": True})
        assert st == 200
    finally:
        if stopped is not None:
            try:
                os.kill(stopped, signal.SIGCONT)
            except ProcessLookupError:
                pass
        d.stop()


def test_a_crash_looping_worker_marks_its_device_failed():
    cfg = server_section(Path("@RUN@"), worker_restart_budget=2, worker_restart_window_s=120.0) + DEMO_MODELS
    d = start_daemon(cfg)
    try:
        killed = 0
        for _ in range(3):  # the third death is past the budget of 2
            pid = d.worker_pids()[0]
            os.kill(pid, signal.SIGKILL)
            killed += 1
            if killed < 3:
                assert wait_until(lambda: d.ctl(am.StatusReq()).data["workers"][0]["state"] == "ready"
                                  and d.worker_pids()[0] != pid, 30.0, 0.1), d.log_text()[-2000:]
        assert wait_until(lambda: d.ctl(am.StatusReq()).data["workers"][0]["state"] == "failed", 10.0, 0.1)
        h = d.http("GET", "/health")[2]
        assert h["status"] == "degraded" and h["degraded_devices"] == {"0": "failed"}
        assert _metric(d, 'janusd_device_failed{device="0"}') == 1.0
        assert "device 0 failed" in d.log_text()
        time.sleep(1.0)  # no more restarts are attempted
        assert d.ctl(am.StatusReq()).data["workers"][0]["restarts"] == 2
        inst = {i["model"]: i["state"] for i in d.ctl(am.InstancesReq()).data["instances"]}
        assert inst == {"demo-llama": "unloaded", "demo-qwen2": "active"}
        st, _, out = d.http("POST", "/v1/completions", {"model": "demo-qwen2", "prompt": "hi", "max_tokens": 2})
        assert st == 200
    finally:
        d.stop()
