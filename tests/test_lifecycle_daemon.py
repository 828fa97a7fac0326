"""Active / Warm / Cold through a real daemon (issue [L]): start states from config,
`ctl state` round trips with identical greedy outputs and per-phase timings, requests
for a Warm or Cold model held and served (scale to zero; a Warm one's restore overlapped
with the request's prefill), an out-of-memory wake-up that
rolls back, freeing back to the pool's baseline with the worker's RSS flat, a co-located
model's stream undisturbed, D2D fork, and the metrics. One daemon for the module; tests
run in file order (each leaves the instances as the next expects)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from daemon_harness import open_stream, server_section, sse_events, start_daemon, wait_until
from janusd.wire import admin_msgs as am

MODELS = """
[engine]
kv_wait_timeout_s = 0.0

[lifecycle]
overlap_restore = true

[[models]]
name = "demo-llama"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 4
devices = [0, 1]
warm_devices = [1]

[[models]]
name = "demo-qwen2"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 4
devices = [0]

[[models]]
name = "demo-big"
checkpoint = "demo:llama-small"
kv_cache_mib = 4
devices = [1]
cold_devices = [1]
"""


@pytest.fixture(scope="module")
def daemon():
    text = (server_section(Path("@RUN@"), model_wait_timeout_s=20.0)
            + "[devices]\ncount = 2\nmemory_mib = 16\n" + MODELS)
    d = start_daemon(text)
    yield d
    d.stop()


def states(d) -> dict[tuple[str, int], str]:
    return {(i["model"], i["device"]): i["state"] for i in d.ctl(am.InstancesReq()).data["instances"]}


def ctl_ok(d, req) -> dict:
    reply = d.ctl(req)
    assert isinstance(reply, am.AdminResult), getattr(reply, "message", reply)
    return reply.data


def complete(d, model: str, n: int = 12) -> tuple[int, str]:
    status, _, body = d.http("POST", "/v1/completions", {"model": model, "prompt": "the quick brown fox",
                                                        "max_tokens": n, "temperature": 0, "ignore_eos": True})
    return status, body["choices"][0]["text"] if status == 200 else str(body)


def pool(d, device: int) -> dict:
    return next(p for p in ctl_ok(d, am.PoolsReq())["pools"] if p["device"] == device)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_start_states_from_config(daemon):
    s = states(daemon)
    assert s[("demo-llama", 0)] == "active" and s[("demo-llama", 1)] == "warm"
    assert s[("demo-qwen2", 0)] == "active" and s[("demo-big", 1)] == "cold"
    assert pool(daemon, 1)["host_copies"].get("demo-llama", 0) > 0  # Warm: a host copy, nothing on the device
    assert "demo-llama" not in pool(daemon, 1)["models"]
    _, _, text = daemon.http("GET", "/metrics")
    assert 'janusd_instances{model="demo-llama",state="warm"} 1.0' in text
    assert 'janusd_instances{model="demo-big",state="cold"} 1.0' in text


def test_illegal_move_names_the_current_state(daemon):
    reply = daemon.ctl(am.ForkReq("demo-big", 1, 0))  # the source is cold: nothing to fork from
    assert isinstance(reply, am.AdminError) and "cold" in reply.message
    reply = daemon.ctl(am.StateReq("demo-llama", 0, "lukewarm"))
    assert isinstance(reply, am.AdminError) and "active, warm or cold" in reply.message
    reply = daemon.ctl(am.StateReq("nope", 0, "warm"))
    assert isinstance(reply, am.AdminError) and "does not exist" in reply.message


def test_warm_and_cold_round_trips_give_identical_outputs(daemon):
    status, ref = complete(daemon, "demo-llama")
    assert status == 200 and ref
    for rest in ("warm", "cold"):
        out = ctl_ok(daemon, am.StateReq("demo-llama", 0, rest))
        assert out["state"] == rest and "drain" in out["phases"], out
        assert states(daemon)[("demo-llama", 0)] == rest
        back = ctl_ok(daemon, am.StateReq("demo-llama", 0, "active"))
        # Cold: the converted image written when the weights left the device, memory-mapped
        assert back["state"] == "active" and back["path"] == ("h2d" if rest == "warm" else "image"), back
        assert {"transfer", "first_token"} <= set(back["phases"]), back
        assert complete(daemon, "demo-llama") == (200, ref)
    _, _, text = daemon.http("GET", "/metrics")
    assert 'janusd_lifecycle_phase_seconds_count{model="demo-llama",op="activate",phase="transfer"} 2.0' in text
    assert 'janusd_lifecycle_ops_total{model="demo-llama",op="deactivate",outcome="ok"} 2.0' in text


def test_request_waking_a_warm_model_overlaps_the_copy_and_gives_the_same_output(daemon):
    """lifecycle.overlap_restore (on by default): the waking request's prefill runs while
    the weights land layer by layer; its output is the Active instance's."""
    status, ref = complete(daemon, "demo-llama")
    assert status == 200 and ref
    ctl_ok(daemon, am.StateReq("demo-llama", 0, "warm"))
    assert {states(daemon)[("demo-llama", d)] for d in (0, 1)} == {"warm"}
    assert complete(daemon, "demo-llama") == (200, ref)
    s = states(daemon)
    assert "active" in (s[("demo-llama", 0)], s[("demo-llama", 1)])
    _, _, text = daemon.http("GET", "/metrics")
    # the wake's H2D answered before its copy ended: a restore phase, no transfer phase
    assert 'janusd_lifecycle_phase_seconds_count{model="demo-llama",op="activate",phase="restore"} 3.0' in text
    assert 'janusd_lifecycle_phase_seconds_count{model="demo-llama",op="activate",phase="transfer"} 2.0' in text
    assert complete(daemon, "demo-llama") == (200, ref)


