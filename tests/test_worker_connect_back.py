"""The worker listener of the ray launcher (server/connect_back.py) over real sockets: a
worker that presents the daemon's token is served, anything else is closed without a
byte of reply, and the listener is reachable only at the address it was given.

The served case is a real worker process (`python -m janusd.engine.worker --connect`),
started here the way server/ray_task.py starts it on a Ray node, behind a real
WorkerHandle: only where the process runs is the test's (a launcher at the edge)."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time

import msgspec
import pytest
import uvloop

from daemon_harness import until
from janusd.config import DevicesConfig
from janusd.server.connect_back import ConnectBack
from janusd.server.launcher import Placement
from janusd.server.workers import WorkerError, WorkerHandle
from janusd.wire import worker_msgs as wm
from janusd.wire.framing import HEADER, encode_frame
from janusd.wire.hello import TOKEN_ENV, Hello


def _frame(msg: object) -> bytes:
    return encode_frame(msgspec.msgpack.Encoder(), msg)


async def _reply_bytes(host: str, port: int, payload: bytes, timeout_s: float = 3.0) -> bytes:
    """Everything the listener sends back to a peer that sent `payload`, until it closes."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(payload)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout_s)  # b"" once the listener closed it
    writer.close()
    return data


def test_only_the_token_and_a_waited_launch_are_served_everything_else_is_closed_silently():
    async def go():
        lb = ConnectBack("127.0.0.1", 0, hello_timeout_s=0.3)
        await lb.start()
        launch, fut = lb.new_launch(0)
        port = lb.port
        assert lb.token not in repr(lb)
        bad = [
            _frame(Hello("0" * 64, launch, 1)),  # a wrong token for a real launch
            _frame(Hello(lb.token, "d0.99.none", 1)),  # the token, but no launch waits for it
            _frame(wm.Ready(1, 0, "cpu")),  # a worker message before proving anything
            HEADER.pack(1 << 20) + b"x",  # a frame past the Hello limit
            b"",  # nothing at all: the hello timeout closes it
        ]
        for i, payload in enumerate(bad):
            assert await _reply_bytes("127.0.0.1", port, payload) == b"", f"case {i} got a reply"
            assert lb.refused == i + 1
            assert not fut.done()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_frame(Hello(lb.token, launch, 4242)))
        conn = await asyncio.wait_for(fut, 3.0)
        assert conn.pid == 4242 and lb.refused == len(bad)
        conn.writer.write(b"ping")  # the served stream is the worker's: bytes flow both ways
        assert await reader.readexactly(4) == b"ping"
        late = _frame(Hello(lb.token, launch, 1))  # the same launch again: it is over
        assert await _reply_bytes("127.0.0.1", port, late) == b""
        writer.close()
        conn.writer.close()
        await lb.close()

    uvloop.run(go())


def _other_local_address() -> str:
    """An address of this host that is not 127.0.0.1 (the outward one, else 127.0.0.2)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the route's source
            addr = s.getsockname()[0]
        except OSError:
            addr = "127.0.0.2"
    return addr if addr != "127.0.0.1" else "127.0.0.2"


def test_the_listener_binds_only_the_configured_address():
    async def go():
        lb = ConnectBack("127.0.0.1", 0)
        await lb.start()
        assert [s.getsockname()[0] for s in lb._server.sockets] == ["127.0.0.1"]
        other = _other_local_address()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(other, lb.port)
        await lb.close()

    uvloop.run(go())


class _TcpProcess:
    """A worker started on this host that dials the listener, as server/ray_task.py does."""

    def __init__(self, proc: asyncio.subprocess.Process, conn: asyncio.Future) -> None:
        self.proc, self._conn = proc, conn
        self._pid: int | None = None

    pid = property(lambda self: self._pid)
    returncode = property(lambda self: self.proc.returncode)

    async def wait(self) -> int:
        return await self.proc.wait()

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()

    async def connected(self):
        exited = asyncio.ensure_future(self.proc.wait())
        await asyncio.wait({self._conn, exited}, return_when=asyncio.FIRST_COMPLETED)
        if not self._conn.done():
            raise WorkerError(f"the worker exited ({self.proc.returncode}) before it was served", "unavailable")
        exited.cancel()
        c = self._conn.result()
        self._pid = c.pid
        return c.reader, c.writer


class _TcpLauncher:
    def __init__(self, listener: ConnectBack, token: str) -> None:
        self.listener, self.token = listener, token

    def placement(self, device_index: int) -> Placement:
        return Placement("127.0.0.1", "tcp-test")

    async def open(self) -> None:
        await self.listener.start()

    async def spawn(self, device_index: int, worker_args: list[str]) -> _TcpProcess:
        launch, conn = self.listener.new_launch(device_index)
        env = {**os.environ, TOKEN_ENV: self.token}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "janusd.engine.worker", *worker_args,
            "--connect", f"127.0.0.1:{self.listener.port}", "--launch", launch, env=env,
            stdin=asyncio.subprocess.DEVNULL)
        return _TcpProcess(proc, conn)

    async def close(self) -> None:
        await self.listener.close()


def _handle(launcher: _TcpLauncher, deaths: list[float]) -> WorkerHandle:
    return WorkerHandle(0, DevicesConfig(count=1, memory_mib=64), on_batch=lambda w, b: None,
                        on_failed=lambda w, f: None, on_death=lambda w: deaths.append(time.monotonic()),
                        launcher=launcher)


def test_a_worker_with_the_token_is_served_over_tcp_and_its_death_is_seen_by_eof(monkeypatch):
    monkeypatch.setenv("JANUSD_WORKER_TORCH_THREADS", "1")

    async def go():
        lb = ConnectBack("127.0.0.1", 0)
        good = _TcpLauncher(lb, lb.token)
        await good.open()
        deaths: list[float] = []
        h = _handle(good, deaths)
        await h.start(60.0)
        assert h.ready and h.pid == h.proc.proc.pid  # the pid its Hello told
        assert h.placement.node == "tcp-test" and "--transfer-host" in h.worker_args()
        stats = await h.call(lambda seq: wm.GetStats(seq), 10.0)
        assert isinstance(stats, wm.Stats) and stats.pool["num_pages"] == 32  # 64 MiB of 2 MiB pages
        t_kill = time.monotonic()
        h.proc.kill()
        assert await until(lambda: deaths, 3.0)
        assert deaths[0] - t_kill < 1.0  # the stream's EOF reports it, as a socketpair's would
        forged = _TcpLauncher(lb, "f" * 64)  # a worker that does not know the token
        bad = _handle(forged, [])
        with pytest.raises(WorkerError, match="exited .* before it was served"):
            await bad.start(30.0)  # refused without a reply, it finds its stream closed and exits
        assert lb.refused == 1 and bad.state == "dead"
        await lb.close()

    uvloop.run(go())
