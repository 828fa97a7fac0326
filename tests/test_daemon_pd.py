"""P/D disaggregation through the real daemon: a model prefilled on one worker and
decoded on another, its KV read over Mooncake (loopback TCP) by base + offset.

Device 0 prefills "pd" and also serves "ref", the same checkpoint as one mixed instance:
a request split across two processes must produce exactly the tokens it produces in one
engine (greedy and seeded sampling alike). Devices 1 and 2 decode "pd"; handoffs go to
the decode instance with the least decode backlog, every path that ends a request frees
the prefill side's blocks, and a decode worker's kill -9 fails only its own requests.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from daemon_harness import open_stream, server_section, sse_events, start_daemon, wait_until
from janusd.wire import admin_msgs as am

CONFIG = """
[devices]
count = 3
memory_mib = 256

[[models]]
name = "pd"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 32
devices = [0, 1, 2]
prefill_devices = [0]

[[models]]
name = "ref"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 32
devices = [0]
"""


@pytest.fixture(scope="module")
def daemon():
    d = start_daemon(server_section(Path("@RUN@")) + CONFIG)
    yield d
    d.stop()


def _complete(d, model: str, **body):
    st, _, out = d.http("POST", "/v1/completions", {"model": model, **body})
    assert st == 200, out
    return out


def _instances(d) -> dict[tuple[str, int], dict]:
    rows = d.ctl(am.InstancesReq()).data["instances"]
    return {(r["model"], r["device"]): r for r in rows}


def _engine_requests(d) -> list[int]:
    return [p.get("engine_requests", -1) for p in d.ctl(am.PoolsReq()).data["pools"]]


def test_roles_are_placed_as_configured(daemon):
    inst = _instances(daemon)
    assert {k: (v["role"], v["state"]) for k, v in inst.items()} == {
        ("pd", 0): ("prefill", "active"), ("pd", 1): ("decode", "active"), ("pd", 2): ("decode", "active"),
        ("ref", 0): ("mixed", "active"),
    }


@pytest.mark.parametrize("sampling", [
    {"temperature": 0.0},
    {"temperature": 0.9, "top_p": 0.9, "seed": 1234},
])  # fmt: skip
def test_a_split_request_yields_exactly_the_tokens_of_one_engine(daemon, sampling):
    for prompt, n in (("the cat sat on", 24), ("a long time ago in a", 40)):
        pd = _complete(daemon, "pd", prompt=prompt, max_tokens=n, ignore_eos=True, **sampling)
        ref = _complete(daemon, "ref", prompt=prompt, max_tokens=n, ignore_eos=True, **sampling)
        assert pd["choices"][0]["text"] == ref["choices"][0]["text"]
        assert pd["usage"] == ref["usage"] and pd["usage"]["completion_tokens"] == n
    st, _, m = daemon.http("GET", "/metrics")
    assert 'janusd_kv_transfers_total{model="pd",outcome="ok"}' in m
    assert wait_until(lambda: _engine_requests(daemon) == [0, 0, 0], 5.0), _engine_requests(daemon)


def test_handoffs_go_to_the_decode_instance_with_the_least_backlog(daemon):
    streams = []
    for i in range(4):
        conn, resp = open_stream(daemon, "pd", 1200, prompt=f"story number {i}")
        ev = sse_events(resp)
        next(ev)  # first token: the prefill is done, the handoff under way
        streams.append((conn, ev))

        def handed(k=i + 1):
            inst = _instances(daemon)
            return inst[("pd", 1)]["decoding"] + inst[("pd", 2)]["decoding"] == k

        assert wait_until(handed, 10.0), _instances(daemon)
    inst = _instances(daemon)
    assert (inst[("pd", 1)]["decoding"], inst[("pd", 2)]["decoding"]) == (2, 2)
    # the prefill worker holds nothing once its KV has moved
    assert wait_until(lambda: _engine_requests(daemon)[0] == 0, 5.0), _engine_requests(daemon)
    for conn, ev in streams:
        rest = list(ev)
        conn.close()
        assert rest[-1][1] == "[DONE]" and not any(isinstance(e, dict) and "error" in e for _, e in rest)
        assert sum(len(e["choices"][0]["text"]) > 0 for _, e in rest if isinstance(e, dict) and e.get("choices")) > 100
    inst = _instances(daemon)
    assert inst[("pd", 1)]["decoding"] == inst[("pd", 2)]["decoding"] == 0
    assert wait_until(lambda: _engine_requests(daemon) == [0, 0, 0], 5.0), _engine_requests(daemon)


def test_a_client_leaving_mid_decode_frees_both_sides(daemon):
    conn, resp = open_stream(daemon, "pd", 1500)
    ev = sse_events(resp)
    for _ in range(5):
        next(ev)
    conn.close()
    assert wait_until(lambda: _engine_requests(daemon) == [0, 0, 0], 5.0), _engine_requests(daemon)
    inst = _instances(daemon)
    assert inst[("pd", 1)]["decoding"] == inst[("pd", 2)]["decoding"] == 0


def test_kill9_of_a_decode_worker_fails_only_its_requests(daemon):
    pids = daemon.worker_pids()
    conn, resp = open_stream(daemon, "pd", 1500)
    ev = sse_events(resp)
    next(ev)
    assert wait_until(lambda: any(_instances(daemon)[("pd", d)]["decoding"] for d in (1, 2)), 10.0)
    victim = 1 if _instances(daemon)[("pd", 1)]["decoding"] else 2
    t_kill = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    rest = list(ev)
    conn.close()
    errors = [(t, e) for t, e in rest if isinstance(e, dict) and "error" in e]
    assert len(errors) == 1 and errors[0][1]["error"]["code"] == "worker_died", rest[-3:]
    assert errors[0][0] - t_kill < 1.0
    # the other decode instance keeps the model served while the victim restarts
    out = _complete(daemon, "pd", prompt="hello", max_tokens=8, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == 8
    assert wait_until(lambda: _engine_requests(daemon)[0] == 0, 5.0), _engine_requests(daemon)

    def back():
        inst = _instances(daemon)
        return daemon.worker_pids()[victim] != pids[victim] and all(r["state"] == "active" for r in inst.values())

    assert wait_until(back, 30.0, 0.2), daemon.log_text()[-3000:]
    ref = _complete(daemon, "ref", prompt="after the restart", max_tokens=12, ignore_eos=True, temperature=0.0)
    out = _complete(daemon, "pd", prompt="after the restart", max_tokens=12, ignore_eos=True, temperature=0.0)
    assert out["choices"][0]["text"] == ref["choices"][0]["text"]


UNLOAD_CONFIG = """
[devices]
count = 2
memory_mib = 256