def test_request_for_a_cold_model_is_held_and_served(daemon):
    """Scale to zero: with no Active instance, a request wakes one and is served (never a 404/503 at once)."""
    ctl_ok(daemon, am.StateReq("demo-llama", 0, "cold"))
    ctl_ok(daemon, am.StateReq("demo-llama", 1, "cold"))
    assert {states(daemon)[("demo-llama", d)] for d in (0, 1)} == {"cold"}
    status, text = complete(daemon, "demo-llama")
    assert status == 200 and text
    s = states(daemon)
    assert "active" in (s[("demo-llama", 0)], s[("demo-llama", 1)])


def test_oom_on_wake_rolls_back(daemon):
    """demo-big does not fit beside an Active demo-llama on device 1 (8 pages): the wake-up
    fails with a clear error, the instance is Cold again and the pool is as before."""
    if states(daemon)[("demo-llama", 1)] != "active":
        ctl_ok(daemon, am.StateReq("demo-llama", 1, "active"))
    # a restore runs no prefill probe: on a device where the model never ran it borrows the
    # prefill fit of a device that has samples instead of starting from the bare prior
    fit = next(i for i in daemon.ctl(am.InstancesReq()).data["instances"]
               if (i["model"], i["device"]) == ("demo-llama", 1))
    assert fit["prefill_samples"] >= 2, fit
    before = pool(daemon, 1)
    reply = daemon.ctl(am.StateReq("demo-big", 1, "active"))
    assert isinstance(reply, am.AdminError), reply
    assert "cold again" in reply.message, reply.message
    assert states(daemon)[("demo-big", 1)] == "cold"
    after = pool(daemon, 1)
    # nothing of demo-big is held (demo-llama's idle KV cache may only have shrunk meanwhile)
    assert after["weight_pages"] == before["weight_pages"] and after["free_pages"] >= before["free_pages"], (before, after)
    # room made: the same wake-up now succeeds
    ctl_ok(daemon, am.StateReq("demo-llama", 1, "cold"))
    out = ctl_ok(daemon, am.StateReq("demo-big", 1, "active"))
    assert out["state"] == "active"
    assert complete(daemon, "demo-big")[0] == 200
    ctl_ok(daemon, am.StateReq("demo-big", 1, "cold"))


