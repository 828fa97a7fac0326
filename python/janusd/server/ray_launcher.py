"""The ray launcher (`devices.launcher = "ray"`): one Ray task per device, on the node
that owns it; the worker there connects back to the daemon (server/connect_back.py).

Ray places and supervises, nothing more: the daemon stays the one control plane (the
core, the controller, the API), and every janus message travels as wire/framing.py frames
on the worker's own TCP stream. Ray sees the launch arguments (the worker's flags, the
listener's address and the per-start token, server/ray_task.py) and an exit code.

The inventory is the cluster's: each alive node declares `ray.device_resource` units (one
per device, `ray start --resources '{"janus_device": N}'`); devices are numbered by node
name, then node id, so a cluster whose nodes are named host-00, host-01, ... numbers
them as an operator reads them. `devices.count` is the number of device slots (the core,
the controller and the pools number devices 0..count-1); the first devices found fill the
first slots. A cluster with fewer than `ray.min_devices` after `ray.device_wait_s` is
refused at start with what it offers; with fewer than count, the other slots are absent
until a node joins: `adopt` (every `ray.join_check_s`, server/node_joins.py) gives each
absent slot a device no slot holds on an alive node, a node that replaced a lost one too.

The daemon never hangs on Ray: every call runs on a small thread pool of its own and is
awaited at most `ray.call_timeout_s` (a call past it is reported and left to finish on its
thread). A node that leaves (Ray marks it dead, or its worker's stream ends) loses its
workers: their deaths take server/workers.py's usual path within milliseconds of the
stream's EOF, and a restart onto a node Ray reports dead, or a task Ray cannot place there
any more, raises WorkerError kind "gone", which server/worker_supervision.py turns into a
failed device and a re-placement of its models, instead of a restart loop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from janusd.config import RayConfig
from janusd.log import log
from janusd.server.connect_back import ConnectBack, Connection
from janusd.server.launcher import Placement
from janusd.server.ray_task import run_worker
from janusd.server.workers import WorkerError

T = TypeVar("T")
_GONE = ("NodeDiedError", "TaskUnschedulableError", "LocalRayletDiedError")


@dataclass(frozen=True)
class NodeDevice:
    """One device of the inventory: its node (Ray's id, its name) and the node's address."""

    node_id: str
    node_name: str
    host: str


def inventory(nodes: list[dict[str, Any]], resource: str) -> list[NodeDevice]:
    """The devices alive nodes declare, numbered by (node name, node id): pure, from
    ray.nodes()'s rows."""
    out: list[NodeDevice] = []
    alive = [n for n in nodes if n.get("Alive") and n.get("Resources", {}).get(resource, 0) >= 1]
    for n in sorted(alive, key=lambda n: (n.get("NodeName", ""), n["NodeID"])):
        dev = NodeDevice(n["NodeID"], n.get("NodeName") or n["NodeManagerAddress"], n["NodeManagerAddress"])
        out += [dev] * int(n["Resources"][resource])
    return out


def free_devices(offered: list[NodeDevice], held: list[NodeDevice | None]) -> list[NodeDevice]:
    """The devices in `offered` (alive nodes, inventory()'s order) that no slot in `held`
    holds: a node's units less the slots on it, so a slot whose node is alive keeps its
    unit (even while its worker restarts) and a slot of a node that left holds none. Pure."""
    holding: dict[str, int] = {}
    for d in held:
        if d is not None:
            holding[d.node_id] = holding.get(d.node_id, 0) + 1
    out = []
    for d in offered:
        if holding.get(d.node_id, 0) > 0:
            holding[d.node_id] -= 1
        else:
            out.append(d)
    return out


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class RayProcess:
    """A worker started by a Ray task (server/launcher.py WorkerProcess)."""

    def __init__(self, launcher: RayLauncher, device: NodeDevice, ref: Any, launch: str,
                 conn: asyncio.Future[Connection]) -> None:
        self._launcher = launcher
        self.device = device
        self.ref = ref
        self.launch = launch
        self._conn = conn
        self._pid: int | None = None
        self._code: int | None = None
        self.lost: str = ""  # why the task ended without an exit code (its node died, ...)
        self._killed = False
        self._done = asyncio.ensure_future(asyncio.wrap_future(ref.future()))
        self._done.add_done_callback(self._ended)

    def _ended(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            self._code = -9
            return
        err = fut.exception()
        if err is None:
            self._code = int(fut.result())
            return
        self._code = -9  # as a SIGKILL: the process is gone and said nothing
        self.lost = type(err).__name__
        if not self._conn.done():
            self._launcher.listener.forget(self.launch)

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def returncode(self) -> int | None:
        return self._code

    async def wait(self) -> int:
        """Until the task ended; a task whose end Ray does not report within the call
        timeout after a kill counts as ended (its node is unreachable: nothing to wait for)."""
        if self._code is None:
            await asyncio.wait({self._done}, timeout=self._launcher.cfg.call_timeout_s if self._killed else None)
        if self._code is None:  # killed, and Ray has not said the task ended: take it as gone
            self._code = -9
            self.lost = "no end reported after the kill"
        return self._code

    def kill(self) -> None:
        """Cancel the task by force: Ray kills its process, and the worker dies with it
        (engine/worker_env.py die_with_parent)."""
        if self._code is None:
            self._killed = True
            self._launcher.fire(lambda: self._launcher.ray.cancel(self.ref, force=True))
            self._launcher.listener.forget(self.launch)

    async def connected(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        await asyncio.wait({self._conn, self._done}, return_when=asyncio.FIRST_COMPLETED)
        if self._conn.done() and not self._conn.cancelled():
            c = self._conn.result()
            self._pid = c.pid
            return c.reader, c.writer
        self._launcher.listener.forget(self.launch)
        name = f"worker for device on node {self.device.node_name}"
        if self.lost in _GONE:
            raise WorkerError(f"{name}: its node left the Ray cluster ({self.lost})", "gone")
        raise WorkerError(f"{name} ended before it connected (exit {self._code}, {self.lost or 'no error'})",
                          "unavailable")


class RayLauncher:
    """Server/launcher.py's Launcher over a Ray cluster (module docs)."""

    def __init__(self, cfg: RayConfig, count: int) -> None:
        self.cfg = cfg
        self.count = count
        self.listener = ConnectBack(cfg.listen_host, cfg.listen_port, cfg.hello_timeout_s)
        self.devices: list[NodeDevice | None] = [None] * count  # by slot; None: absent
        self.ray: Any = None
        self._remote: Any = None
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="janusd-ray")
        self._trouble = ""

    @property
    def trouble(self) -> str:
        return self._trouble

    async def watch(self, period_s: float = 2.0) -> None:
        """Ask Ray for its nodes every `period_s`: a head that stops answering is reported
        (log once, /health) and its return too. Workers already connected keep serving
        meanwhile: their frames never pass through Ray (but Ray's raylets give up on a lost
        GCS after its reconnect timeout, gcs_rpc_server_reconnect_timeout_s, and their
        workers end with them)."""
        while True:
            await asyncio.sleep(period_s)
            try:
                await self.call(self.ray.nodes, "nodes")
                why = ""
            except Exception as e:  # WorkerError (timeout) or Ray's own error: both mean no answer
                why = str(e) or type(e).__name__
            if why and not self._trouble:
                log.warning(f"ray launcher: the Ray cluster is not answering ({why}); connected workers keep "
                            "serving, new workers cannot be placed")
            elif self._trouble and not why:
                log.info("ray launcher: the Ray cluster answers again")
            self._trouble = why

    async def call(self, fn: Callable[[], T], what: str, key: str = "call_timeout_s") -> T:
        """`fn` on the Ray thread pool, bounded by ray.`key` (a WorkerError past it)."""
        fut = asyncio.get_running_loop().run_in_executor(self._pool, fn)
        bound = getattr(self.cfg, key)
        try:
            return await asyncio.wait_for(fut, bound)
        except asyncio.TimeoutError:
            raise WorkerError(f"Ray did not answer {what} within {bound:g} s (ray.{key})", "unavailable") from None

    def fire(self, fn: Callable[[], Any]) -> None:
        """`fn` on the Ray thread pool, not awaited (a kill must not wait on Ray)."""
        def quiet() -> None:
            try:
                fn()
            except Exception as e:  # the task may already be gone: nothing to cancel
                log.debug(f"ray launcher: {e}")
        self._pool.submit(quiet)

    async def open(self) -> None:
        """Connect to the cluster (or start a local head), take the inventory, listen."""
        self.ray = await self.call(self._connect, "connect", "start_timeout_s")
        self._remote = self.ray.remote(run_worker)
        await self.listener.start()
        deadline = asyncio.get_running_loop().time() + self.cfg.device_wait_s
        while True:
            found = inventory(await self.call(self.ray.nodes, "nodes"), self.cfg.device_resource)
            if len(found) >= self.count or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.2)  # nodes may still be joining
        need = min(self.cfg.min_devices, self.count)
        if len(found) < need:
            names = sorted({d.node_name for d in found})
            raise WorkerError(f"the Ray cluster offers {len(found)} {self.cfg.device_resource} device(s) "
                              f"(nodes {names}) after {self.cfg.device_wait_s:g} s, ray.min_devices = {need}: "
                              f"start nodes with --resources '{{\"{self.cfg.device_resource}\": N}}'", "unavailable")
        found = found[: self.count]
        self.devices = [*found, *[None] * (self.count - len(found))]
        absent = f"; devices {len(found)}-{self.count - 1} absent until a node joins" if len(found) < self.count else ""
        log.info("ray launcher: " + ", ".join(f"device {i} on {d.node_name} ({d.host}, node {d.node_id[:8]})"
                                              for i, d in enumerate(found))
                 + f"{absent}; workers connect back to {self.listener.host}:{self.listener.port}")

    async def adopt(self, free: list[int]) -> list[int]:
        """Server/launcher.py's Launcher.adopt: one Ray call (bounded); a Ray that does not
        answer adopts nothing this time (watch reports it)."""
        try:
            nodes = await self.call(self.ray.nodes, "nodes")
        except Exception as e:  # WorkerError (timeout) or Ray's own: try again next check
            log.debug(f"ray launcher: looking for joined nodes: {e}")
            return []
        # an absent slot holds nothing (its node left, or its worker did not start: the
        # same unit may be offered to it again)
        held = [None if i in free else d for i, d in enumerate(self.devices)]
        taken = free_devices(inventory(nodes, self.cfg.device_resource), held)
        out = []
        for slot, dev in zip(sorted(free), taken):
            self.devices[slot] = dev
            out.append(slot)
            log.info(f"ray launcher: device {slot} on {dev.node_name} ({dev.host}, node {dev.node_id[:8]}), "
                     "a node that joined")
        return out

    def _connect(self) -> Any:
        """ray.init on a thread (blocking). On loopback, Ray's own switch keeps 127.0.0.1:
        it otherwise resolves a loopback address to the host's outward one
        (services.resolve_ip_for_localhost) and never finds a cluster bound to loopback."""
        import ray
        import ray._private.ray_constants as ray_constants

        r = self.cfg
        if _is_loopback(r.node_ip_address):
            ray_constants.ENABLE_RAY_CLUSTER = False
        common: dict[str, Any] = dict(_node_ip_address=r.node_ip_address, logging_level=logging.WARNING,
                                      log_to_driver=False, ignore_reinit_error=True)
        if r.address:
            ray.init(address=r.address, **common)
        else:
            ray.init(num_cpus=r.head_num_cpus, include_dashboard=False,
                     object_store_memory=r.head_object_store_mib << 20,
                     resources={r.device_resource: r.head_devices or self.count}, **common)
        return ray

    def placement(self, device_index: int) -> Placement:
        d = self.devices[device_index] if device_index < len(self.devices) else None
        if d is None:
            return Placement(host="", node="absent")
        return Placement(host=d.host, node=d.node_name)

    def present(self, device_index: int) -> bool:
        return device_index < len(self.devices) and self.devices[device_index] is not None

    def _dial_host(self) -> str:
        h = self.listener.host
        return self.cfg.node_ip_address if h in ("0.0.0.0", "::", "") else h

    async def spawn(self, device_index: int, worker_args: list[str]) -> RayProcess:
        d = self.devices[device_index]
        if d is None:
            raise WorkerError(f"device {device_index}: no Ray node offers it (absent)", "gone")
        nodes = await self.call(self.ray.nodes, "nodes")
        if not any(n["NodeID"] == d.node_id and n.get("Alive") for n in nodes):
            raise WorkerError(f"device {device_index}: its node {d.node_name} ({d.node_id[:8]}) has left the "
                              "Ray cluster", "gone")
        launch, conn = self.listener.new_launch(device_index)
        args = [*worker_args, "--connect", f"{self._dial_host()}:{self.listener.port}", "--launch", launch]

        def submit() -> Any:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            where = NodeAffinitySchedulingStrategy(d.node_id, soft=False)
            return self._remote.options(num_cpus=0, resources={self.cfg.device_resource: 1}, max_retries=0,
                                        scheduling_strategy=where, name=f"janusd-worker-{device_index}"
                                        ).remote(args, self.listener.token)
        try:
            ref = await self.call(submit, "a worker's task")
        except BaseException:
            self.listener.forget(launch)
            raise
        return RayProcess(self, d, ref, launch, conn)

    async def close(self) -> None:
        """Stop listening and leave the cluster; a local head of ours is stopped with it,
        also one whose start ran past ray.start_timeout_s (its processes would outlive us)."""
        await self.listener.close()
        ray = self.ray if self.ray is not None else (sys.modules.get("ray") if not self.cfg.address else None)
        if ray is not None:
            try:
                await self.call(ray.shutdown, "shutdown")
            except Exception as e:  # bounded and best effort: the daemon is exiting
                log.warning(f"ray launcher: leaving the cluster: {e}")
        self._pool.shutdown(wait=False, cancel_futures=True)
