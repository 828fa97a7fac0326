"""The first frame of a worker that connects to the daemon over TCP (the ray launcher):
who it is and the daemon's token.

A locally launched worker needs none: the socketpair it inherited can only lead to the
daemon that made it. A TCP listener can be reached by anyone who can route to it, so it
serves a connection only after this frame proves the peer was given the per-start token
(server/connect_back.py). Its own decoder and a small frame limit: nothing else is read
from a peer before it has proven itself.
"""

from __future__ import annotations

import msgspec

# the environment variable that carries the token to a worker (never its command line)
TOKEN_ENV = "JANUSD_WORKER_TOKEN"
# a Hello is a few hundred bytes; a peer announcing more is refused before any allocation
HELLO_MAX_BYTES = 4096


class Hello(msgspec.Struct, array_like=True, gc=False, tag=True):
    """`launch`: the id the daemon gave this start of the device's worker (a worker of an
    older start that connects late is refused); `pid`: the worker's process id on its node
    (`ctl status`, logs)."""

    token: str
    launch: str
    pid: int


def hello_decoder() -> msgspec.msgpack.Decoder[Hello]:
    return msgspec.msgpack.Decoder(Hello)