def test_cycles_free_back_to_baseline_and_rss_flat(daemon):
    """Leaving Active frees everything: after many activate / deactivate / fork cycles the
    pool's pages are at their baseline and the worker's RSS has not grown."""
    if states(daemon)[("demo-llama", 0)] != "active":
        ctl_ok(daemon, am.StateReq("demo-llama", 0, "active"))
    ctl_ok(daemon, am.StateReq("demo-llama", 1, "cold"))
    pid = daemon.worker_pids()[1]
    base = pool(daemon, 1)
    assert base["weight_pages"] == 0, base
    rss0 = None
    for i in range(100):
        if i % 10 == 9:
            ctl_ok(daemon, am.ForkReq("demo-llama", 0, 1))
        else:
            ctl_ok(daemon, am.StateReq("demo-llama", 1, "active"))
        ctl_ok(daemon, am.StateReq("demo-llama", 1, "warm" if i % 2 else "cold"))
        if i == 9:
            rss0 = rss_mib(pid)  # after the first fork started the transfer engine
    ctl_ok(daemon, am.StateReq("demo-llama", 1, "cold"))
    end = pool(daemon, 1)
    assert (end["free_pages"], end["weight_pages"], end["kv_pages"]) == (
        base["free_pages"], base["weight_pages"], base["kv_pages"]), (base, end)
    assert rss_mib(pid) - rss0 < 16, (rss0, rss_mib(pid))


def test_fork_gives_identical_generations(daemon):
    status, ref = complete(daemon, "demo-llama")
    out = ctl_ok(daemon, am.ForkReq("demo-llama", 0, 1))
    assert out["state"] == "active" and out["path"] == "d2d" and "fallback" not in out, out
    ctl_ok(daemon, am.StateReq("demo-llama", 0, "warm"))  # only the forked instance serves now
    assert complete(daemon, "demo-llama") == (200, ref)
    ctl_ok(daemon, am.StateReq("demo-llama", 0, "active"))


def test_colocated_stream_undisturbed(daemon):
    """demo-qwen2 streams on device 0 while demo-llama on device 0 goes warm, cold and
    active again several times: every token arrives, no error, no long stall."""
    conn, resp = open_stream(daemon, "demo-qwen2", 300)
    gaps: list[float] = []
    done: dict = {}

    def read() -> None:
        last = None
        n = 0
        for t, ev in sse_events(resp):
            if ev == "[DONE]":
                break
            if ev.get("usage"):
                done["usage"] = ev["usage"]
            if ev.get("choices") and ev["choices"][0].get("text"):
                n += 1
                if last is not None:
                    gaps.append(t - last)
                last = t
            if ev.get("choices") and ev["choices"][0].get("finish_reason"):
                done["finish"] = ev["choices"][0]["finish_reason"]
        done["n"] = n

    th = threading.Thread(target=read)
    th.start()
    for rest in ("warm", "cold", "warm"):
        ctl_ok(daemon, am.StateReq("demo-llama", 0, rest))
        ctl_ok(daemon, am.StateReq("demo-llama", 0, "active"))
    th.join(60)
    conn.close()
    assert done.get("finish") == "length" and done["usage"]["completion_tokens"] == 300, done
    assert gaps and max(gaps) < 1.0, max(gaps)


def _greedy_stream(d, model: str, n: int, on_first=None) -> str:
    import http.client
    import json

    body = json.dumps({"model": model, "prompt": "the quick brown fox", "max_tokens": n, "temperature": 0,
                       "ignore_eos": True, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    text = []
    for _, ev in sse_events(resp):
        if ev == "[DONE]":
            break
        if ev.get("choices"):
            text.append(ev["choices"][0]["text"])
            if on_first is not None and len(text) == 1:
                on_first()
    conn.close()
    return "".join(text)


def test_fork_while_the_source_streams_leaves_its_output_unchanged(daemon):
    ctl_ok(daemon, am.StateReq("demo-llama", 1, "cold"))
    if states(daemon)[("demo-llama", 0)] != "active":
        ctl_ok(daemon, am.StateReq("demo-llama", 0, "active"))
    status, ref = complete(daemon, "demo-llama", 200)
    assert status == 200
    go = threading.Event()
    out: dict = {}
    th = threading.Thread(target=lambda: out.setdefault("text", _greedy_stream(daemon, "demo-llama", 200, go.set)))
    th.start()
    assert go.wait(30)
    forked = ctl_ok(daemon, am.ForkReq("demo-llama", 0, 1))
    th.join(60)
    assert forked["path"] == "d2d" and out["text"] == ref

