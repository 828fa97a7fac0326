"""The daemon's TCP listener that remote workers connect back to (the ray launcher).

Ray only places and supervises a worker; its frames come here, on a plain TCP stream
carrying wire/framing.py's frames, never through Ray's object store or pickle. The
listener binds exactly the configured address (`ray.listen_host`, loopback by default), so
it is reachable only where the operator opened it. Who connects must prove it was started
by this daemon: its first frame is a wire/hello.py Hello with the token made at this
daemon's start (secrets.token_hex; it travels to the worker as a Ray task argument and an
environment variable, never on a command line and never in a log). A peer that sends
anything else, a wrong token, a launch nobody waits for, or nothing within
`hello_timeout_s` is closed without a single byte of reply: it learns nothing about the
daemon, not even that the token was the problem.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
import socket
from dataclasses import dataclass

import msgspec

from janusd.log import log
from janusd.wire.framing import FrameError, read_frame
from janusd.wire.hello import HELLO_MAX_BYTES, hello_decoder


@dataclass(frozen=True)
class Connection:
    """A worker that proved itself: its stream and its pid on its node."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pid: int


class ConnectBack:
    """One listener per daemon start; `expect(launch)` before a worker of that launch is
    started, then await the future it returns (bounded by the caller)."""

    def __init__(self, host: str, port: int = 0, hello_timeout_s: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.hello_timeout_s = hello_timeout_s
        self._token = secrets.token_hex(32)
        self._waiting: dict[str, asyncio.Future[Connection]] = {}
        self._server: asyncio.Server | None = None
        self._launches = 0
        self.refused = 0  # connections closed without a reply, ever

    @property
    def token(self) -> str:
        """The per-start secret (for the launcher to hand to its workers; never log it)."""
        return self._token

    def __repr__(self) -> str:  # the token stays out of every repr and log line
        return f"ConnectBack({self.host}:{self.port}, waiting={sorted(self._waiting)}, refused={self.refused})"

    async def start(self) -> None:
        """Listen on host:port (port 0: one the kernel picks; `port` then says which)."""
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        for fut in self._waiting.values():
            if not fut.done():
                fut.cancel()
        self._waiting.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def new_launch(self, device_index: int) -> tuple[str, asyncio.Future[Connection]]:
        """A fresh launch id for `device_index` and the future its worker's connection ends."""
        self._launches += 1
        launch = f"d{device_index}.{self._launches}.{secrets.token_hex(4)}"
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._waiting[launch] = fut
        return launch, fut

    def forget(self, launch: str) -> None:
        """That launch is over (connected, failed or given up): a late connection for it is refused."""
        fut = self._waiting.pop(launch, None)
        if fut is not None and not fut.done():
            fut.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            body = await asyncio.wait_for(read_frame(reader, HELLO_MAX_BYTES), self.hello_timeout_s)
            hello = hello_decoder().decode(body) if body is not None else None
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError, FrameError, msgspec.DecodeError):
            hello = None
        ok = hello is not None and hmac.compare_digest(hello.token.encode(), self._token.encode())
        fut = self._waiting.get(hello.launch) if hello is not None and ok else None
        if hello is None or fut is None or fut.done():
            self.refused += 1
            why = "no hello" if hello is None else "a wrong token" if not ok else "a launch nobody waits for"
            log.warning(f"worker listener: refused a connection from {peer}: {why}")
            writer.close()
            return
        del self._waiting[hello.launch]
        sock = writer.get_extra_info("socket")
        if sock is not None:  # token batches are small frames: no Nagle delay on them
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        fut.set_result(Connection(reader, writer, hello.pid))
