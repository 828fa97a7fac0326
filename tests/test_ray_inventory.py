"""The ray launcher apart from a running cluster: the device inventory read from Ray's
node table (pure), the local launcher never importing Ray, and a daemon pointed at a
Ray address where nothing answers giving up within `ray.start_timeout_s` with a clear
error instead of hanging."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon_harness import ROOT, server_section, start_daemon
from janusd.server.ray_launcher import NodeDevice, inventory


def _node(name: str, nid: str, devices: float, alive: bool = True, ip: str = "10.0.0.1") -> dict:
    return {"NodeName": name, "NodeID": nid, "Alive": alive, "NodeManagerAddress": ip,
            "Resources": {"CPU": 8.0, "janus_device": devices} if devices else {"CPU": 8.0}}


def test_devices_are_numbered_by_node_name_then_id_one_per_declared_unit():
    nodes = [
        _node("host-01", "bb", 2, ip="10.0.0.2"),
        _node("host-00", "cc", 1, ip="10.0.0.1"),
        _node("head", "aa", 0),  # declares no device: not in the inventory
        _node("host-00", "ab", 1, ip="10.0.0.3"),  # the same name twice: the id decides
        _node("host-02", "dd", 4, alive=False),  # dead: its devices are not offered
    ]
    assert inventory(nodes, "janus_device") == [
        NodeDevice("ab", "host-00", "10.0.0.3"), NodeDevice("cc", "host-00", "10.0.0.1"),
        NodeDevice("bb", "host-01", "10.0.0.2"), NodeDevice("bb", "host-01", "10.0.0.2"),
    ]
    assert inventory(nodes, "npu") == []


def test_the_local_launcher_never_imports_ray():
    code = ("import sys; from janusd.server.daemon import Daemon; from janusd.config import load_config; "
            "Daemon(load_config(None)); assert 'ray' not in sys.modules, 'ray imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_ray_address_where_nothing_answers_fails_the_start_within_the_start_timeout():
    pytest.importorskip("ray", reason="the ray extra is not installed")
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = (server_section(Path("@RUN@")) + "[devices]\ncount = 1\nmemory_mib = 16\nlauncher = \"ray\"\n\n"
            + f'[ray]\naddress = "127.0.0.1:{port}"\nstart_timeout_s = 2.0\n')
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as exc:
        start_daemon(text, timeout_s=60.0)
    took = time.monotonic() - t0
    assert "exited with 1" in str(exc.value) and "Ray did not answer connect within 2 s (ray.start_timeout_s)" in str(exc.value)
    assert took < 15.0, f"the daemon took {took:.1f} s to give up on Ray"


class _StallingRay:
    """Ray's client at the edge: `nodes()` answers, or stalls past the call timeout."""

    def __init__(self) -> None:
        self.stall = False

    def nodes(self) -> list[dict]:
        if self.stall:
            time.sleep(0.5)
        return [_node("host-00", "aa", 1)]


def test_a_head_that_stops_answering_is_reported_and_its_return_too():
    import asyncio

    from janusd.config import RayConfig
    from janusd.server.ray_launcher import RayLauncher

    async def go() -> list[str]:
        launcher = RayLauncher(RayConfig(call_timeout_s=0.1), 1)
        launcher.ray = fake = _StallingRay()
        watch = asyncio.create_task(launcher.watch(period_s=0.05))
        seen = []
        for stall in (False, True, False):
            fake.stall = stall
            await asyncio.sleep(0.4 if stall else 0.6)  # a stalled call ends at the timeout; a stale one drains
            seen.append(launcher.trouble)
        watch.cancel()
        return seen

    ok, stalled, back = asyncio.run(go())
    assert ok == "" and back == ""
    assert stalled == "Ray did not answer nodes within 0.1 s (ray.call_timeout_s)"


class _SilentRef:
    """A task Ray never reports the end of (its node unreachable): its future never resolves."""

    def __init__(self) -> None:
        import concurrent.futures

        self._fut: concurrent.futures.Future = concurrent.futures.Future()
        self.cancelled = 0

    def future(self):
        return self._fut


