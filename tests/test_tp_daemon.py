"""A real daemon serving a tensor-parallel model ([P]): `demo:llama-tiny` at tp 2 on the
device group 0-1 (lead 0) beside the same checkpoint at tp 1 on device 2, four cpu
workers (2-3: the group forks go to, once tp 1 rests Cold), one daemon for the module (server/tp_groups.py,
engine/worker_tp.py, server/tp_fork.py).

Checked here: the OpenAI API answers the tp 2 instance greedily token for token as the
tp 1 one (one request, a batch of concurrent ones, streamed and not); the follower's
shard sits in device 1's pool; Warm -> Active, Cold -> Active and a request waking a Warm
group give the same tokens after; what is not built (Cold -> Warm) is refused by name; a
D2D fork of the group to devices 2-3 moves shard i to shard i over Mooncake and each of
the two instances alone answers as tp 1 does; with the source's follower frozen (SIGSTOP)
its shard cannot publish, that target shard alone reads the checkpoint and the group
still answers the same; kill -9 of either shard's worker (the follower, then the lead) fails the in-flight request
within a second, restarts the group whole (both workers, new pids), leaves the other
workers alone, and the group then answers as before (last: it restarts workers)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import threading
from pathlib import Path

import pytest

from daemon_harness import kill_mid_stream, server_section, sse_events, start_daemon, wait_until
from janusd.wire import admin_msgs as am

MODELS = """
[[models]]
name = "tp2"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 16
tp = 2
devices = [0]