[[models]]
name = "pd"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 32
devices = [0, 1]
prefill_devices = [0]
"""


def test_unload_lets_a_request_still_prefilling_finish_on_its_decode_instance():
    """`janus ctl unload` drains: a request whose prefill is under way when the unload
    begins must still be handed to the decode instance and finish, not be failed at its
    handoff because the drain took the decode instances out of routing."""
    import threading

    d = start_daemon(server_section(Path("@RUN@")) + UNLOAD_CONFIG)
    prefill_pid = d.worker_pids()[0]
    try:
        os.kill(prefill_pid, signal.SIGSTOP)  # the request waits on the prefill worker, assigned
        out: dict[str, object] = {}
        body = {"model": "pd", "prompt": list(range(5, 25)), "max_tokens": 16, "ignore_eos": True,
                "temperature": 0.0}
        t_req = threading.Thread(target=lambda: out.setdefault("req", d.http("POST", "/v1/completions", body)))
        t_req.start()

        def assigned():
            st, _, m = d.http("GET", "/metrics")
            return "janusd_dispatch_assigned_total 1.0" in m

        assert wait_until(assigned, 10.0), d.http("GET", "/metrics")[2]
        t_unl = threading.Thread(target=lambda: out.setdefault("unload", d.ctl(am.UnloadReq("pd"))))
        t_unl.start()
        assert wait_until(lambda: _instances(d)[("pd", 0)]["state"] == "draining", 10.0)  # the unload drains
        os.kill(prefill_pid, signal.SIGCONT)
        t_req.join(30.0)
        t_unl.join(30.0)
        st, _, res = out["req"]
        assert st == 200, res
        assert res["usage"]["completion_tokens"] == 16
        assert out["unload"].data == {"unloaded": "pd", "failed_requests": 0}
        st, _, m = d.http("GET", "/metrics")
        assert 'janusd_kv_transfers_total{model="pd",outcome="ok"} 1.0' in m
        assert "no_decode_instance" not in m
    finally:
        os.kill(prefill_pid, signal.SIGCONT)
        d.stop()