def test_a_killed_worker_whose_end_ray_never_reports_is_taken_as_gone_within_the_call_timeout():
    import asyncio

    from janusd.config import RayConfig
    from janusd.server.ray_launcher import RayLauncher, RayProcess

    async def go() -> tuple[int, float, int]:
        launcher = RayLauncher(RayConfig(call_timeout_s=0.2), 1)

        class _Ray:
            def cancel(self, ref, force: bool) -> None:
                ref.cancelled += 1  # asked, and nothing ever comes of it

        launcher.ray = _Ray()
        ref = _SilentRef()
        launch, conn = launcher.listener.new_launch(0)
        proc = RayProcess(launcher, NodeDevice("aa", "host-00", "10.0.0.1"), ref, launch, conn)
        proc.kill()
        t0 = time.monotonic()
        code = await proc.wait()
        return code, time.monotonic() - t0, ref.cancelled

    code, took, cancels = asyncio.run(go())
    assert code == -9 and 0.15 < took < 1.0 and cancels == 1


def test_free_devices_are_the_alive_nodes_units_no_slot_holds():
    from janusd.server.ray_launcher import free_devices

    a, b, b2 = NodeDevice("aa", "host-a", "10.0.0.1"), NodeDevice("bb", "host-b", "10.0.0.2"), \
        NodeDevice("b2", "host-b2", "10.0.0.3")
    offered = [a, a, b2]  # node b left; b2 joined; a declares two units
    # slot 0 on a, slot 1 on b (gone), slot 2 absent from the start
    assert free_devices(offered, [a, b, None]) == [a, b2]
    assert free_devices(offered, [a, a, None]) == [b2]  # a slot whose node is alive keeps its unit
    assert free_devices(offered, [None, None]) == offered
    assert free_devices([], [a, None]) == []


@given(st.lists(st.sampled_from("abcd"), max_size=8), st.lists(st.sampled_from("abcde-"), max_size=8))
def test_free_devices_never_hands_out_a_held_unit_nor_keeps_a_free_one(offered_ids, held_ids):
    from collections import Counter

    from janusd.server.ray_launcher import free_devices

    dev = {n: NodeDevice(n, f"host-{n}", "10.0.0.1") for n in "abcde"}
    offered = [dev[n] for n in sorted(offered_ids)]
    held = [dev[n] if n != "-" else None for n in held_ids]
    free = Counter(d.node_id for d in free_devices(offered, held))
    units, holding = Counter(offered_ids), Counter(n for n in held_ids if n != "-")
    # per node: its units less the slots on it, never below zero; nodes that left hold nothing
    assert free == Counter({n: units[n] - holding[n] for n in units if units[n] > holding[n]})


class _JoiningRay:
    """Ray's client at the edge: the node table as the test sets it; or no answer."""

    def __init__(self, nodes: list[dict]) -> None:
        self.rows = nodes
        self.stall = False

    def nodes(self) -> list[dict]:
        if self.stall:
            time.sleep(0.5)
        return self.rows


def test_adopt_gives_absent_slots_the_devices_of_joined_nodes_and_a_silent_ray_nothing():
    import asyncio

    from janusd.config import RayConfig
    from janusd.server.ray_launcher import RayLauncher

    async def go() -> list:
        launcher = RayLauncher(RayConfig(call_timeout_s=0.1), 3)
        launcher.ray = fake = _JoiningRay([_node("host-a", "aa", 1, ip="10.0.0.1")])
        launcher.devices = [NodeDevice("aa", "host-a", "10.0.0.1"), NodeDevice("bb", "host-b", "10.0.0.2"), None]
        seen = [await launcher.adopt([1, 2])]  # b left, nobody joined: nothing
        fake.rows = [*fake.rows, _node("host-b", "bb", 1, alive=False), _node("host-c", "cc", 2, ip="10.0.0.3")]
        fake.stall = True
        seen.append(await launcher.adopt([1, 2]))  # Ray silent: nothing this time
        fake.stall = False
        seen.append(await launcher.adopt([1, 2]))
        seen.append([launcher.placement(i) for i in range(3)])
        seen.append(await launcher.adopt([]))
        launcher.devices[2] = None
        # slot 0 absent (its worker did not start): the unit it held on a, alive, is its again
        seen.append(await launcher.adopt([0]))
        # slots 1 and 2 absent (slot 2 emptied): host-c's two units, one of them slot 1's, go to them
        seen.append(await launcher.adopt([1, 2]))
        return seen

    none, silent, adopted, where, again, held, retried = asyncio.run(go())
    assert none == [] and silent == [] and adopted == [1, 2] and again == [] and retried == [1, 2]
    assert held == [0]  # an absent slot holds nothing
    assert [(p.node, p.host) for p in where] == [("host-a", "10.0.0.1"), ("host-c", "10.0.0.3"), ("host-c", "10.0.0.3")]
