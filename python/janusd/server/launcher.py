"""How a device's worker process comes to be: the launcher behind server/workers.py's
WorkerHandle (config `devices.launcher`).

The handle owns a worker's protocol (handshake, frames, heartbeat, death, restart); a
launcher owns only where the process runs and how its byte stream reaches the daemon.
Two are built:
- `local` (LocalLauncher, the default): `python -m janusd.engine.worker` exec'd on this
  host with one end of a socketpair as an inherited fd, as janusd always did;
- `ray` (server/ray_launcher.py): a Ray task on the node that owns the device starts the
  same module there, and it connects back over TCP with the daemon's token
  (server/connect_back.py).
Either way the handle then reads and writes the same length-prefixed msgspec frames
(wire/framing.py); nothing else crosses the edge.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Placement:
    """Where a device's worker runs: `host` is the address its transfer engine publishes
    (a fork's or a P/D handoff's peer reads it there), `node` names the machine for
    operators (`ctl pools`, `ctl instances`)."""

    host: str = "127.0.0.1"
    node: str = "local"


class WorkerProcess(Protocol):
    """A launched worker as the handle sees it, whatever runs it.

    `pid` is the worker's own process id on its node (None until it is known: a remote
    worker tells it when it connects); `returncode` is None while it runs."""

    @property
    def pid(self) -> int | None: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int:
        """Until the process is gone; its exit code (negative: a signal, or lost with its node)."""
        ...

    def kill(self) -> None:
        """End it now (SIGKILL or the launcher's equivalent); its death then takes the usual
        path (EOF and wait()). Never raises for a process already gone."""
        ...

    async def connected(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The worker's frame stream. Raises WorkerError when it cannot come (the process
        ended or its node is gone); the handle bounds the wait by its ready timeout."""
        ...


class Launcher(Protocol):
    """Starts one device's worker process with the worker's own arguments (everything but
    how it reaches the daemon) and says where each device lives."""

    def placement(self, device_index: int) -> Placement: ...

    def present(self, device_index: int) -> bool:
        """Whether a node offers the device slot now (False: absent, no worker to start)."""
        ...

    async def adopt(self, free: list[int]) -> list[int]:
        """Give the slots in `free` (absent ones) the devices of nodes that joined since;
        the slots now present (server/node_joins.py starts their workers). Bounded."""
        ...

    async def open(self) -> None:
        """Before the first spawn: reach the cluster, learn where each device is (raises
        WorkerError with what is wrong; bounded)."""
        ...

    async def spawn(self, device_index: int, worker_args: list[str]) -> WorkerProcess:
        """Start the worker; raise WorkerError (kind "gone" when the device's node has left
        the cluster for good, "unavailable" otherwise) when it cannot be started."""
        ...

    async def watch(self) -> None:
        """Run while the daemon serves: keep `trouble` current (bounded calls, never raises)."""
        ...

    @property
    def trouble(self) -> str:
        """Why the cluster behind the launcher is not answering now ("" when it is): /health."""
        ...

    async def close(self) -> None: ...


class LocalProcess:
    """A worker exec'd on this host, its socketpair end already connected."""

    def __init__(self, proc: asyncio.subprocess.Process, parent: socket.socket) -> None:
        self.proc = proc
        self._parent: socket.socket | None = parent

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def wait(self) -> int:
        return await self.proc.wait()

    def kill(self) -> None:
        try:
            self.proc.kill()  # SIGKILL ends a stopped process too
        except ProcessLookupError:
            pass

    async def connected(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        parent, self._parent = self._parent, None
        if parent is None:
            raise RuntimeError("a local worker's stream is handed out once")
        return await asyncio.open_unix_connection(sock=parent)


class LocalLauncher:
    """Today's workers: children of the daemon on this host (module docs)."""

    def placement(self, device_index: int) -> Placement:
        return Placement()

    def present(self, device_index: int) -> bool:
        return True  # every slot is a device of this host

    async def adopt(self, free: list[int]) -> list[int]:
        return []  # no node ever joins: this host is the inventory

    async def open(self) -> None:
        return None

    async def spawn(self, device_index: int, worker_args: list[str]) -> LocalProcess:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        cmd = [sys.executable, "-m", "janusd.engine.worker", "--fd", str(child.fileno()), *worker_args]
        try:
            proc = await asyncio.create_subprocess_exec(*cmd, pass_fds=(child.fileno(),),
                                                        stdin=asyncio.subprocess.DEVNULL)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return LocalProcess(proc, parent)

    async def watch(self) -> None:
        return None

    @property
    def trouble(self) -> str:
        return ""

    async def close(self) -> None:
        return None

