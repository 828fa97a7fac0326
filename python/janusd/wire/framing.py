"""Length-prefixed msgpack frames over stream sockets (worker and admin sockets).

A frame is a 4-byte big-endian unsigned length followed by that many bytes of msgpack.
Why a length prefix and not msgpack's own streaming: the reader can refuse an absurd
length before allocating, and a truncated frame (peer died mid-write) is detected as
EOF instead of a confusing decode error. No pickle anywhere: payloads are msgspec
Structs decoded against a closed tagged union, so a peer can only send known messages.

Two sides use this: the daemon (asyncio streams) and the worker (a blocking socket in
its own threads). Both helpers live here so the two processes share one definition.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from typing import Any

import msgspec

HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 64 << 20


class FrameError(ValueError):
    """A peer sent something that is not a valid frame (too large, or undecodable)."""


class _Closed(EOFError):
    pass


def encode_frame(encoder: msgspec.msgpack.Encoder, msg: Any) -> bytes:
    body = encoder.encode(msg)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return HEADER.pack(len(body)) + body


def _check_length(n: int, limit: int) -> None:
    if n > limit:
        raise FrameError(f"peer announced a frame of {n} bytes (limit {limit})")


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> bytes | None:
    """The next frame body, or None on a clean EOF at a frame boundary.

    EOF in the middle of a frame raises asyncio.IncompleteReadError (the peer died)."""
    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    (n,) = HEADER.unpack(head)
    _check_length(n, limit)
    return await reader.readexactly(n)


class BlockingFramedSocket:
    """A connected stream socket read by one thread and written by any (send is locked)."""

    def __init__(self, sock: socket.socket, encoder: msgspec.msgpack.Encoder | None = None) -> None:
        self.sock = sock
        self.encoder = encoder or msgspec.msgpack.Encoder()
        self._send_lock = threading.Lock()

    def send(self, msg: Any) -> None:
        data = encode_frame(self.encoder, msg)
        with self._send_lock:
            self.sock.sendall(data)

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise _Closed()
            buf += chunk
        return bytes(buf)

    def recv(self, limit: int = MAX_FRAME_BYTES) -> bytes | None:
        """Next frame body; None on EOF (clean or mid-frame: either way the peer is gone)."""
        try:
            head = self._recv_exact(HEADER.size)
            (n,) = HEADER.unpack(head)
            _check_length(n, limit)
            return self._recv_exact(n)
        except (_Closed, ConnectionResetError):
            return None
