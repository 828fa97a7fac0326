"""Loading a model onto a device does not stall the models already serving there: the
worker builds the new model on a loader thread and registers it between steps."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from daemon_harness import server_section, start_daemon
from janusd.wire import admin_msgs as am

# host_image off: the load converts the checkpoint (seconds), as a first start does; with an
# image in the shared cache it would read that instead, too fast to show a stall
CONFIG = """
[devices]
count = 1
memory_mib = 1024

[lifecycle]
host_image = false

[[models]]
name = "demo-llama"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 32
devices = [0]
"""


def test_loading_smollm2_does_not_stall_a_model_serving_on_the_same_device():
    d = start_daemon(server_section(Path("@RUN@")) + CONFIG)
    try:
        body = {"model": "demo-llama", "prompt": "once upon a time", "max_tokens": 4, "temperature": 0,
                "ignore_eos": True}
        assert d.http("POST", "/v1/completions", body)[0] == 200
        latencies: list[tuple[float, float, int]] = []  # (start, end, status)
        stop = threading.Event()

        def client() -> None:
            while not stop.is_set():
                t0 = time.monotonic()
                status = d.http("POST", "/v1/completions", body)[0]
                latencies.append((t0, time.monotonic(), status))

        th = threading.Thread(target=client)
        th.start()
        time.sleep(0.3)
        t_load = time.monotonic()
        r = d.ctl(am.LoadReq("smol", "builtin:smollm2-135m-instruct", [0]))
        t_loaded = time.monotonic()
        time.sleep(0.2)
        stop.set()
        th.join(30)
        assert isinstance(r, am.AdminResult), r
        load_s = t_loaded - t_load
        assert load_s > 1.5, f"SmolLM2 loaded in {load_s:.2f} s: too fast to show a stall"
        during = [(b - a, s) for a, b, s in latencies if b > t_load and a < t_loaded]
        assert len(during) >= 3, during  # requests kept completing while the load ran
        assert all(s == 200 for _, s in during)
        worst = max(x for x, _ in during)
        assert worst < min(1.0, load_s / 2), f"a request took {worst:.2f} s during a {load_s:.2f} s load"
        # and the new model serves
        smol = {**body, "model": "smol"}
        assert d.http("POST", "/v1/completions", smol)[0] == 200
    finally:
        assert d.stop() == 0, d.log_text()