[[models]]
name = "tp1"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 16
devices = [2]
"""
PROMPTS = ("once upon a time", "the quick brown fox jumps over", "1 2 3 4 5 6 7 8 9")


@pytest.fixture(scope="module")
def daemon():
    # no pings: a frozen worker stays (the fork's fault test); a publish waits the heartbeat's bound, 1 s
    server = server_section(Path("@RUN@"), worker_heartbeat_s=0.0, worker_heartbeat_timeout_s=1.0)
    d = start_daemon(server + "[devices]\ncount = 4\nmemory_mib = 64\n" + MODELS)
    yield d
    d.stop()


def complete(d, model: str, prompt: str, max_tokens: int = 12) -> tuple[str, int]:
    st, _, out = d.http("POST", "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                    "temperature": 0, "ignore_eos": True})
    assert st == 200, out
    return out["choices"][0]["text"], out["usage"]["completion_tokens"]


def streamed(d, model: str, prompt: str, max_tokens: int = 12) -> tuple[str, int]:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()[:300]
    text, usage, chunks = "", 0, 0
    for _, ev in sse_events(resp):
        if ev == "[DONE]":
            break
        if ev.get("choices"):
            text += ev["choices"][0]["text"]
            chunks += 1
        if ev.get("usage"):
            usage = ev["usage"]["completion_tokens"]
    conn.close()
    assert chunks > 1  # streamed, not one answer
    return text, usage


def state(d) -> str:
    return next(i["state"] for i in d.ctl(am.InstancesReq()).data["instances"] if i["model"] == "tp2")


def pool(d, device: int) -> dict:
    return next(p for p in d.ctl(am.PoolsReq()).data["pools"] if p["device"] == device)


def test_tp2_answers_token_for_token_as_tp1_streamed_batched_and_not(daemon):
    ref = {p: complete(daemon, "tp1", p) for p in PROMPTS}
    assert all(n == 12 for _, n in ref.values())
    assert len({t for t, _ in ref.values()}) == len(PROMPTS)  # the prompts' outputs differ: a real comparison
    for p in PROMPTS:
        assert complete(daemon, "tp2", p) == ref[p]
    assert streamed(daemon, "tp2", PROMPTS[1]) == ref[PROMPTS[1]]
    got: dict[str, tuple[str, int]] = {}  # concurrent: decoded as one batch across the group
    threads = [threading.Thread(target=lambda p=p: got.__setitem__(p, complete(daemon, "tp2", p))) for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == ref
    # the follower's shard lives in device 1's pool, on its own worker; the instance is the lead's
    assert wait_until(lambda: "tp2" in (pool(daemon, 1).get("models") or []), 5.0), pool(daemon, 1)
    inst = [i for i in daemon.ctl(am.InstancesReq()).data["instances"] if i["model"] == "tp2"]
    assert [i["device"] for i in inst] == [0]


def test_warm_and_cold_round_trips_and_a_waking_request_give_the_same_tokens(daemon):
    ref = complete(daemon, "tp1", PROMPTS[0])
    r = daemon.ctl(am.StateReq("tp2", 0, "warm")).data
    assert (r["state"], r["path"], r["devices"]) == ("warm", "d2h", [0, 1]), r
    # each shard's host copy on its own worker; no shard left in a pool
    assert wait_until(lambda: "tp2" in pool(daemon, 1).get("host_copies", {}) and not pool(daemon, 1)["models"], 5.0)
    copies = pool(daemon, 0)["host_copies"]["tp2"], pool(daemon, 1)["host_copies"]["tp2"]
    assert copies[0] == copies[1] > 0  # llama-tiny's shards are the same size
    assert daemon.ctl(am.StateReq("tp2", 0, "active")).data["path"] == "h2d"
    assert complete(daemon, "tp2", PROMPTS[0]) == ref
    assert daemon.ctl(am.StateReq("tp2", 0, "cold")).data["state"] == "cold"
    assert wait_until(lambda: not pool(daemon, 1)["models"] and not pool(daemon, 1)["host_copies"], 5.0)
    refused = daemon.ctl(am.StateReq("tp2", 0, "warm"))
    assert isinstance(refused, am.AdminError) and "goes warm only from active" in refused.message, refused
    assert daemon.ctl(am.StateReq("tp2", 0, "active")).data["path"] == "checkpoint"
    assert streamed(daemon, "tp2", PROMPTS[0]) == ref
    assert daemon.ctl(am.StateReq("tp2", 0, "warm")).data["state"] == "warm"
    assert complete(daemon, "tp2", PROMPTS[0]) == ref  # the request wakes the group (followers, then lead)
    assert state(daemon) == "active"
    refused = daemon.ctl(am.LoadReq("intruder", "demo:llama-tiny", [1]))  # a group's devices are held whole
    assert isinstance(refused, am.AdminError) and "device 1 is in the tp = 2 group 0-1 of 'tp2'" in refused.message


def alone(d, lead: int, ref: dict[str, tuple[str, int]]) -> None:
    """Each of tp2's instances (leads 0 and `lead`) alone answers every prompt as `ref`:
    the other rests Warm meanwhile."""
    for serving, resting in ((lead, 0), (0, lead)):
        assert d.ctl(am.StateReq("tp2", resting, "warm")).data["state"] == "warm"
        for p in PROMPTS:
            assert complete(d, "tp2", p) == ref[p], (serving, p)
        assert d.ctl(am.StateReq("tp2", resting, "active")).data["state"] == "active"


def test_fork_of_the_group_to_another_pair_shard_by_shard(daemon):
    ref = {p: complete(daemon, "tp1", p) for p in PROMPTS}
    refused = daemon.ctl(am.ForkReq("tp2", 0, 2))  # a group's devices are held whole
    assert isinstance(refused, am.AdminError) and "'tp1' on device 2 is active" in refused.message, refused
    assert daemon.ctl(am.StateReq("tp1", 2, "cold")).data["state"] == "cold"  # until the next test's end
    r = daemon.ctl(am.ForkReq("tp2", 0, 2)).data
    assert (r["state"], r["path"], r["devices"], r["source_device"]) == ("active", "d2d", [2, 3], 0), r
    assert "fallback" not in r and [s["path"] for s in r["shards"]] == ["d2d", "d2d"], r
    assert r["shards"][0]["bytes"] == r["shards"][1]["bytes"] > 0  # llama-tiny's shards are the same size
    assert wait_until(lambda: "tp2" in (pool(daemon, 3).get("models") or []), 5.0), pool(daemon, 3)
    alone(daemon, 2, ref)
    assert daemon.ctl(am.StateReq("tp2", 2, "warm")).data["state"] == "warm"
    r = daemon.ctl(am.ForkReq("tp2", 0, 2)).data  # a Warm group comes back from its own host copies
    assert (r["state"], r["path"]) == ("active", "h2d") and "own host copies" in r["fallback"], r
    for to, said in ((1, "not the lead of an aligned group"), (4, "needs devices 4-5; there are 4"),
                     (2, "is active: cannot go forking")):
        refused = daemon.ctl(am.ForkReq("tp2", 0, to))
        assert isinstance(refused, am.AdminError) and said in refused.message, (to, refused)
    assert daemon.ctl(am.StateReq("tp2", 2, "cold")).data["state"] == "cold"


def test_a_frozen_source_shard_falls_back_for_its_shard_only(daemon):
    """The source's follower (device 1) frozen: it cannot publish within the bound, so
    target shard 1 reads its slices from the checkpoint while shard 0 pulls over Mooncake;
    the group is Active and answers as before."""
    ref = {p: complete(daemon, "tp1", p) for p in PROMPTS}  # wakes tp1 on device 2: back to Cold
    assert daemon.ctl(am.StateReq("tp1", 2, "cold")).data["state"] == "cold"
    pid = daemon.worker_pids()[1]
    os.kill(pid, signal.SIGSTOP)
    try:
        r = daemon.ctl(am.ForkReq("tp2", 0, 2)).data
    finally:
        os.kill(pid, signal.SIGCONT)
    assert r["state"] == "active" and [s["path"] for s in r["shards"]] == ["d2d", "checkpoint"], r
    assert "fallback" not in r["shards"][0] and "could not publish" in r["shards"][1]["fallback"], r
    assert r["path"] == "mixed" and r["fallback"].startswith("shard 1: "), r
    alone(daemon, 2, ref)
    assert daemon.ctl(am.StateReq("tp2", 2, "cold")).data["state"] == "cold"
    assert daemon.ctl(am.StateReq("tp1", 2, "active")).data["state"] == "active"


@pytest.mark.parametrize("shard", [1, 0], ids=["follower", "lead"])
def test_kill9_of_either_shard_fails_in_flight_fast_and_restarts_the_group_whole(daemon, shard):
    ref = complete(daemon, "tp2", PROMPTS[2])
    pids = daemon.worker_pids()
    rest, errors = kill_mid_stream(daemon, "tp2", pids[shard])
    assert len(errors) == 1, rest[-3:]
    assert errors[0][0] < 1.0, errors[0][0]
    assert errors[0][1]["error"]["code"] == "worker_died"
    assert complete(daemon, "tp1", PROMPTS[0])[1] == 12  # the other instance serves meanwhile
    assert wait_until(lambda: state(daemon) == "active", 40.0, 0.2), daemon.log_text()[-2000:]
    now = daemon.worker_pids()
    assert now[0] != pids[0] and now[1] != pids[1] and all(now[d] == pids[d] for d in (2, 3)), (pids, now)
    assert complete(daemon, "tp2", PROMPTS[2]) == ref


def test_the_oracle_prior_of_the_group_is_one_shards(daemon):
    """A model with traffic gets its roofline prior (server/oracle_refit.py): tp 2's is one
    shard's of the group (oracle/prior.py `tp`), tp 1's the whole model's."""
    def tps() -> dict[str, int | None]:
        return {r["model"]: r["prior_tp"] for r in daemon.ctl(am.OracleReq()).data["oracle"]}

    assert wait_until(lambda: tps() == {"tp1": 1, "tp2": 2}, 60.0, 0.2), tps()  # last: described meanwhile
