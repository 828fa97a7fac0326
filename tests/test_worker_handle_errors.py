"""The daemon's side of a worker's frames (server/workers.py WorkerHandle) when handling
one goes wrong: one bad output does not take the rest of its step's batch down, the
request it failed on is ended (an Abort to the worker, a 500 to its client), the error
is logged with its traceback and counted, and the errors the worker counted reach
/metrics as janusd_worker_errors.

The worker is faked at its socket (frames fed to the reader, Aborts read back); the
handlers in the first test are the owner's, the edge WorkerHandle calls out to.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from typing import Any

import msgspec

from janusd.config import DevicesConfig, parse_config
from janusd.server.daemon import Daemon
from janusd.server.workers import WorkerHandle
from janusd.wire import worker_msgs as wm
from janusd.wire.framing import BlockingFramedSocket, encode_frame


def _delta(rid: int, token: int, finished: bool = False) -> wm.TokenDelta:
    return wm.TokenDelta(rid, [token], f"t{token}", finished)


async def _feed(h: WorkerHandle, frames: list[Any]) -> list[Any]:
    """Run the handle's reader over `frames` from a fake worker; returns what the handle
    sent back to it."""
    ours, theirs = socket.socketpair()
    _, h._writer = await asyncio.open_unix_connection(sock=ours)
    h.state = "ready"
    reader = asyncio.StreamReader()
    enc = msgspec.msgpack.Encoder()
    for f in frames:
        reader.feed_data(encode_frame(enc, f))
    reader.feed_eof()
    await h._read_loop(reader, proc=None)  # type: ignore[arg-type]  # no process: _died ignores it
    await h._writer.drain()
    h._writer.close()
    await h._writer.wait_closed()
    rx, dec = BlockingFramedSocket(theirs), wm.to_worker_decoder()
    sent = []
    while (body := rx.recv()) is not None:
        sent.append(dec.decode(body))
    return sent


def test_one_bad_output_does_not_drop_its_neighbours_and_ends_only_its_own_request(caplog):
    delivered: list[tuple[int, list[int]]] = []
    failed: list[wm.RequestFailed] = []
    errors: list[tuple[str, int]] = []
    deaths: list[int] = []

    def on_batch(w: WorkerHandle, b: wm.StepBatch) -> None:
        for d in b.outputs:
            if d.req_id == 2:
                raise ValueError("bad output")
            delivered.append((d.req_id, d.token_ids))

    def on_failed(w: WorkerHandle, f: wm.RequestFailed) -> None:
        if f.req_id == 5:
            raise KeyError("bad failure")
        failed.append(f)

    h = WorkerHandle(0, DevicesConfig(count=1, memory_mib=64), on_batch, on_failed, lambda w: deaths.append(1),
                     on_error=lambda w, where, n: errors.append((where, n)))
    h.proc = object()  # type: ignore[assignment]  # the reader is about another process: no death is reported
    frames = [
        wm.StepBatch([_delta(1, 11), _delta(2, 21), _delta(3, 31)]),
        wm.RequestFailed(5, "KV cache exhausted", "unavailable"),
        wm.StepBatch([_delta(1, 12, True), _delta(3, 32, True)]),
        wm.RequestFailed(6, "prompt too long", "bad_request"),
    ]
    with caplog.at_level(logging.ERROR, logger="janusd"):
        sent = asyncio.run(_feed(h, frames))

    assert delivered == [(1, [11]), (3, [31]), (1, [12]), (3, [32])]  # in order, nothing after the bad one lost
    assert [(f.req_id, f.kind) for f in failed] == [(2, "internal"), (6, "bad_request")]
    assert "failed handling the request's output" in failed[0].message
    assert [type(m).__name__ for m in sent] == ["Abort"] and sent[0].req_id == 2  # the worker stops it
    assert errors == [("handler", 1), ("handler", 1)]
    records = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [re.search(r"request \d+", r.getMessage()).group(0) for r in records] == ["request 2", "request 5"]
    assert all(r.exc_info is not None for r in records)
    assert records[0].exc_info[0] is ValueError and records[1].exc_info[0] is KeyError
    assert deaths == []


BASE = "[devices]\ncount = 2\n[[models]]\nname = 'm'\ncheckpoint = 'demo:llama-tiny'\n"


def _stats(seq: int, errors: dict[str, int]) -> wm.Stats:
    return wm.Stats(seq, {}, [], 0, errors=errors)


def _metric(text: str, device: int, where: str) -> float | None:
    m = re.search(rf'^janusd_worker_errors_total{{device="{device}",where="{where}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_the_workers_counts_reach_metrics_as_their_growth_per_process():
    d = Daemon(parse_config(BASE))
    w0, w1 = d.workers
    w0.proc = w1.proc = object()  # type: ignore[assignment]
    asyncio.run(_feed(w0, [_stats(1, {"abort": 2}), _stats(2, {"abort": 3, "tokenize": 1}),
                           _stats(3, {"abort": 3, "tokenize": 1})]))
    asyncio.run(_feed(w1, [_stats(1, {"tokenize": 4})]))
    text = d.metrics_text().decode()
    assert _metric(text, 0, "abort") == 3.0 and _metric(text, 0, "tokenize") == 1.0
    assert _metric(text, 1, "tokenize") == 4.0 and _metric(text, 1, "abort") is None
    # a restarted worker counts from zero again: its first Stats is all new
    w0._worker_errors = {}  # what start() does for the new process
    asyncio.run(_feed(w0, [_stats(1, {"abort": 1})]))
    assert _metric(d.metrics_text().decode(), 0, "abort") == 4.0
