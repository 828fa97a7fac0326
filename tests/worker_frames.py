"""What a worker process sent over its socket, for tests that drive WorkerProc directly."""

from __future__ import annotations

import socket
from typing import Any

from janusd.wire import worker_msgs as wm
from janusd.wire.framing import BlockingFramedSocket


def sent_frames(a: socket.socket, b: socket.socket) -> list[Any]:
    """Everything the worker sent on `a`, read from `b`, in order (closes `a` first)."""
    a.close()
    rx, dec = BlockingFramedSocket(b), wm.from_worker_decoder()
    out = []
    while (body := rx.recv()) is not None:
        out.append(dec.decode(body))
    return out
