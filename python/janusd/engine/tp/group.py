"""LocalGroup: a tensor-parallel instance on N local devices, driven from this process.

It hosts the instance's rendezvous store (a TCPStore on 127.0.0.1, any free port), starts
N shard processes (`python -m janusd.engine.tp.proc`, spawn/exec) on devices
`device_indices`, and talks to the leader (rank 0) over a socket pair; the leader drives
the followers through their process group. What `janus generate --tp N`, `janus bench tp`
and the tests use; the daemon runs its groups on its device workers instead
(engine/worker_tp.py, DESIGN.md "Tensor parallelism").

Every wait is bounded: a reply that does not come within `reply_timeout_s`, or a shard
process that exits, is an EngineError naming it (and the group is stopped), never a hang.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from janusd.engine.tp import msgs
from janusd.engine.types import EngineError, SamplingParams


class LocalGroup:
    def __init__(self, tp: int, *, kind: str = "cpu", device_indices: list[int] | None = None, threads: int = 1,
                 timeout_s: float = 60.0, reply_timeout_s: float = 600.0, cpu_cores: list[list[int]] | None = None,
                 memory_bytes: int = 1 << 30, page_size: int = 2 << 20) -> None:
        """`threads`: torch intra-op threads per shard; `timeout_s`: how long a collective
        waits for a silent peer; `cpu_cores`: host cores per shard (cpu devices; None: any);
        `memory_bytes` / `page_size`: each shard's device pool (on cpu its pages take host
        memory only once used)."""
        if tp < 1:
            raise EngineError(f"tp must be >= 1, got {tp}")
        devices = list(device_indices) if device_indices is not None else list(range(tp))
        if len(devices) != tp or len(set(devices)) != tp:
            raise EngineError(f"tp {tp} needs {tp} distinct devices, got {devices}")
        self.tp = tp
        self.kind = kind
        self.devices = devices
        self.reply_timeout_s = reply_timeout_s
        self.procs: list[subprocess.Popen[bytes]] = []
        self._dec = msgspec.msgpack.Decoder(msgs.FromLeader)
        self._closed = False
        store = None
        if tp > 1:
            from janusd.engine.tp.comm import open_store

            store = open_store("127.0.0.1", 0, timeout_s, is_master=True)
        self._store = store  # kept alive: the shards rendezvous through it
        ours, theirs = socket.socketpair()
        from janusd.wire.framing import BlockingFramedSocket

        self.conn = BlockingFramedSocket(ours)
        env = dict(os.environ)
        try:
            for rank, dev in enumerate(devices):
                cmd = [sys.executable, "-m", "janusd.engine.tp.proc", "--rank", str(rank), "--size", str(tp),
                       "--kind", kind, "--device-index", str(dev), "--threads", str(threads),
                       "--timeout", str(timeout_s), "--memory-bytes", str(memory_bytes),
                       "--page-size", str(page_size)]
                if store is not None:
                    cmd += ["--store-port", str(store.port)]
                if rank == 0:
                    cmd += ["--fd", str(theirs.fileno())]
                if cpu_cores is not None:
                    cmd = ["taskset", "-c", ",".join(map(str, cpu_cores[rank])), *cmd]
                self.procs.append(subprocess.Popen(cmd, env=env, pass_fds=(theirs.fileno(),) if rank == 0 else ()))
        except BaseException:
            self.close(force=True)
            raise
        finally:
            theirs.close()

    # ---- requests ----
    def _reply(self, deadline: float, on_out: Callable[[msgs.Out], None] | None = None) -> Any:
        sock = self.conn.sock
        while True:
            for rank, p in enumerate(self.procs):
                code = p.poll()
                if code is not None:  # no shard ends while a request is out
                    ready, _, _ = select.select([sock], [], [], 0.2)  # the leader's last words first
                    if not ready:
                        self.close(force=True)
                        raise EngineError(f"tp shard {rank} (device {self.kind}:{self.devices[rank]}) exited "
                                          f"with code {code}")
            left = deadline - time.monotonic()
            if left <= 0:
                self.close(force=True)
                raise EngineError(f"tp group: no reply from the leader within {self.reply_timeout_s:.0f} s")
            ready, _, _ = select.select([sock], [], [], min(left, 0.2))
            if not ready:
                continue
            body = self.conn.recv()
            if body is None:
                codes = [p.poll() for p in self.procs]
                self.close(force=True)
                raise EngineError(f"tp group: the leader closed its socket (exit codes {codes})")
            msg = self._dec.decode(body)
            if isinstance(msg, msgs.Out):
                if on_out is not None:
                    on_out(msg)
                continue
            return msg

    def request(self, msg: Any, on_out: Callable[[msgs.Out], None] | None = None) -> Any:
        """Send one request to the leader and wait for its reply (Out frames go to `on_out`);
        an Error reply raises EngineError with its message."""
        if self._closed:
            raise EngineError("tp group is closed")
        self.conn.send(msg)
        reply = self._reply(time.monotonic() + self.reply_timeout_s, on_out)
        if isinstance(reply, msgs.Error):
            raise EngineError(reply.message)
        return reply

    def load(self, spec: str, name: str = "m", **kw: Any) -> msgs.Loaded:
        return self.request(msgs.Load(spec=spec, name=name, **kw))

    def unload(self, name: str) -> None:
        self.request(msgs.Unload(name))

    def generate(self, prompts: dict[str, list[int]], params: SamplingParams, *, model: str = "m",
                 logits: bool = False, on_out: Callable[[msgs.Out], None] | None = None) -> msgs.Generated:
        return self.request(msgs.Generate(prompts=prompts, params=params, model=model, logits=logits,
                                          stream=on_out is not None), on_out)

    def bench(self, model: str = "m", **kw: Any) -> dict[str, float]:
        return self.request(msgs.Bench(model=model, **kw)).figures

    # ---- life ----
    def close(self, force: bool = False, wait_s: float = 10.0) -> list[int | None]:
        """Stop every shard (Stop to the leader, which stops the followers); kill what is
        still running after `wait_s` (or at once with `force`). Returns the exit codes."""
        if not self._closed and not force:
            try:
                self.conn.send(msgs.Stop())
            except OSError:
                pass
        self._closed = True
        deadline = time.monotonic() + (0.0 if force else wait_s)
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        try:
            self.conn.sock.close()
        except OSError:
            pass
        return [p.returncode for p in self.procs]

    def __enter__(self) -> LocalGroup:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
