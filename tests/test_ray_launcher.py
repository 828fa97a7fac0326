"""The ray launcher end to end ([R]): a two-node Ray cluster on this machine (every node
and the daemon on 127.0.0.1), one `janus_device` per node, a real daemon placing one
worker on each through Ray and serving the OpenAI API from both.

Checked: a daemon of two device slots started while only node A is up serves from A,
device 1 absent (its model waits); node B joining fills device 1 within seconds (its
model loads there, server/node_joins.py); each device's worker runs where Ray put it (not a child of the daemon) and ctl
shows its node; a D2D fork from node A's device to node B's over Mooncake tcp (the
source's session carries its node's host) generates identically; node B leaving
mid-stream fails its client's stream within 1 s while node A's stream finishes whole,
and B's model comes back on A; a node B' joining after it takes device 1 over, and a model
placed there serves. Ray starts once for the module (its start is most of the module's
time). Tests run in file order: node B joins in the first, leaves and is replaced in the
last ones."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import pytest

from daemon_harness import open_stream, server_section, sse_events, start_daemon, wait_until
from janusd.wire import admin_msgs as am

ray = pytest.importorskip("ray", reason="the ray extra (pip install .[ray]) is not installed")
from ray.cluster_utils import Cluster  # noqa: E402

# GCS declares a node dead after ~0.4 s of missed health checks (its default is ~15 s):
# a restart onto a dead node then fails fast as "gone" instead of waiting on it
FAST_HEALTH = {"health_check_period_ms": 200, "health_check_failure_threshold": 2, "health_check_timeout_ms": 200,
               "health_check_initial_delay_ms": 0}
NODE = dict(num_cpus=1, resources={"janus_device": 1}, node_ip_address="127.0.0.1", object_store_memory=80 << 20)

MODELS = """
[[models]]
name = "demo-llama"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 4
devices = [0]

[[models]]
name = "demo-qwen2"
checkpoint = "demo:qwen2-tiny"
kv_cache_mib = 4
devices = [1]
"""


@pytest.fixture(scope="module")
def cluster():
    """The cluster and its nodes by role ("b": node B once the first test added it)."""
    c = Cluster(initialize_head=True, head_node_args=dict(
        NODE, node_name="janus-a", include_dashboard=False, _system_config=FAST_HEALTH))
    nodes: dict = {}
    yield c, nodes
    c.shutdown()


@pytest.fixture(scope="module")
def daemon(cluster):
    c, _ = cluster
    text = (server_section(Path("@RUN@"), model_wait_timeout_s=20.0)
            + "[devices]\ncount = 2\nmemory_mib = 16\nlauncher = \"ray\"\n\n"
            + f'[ray]\naddress = "{c.address}"\ncall_timeout_s = 10.0\ndevice_wait_s = 0.5\n'
            + "join_check_s = 0.3\n" + MODELS)
    d = start_daemon(text)
    yield d
    d.stop()


def ctl_ok(d, req) -> dict:
    reply = d.ctl(req)
    assert isinstance(reply, am.AdminResult), getattr(reply, "message", reply)
    return reply.data


def complete(d, model: str, n: int = 12) -> tuple[int, str]:
    status, _, body = d.http("POST", "/v1/completions", {"model": model, "prompt": "the quick brown fox",
                                                        "max_tokens": n, "temperature": 0, "ignore_eos": True})
    return status, body["choices"][0]["text"] if status == 200 else str(body)


def _ppid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def _workers(d) -> list[tuple]:
    return [(w["device"], w["node"], w["state"]) for w in ctl_ok(d, am.StatusReq())["workers"]]


def _instance_state(d, model: str, device: int) -> str | None:
    rows = ctl_ok(d, am.InstancesReq())["instances"]
    return next((i["state"] for i in rows if i["model"] == model and i["device"] == device), None)


JOIN_BOUND_S = 25.0
LOSS_BOUND_S = 2.5  # a lost node's streams fail within this; its test says what it measured


def _join(d, c, name: str) -> tuple:
    """Add a node of one device; wait for device 1 to be ready on it; (node, seconds). The
    seconds are mostly process starts on the new node (Ray's worker there, then janusd's
    worker importing torch): ~4-6 s on this 2-core host alone, 18.8 s in CI while the other
    xdist worker ran the oracle's 30 s fits on the second core (2026-12-08); the join check
    itself is 0.3 s. JOIN_BOUND_S holds the worst seen with room."""
    node = c.add_node(**NODE, node_name=name)
    t0 = time.monotonic()
    assert wait_until(lambda: _workers(d)[1] == (1, name, "ready"), 30.0), _workers(d)
    return node, time.monotonic() - t0


def test_started_with_node_a_only_then_node_b_joins_and_fills_device_1(daemon, cluster):
    c, nodes = cluster
    assert _workers(daemon) == [(0, "janus-a", "ready"), (1, "absent", "absent")]
    assert complete(daemon, "demo-llama")[0] == 200  # served on node A meanwhile
    assert _instance_state(daemon, "demo-qwen2", 1) == "loading"  # configured on device 1: waits for it
    assert "devices 1-1 absent until a node joins" in daemon.log_text()
    nodes["b"], took = _join(daemon, c, "janus-b")
    assert took < JOIN_BOUND_S, f"device 1 took {took:.1f} s to come up on the joined node"
    pools = ctl_ok(daemon, am.PoolsReq(refresh=True))["pools"]
    assert {p["device"]: (p["node"], p["state"]) for p in pools} == {0: ("janus-a", "ready"), 1: ("janus-b", "ready")}
    assert wait_until(lambda: _instance_state(daemon, "demo-qwen2", 1) == "active", 30.0)
    assert "device 1 on joined node janus-b is ready" in daemon.log_text()


def test_each_device_is_served_from_its_node(daemon):
    workers = ctl_ok(daemon, am.StatusReq())["workers"]
    assert [(w["device"], w["node"], w["host"], w["state"]) for w in workers] == [
        (0, "janus-a", "127.0.0.1", "ready"), (1, "janus-b", "127.0.0.1", "ready")]
    for w in workers:  # started by a Ray task, not by the daemon
        assert _ppid(w["pid"]) != daemon.proc.pid
    pools = ctl_ok(daemon, am.PoolsReq(refresh=True))["pools"]
    assert {p["device"]: p["node"] for p in pools} == {0: "janus-a", 1: "janus-b"}
    inst = {(i["model"], i["device"]): (i["node"], i["state"]) for i in ctl_ok(daemon, am.InstancesReq())["instances"]}
    assert inst == {("demo-llama", 0): ("janus-a", "active"), ("demo-qwen2", 1): ("janus-b", "active")}
    assert complete(daemon, "demo-llama")[0] == 200 and complete(daemon, "demo-qwen2")[0] == 200
    assert re.search(r"\b[0-9a-f]{64}\b", daemon.log_text()) is None  # the per-start token is never logged


def test_fork_from_node_a_to_node_b_generates_identically(daemon):
    status, ref = complete(daemon, "demo-llama")
    assert status == 200
    out = ctl_ok(daemon, am.ForkReq("demo-llama", 0, 1))
    assert out["state"] == "active" and out["path"] == "d2d" and "fallback" not in out, out
    ctl_ok(daemon, am.StateReq("demo-llama", 0, "warm"))  # only node B's copy serves now
    assert complete(daemon, "demo-llama") == (200, ref)
    ctl_ok(daemon, am.StateReq("demo-llama", 0, "active"))
    ctl_ok(daemon, am.StateReq("demo-llama", 1, "cold"))  # node B holds only demo-qwen2 again


def _descendants(pids: list[int]) -> set[int]:
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = _ppid(int(d.name))
            except (OSError, AssertionError):
                pass
    out, frontier = set(pids), list(pids)
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p and c not in out]
        out.update(kids)
        frontier += kids
    return out


def _nice_tree(pids: list[int]) -> None:
    for p in _descendants(pids):
        try:
            os.setpriority(os.PRIO_PROCESS, p, 19)
        except OSError:
            pass


def _read(resp, out: dict) -> None:
    events = list(sse_events(resp))
    out["events"] = events
    out["end"] = time.monotonic()


def test_node_b_leaving_fails_its_stream_fast_keeps_node_a_and_brings_its_model_to_a(daemon, cluster):
    c, nodes = cluster
    node_b = nodes["b"]
    conn_a, resp_a = open_stream(daemon, "demo-llama", 800)
    conn_b, resp_b = open_stream(daemon, "demo-qwen2", 1500)
    ev_b = sse_events(resp_b)
    next(ev_b)  # node B is generating
    a: dict = {}
    reader_a = threading.Thread(target=_read, args=(resp_a, a))
    reader_a.start()
    # node B's Ray processes (raylet, its agents, its workers) at the lowest priority: on
    # separate hosts their teardown would not share the daemon's and node A's two cores
    # (unniced, the dying agents' teardown delayed the daemon's loop by up to ~1 s here)
    _nice_tree([info.process.pid for infos in node_b.all_processes.values() for info in infos])
    t_gone = time.monotonic()
    c.remove_node(node_b, allow_graceful=False)
    rest_b = [(t - t_gone, e) for t, e in ev_b]
    errors = [(t, e) for t, e in rest_b if isinstance(e, dict) and "error" in e]
    assert errors, rest_b[-3:]
    # 0.33 s alone; 1.30 s in CI with the other xdist worker's oracle fits on the second core (2026-12-08)
    assert errors[0][0] < LOSS_BOUND_S, f"node B's client learned after {errors[0][0]:.2f} s"
    reader_a.join(60)
    texts = [e for _, e in a["events"] if isinstance(e, dict) and e.get("choices")]
    usage = [e["usage"] for _, e in a["events"] if isinstance(e, dict) and e.get("usage")]
    assert a["events"][-1][1] == "[DONE]" and not any("error" in e for _, e in a["events"] if isinstance(e, dict))
    assert usage and usage[-1]["completion_tokens"] == 800
    assert texts[-1] is not None and a["events"][-1][0] - t_gone > errors[0][0]  # A streamed on past B's end
    conn_a.close()
    conn_b.close()

    def on_a() -> bool:
        rows = ctl_ok(daemon, am.InstancesReq())["instances"]
        return any(i["model"] == "demo-qwen2" and i["device"] == 0 and i["state"] == "active" for i in rows)
    assert wait_until(on_a, 30.0), ctl_ok(daemon, am.InstancesReq())["instances"]
    assert complete(daemon, "demo-qwen2")[0] == 200
    workers = {w["device"]: w["state"] for w in ctl_ok(daemon, am.StatusReq())["workers"]}
    assert workers == {0: "ready", 1: "absent"}  # waits for a node: a node that joins takes it
    assert "device 1 absent" in daemon.log_text() and "left the Ray cluster" in daemon.log_text()


def test_a_node_joining_after_node_b_left_takes_device_1_over_and_serves(daemon, cluster):
    c, _ = cluster
    _, took = _join(daemon, c, "janus-b2")
    assert took < JOIN_BOUND_S, f"device 1 took {took:.1f} s to come up on the joined node"
    assert {p["device"]: p["node"] for p in ctl_ok(daemon, am.PoolsReq())["pools"]} == {0: "janus-a", 1: "janus-b2"}
    ctl_ok(daemon, am.StateReq("demo-qwen2", 1, "active"))  # loaded on node B2
    ctl_ok(daemon, am.StateReq("demo-qwen2", 0, "cold"))  # so only node B2's copy serves
    assert complete(daemon, "demo-qwen2")[0] == 200
    pools = {p["device"]: p for p in ctl_ok(daemon, am.PoolsReq(refresh=True))["pools"]}
    assert "demo-qwen2" in pools[1]["models"] and "demo-qwen2" not in pools[0]["models"]
