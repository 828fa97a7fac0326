"""Device worker processes seen from the daemon: spawn, handshake, talk, notice death.

A worker is started by its launcher (server/launcher.py: by default an exec of
`python -m janusd.engine.worker` with one end of a socketpair passed as an inherited fd;
with `devices.launcher = "ray"` a Ray task on the device's node that connects back over
TCP). The daemon serves a worker only after its Ready frame arrived within
`worker_ready_timeout_s`.

Death is noticed two ways: EOF on the socket (the kernel closes the worker's end the
moment the process dies, so kill -9 is seen within milliseconds) and the process
sentinel (`proc.wait()`). Both run `_died(proc)`, which acts once: it fails every
pending reply and tells the owner (the daemon), which fails in-flight requests and
schedules a restart. Two orderings matter:
- the exit can be seen while the reader is still behind, with frames the worker wrote
  before dying (finished requests, replies) unread in the socket; the exit watcher
  therefore waits for the reader to reach EOF, for at most READER_DRAIN_S, before it
  reports the death, so those frames count and a death is still reported within 1 s;
- each signal names the process it is about, and one about a previous process (a late
  watcher after a restart began) is ignored instead of killing the new worker's state.
Hangs: a worker that stops without dying (SIGSTOP, a deadlocked step, a stuck driver
call) is found by a heartbeat: every `heartbeat_s` a Ping goes out, answered by the
worker's reader thread with how long its main thread has been inside one step or
command. No answer within `heartbeat_timeout_s`, or a step running past
`step_timeout_s`, and the worker is declared hung (`hung` says why): it is killed with
SIGKILL (which also ends a stopped process) and its death then takes the usual path, so
the owner fails its requests (as worker_hung) and restarts it.
Errors: a handler of the owner's that raises on one output is logged with its traceback
and counted (`on_error`, where="handler"); that request is ended (Abort to the worker, a
RequestFailed to the owner) and the batch's other outputs are still delivered, one at a
time. The errors the worker itself caught and served past arrive as counts in its Stats
replies; their growth is counted the same way (where="abort", "tokenize", ...).
This file knows processes and frames, nothing about requests.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from janusd.config import DevicesConfig
from janusd.log import log
from janusd.server.daemon_clock import clock
from janusd.server.launcher import Launcher, LocalLauncher, Placement, WorkerProcess
from janusd.server.process_states import WORKER_MOVES, WorkerState, moved
from janusd.wire import worker_msgs as wm
from janusd.wire.framing import FrameError, encode_frame, read_frame

# How long the exit watcher lets the reader drain frames the dead worker had already
# written before it reports the death itself (EOF normally follows within milliseconds).
READER_DRAIN_S = 0.5


@dataclass(frozen=True)
class Liveness:
    """Heartbeat bounds (config [server] worker_heartbeat_s, worker_heartbeat_timeout_s,
    worker_step_timeout_s); heartbeat_s = 0 turns the heartbeat off."""

    heartbeat_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    step_timeout_s: float = 60.0

W = WorkerState


class WorkerError(RuntimeError):
    """A worker could not start, died, or answered a command with an error. `kind`: the
    worker's own (bad_request, unavailable, internal: a bug it caught), or unavailable
    when the process is not there to answer."""

    def __init__(self, message: str, kind: str = "internal") -> None:
        super().__init__(message)
        self.kind = kind


class WorkerHandle:
    """One device worker process and its socket."""

    def __init__(
        self,
        device_index: int,
        devices: DevicesConfig,
        on_batch: Callable[[WorkerHandle, wm.StepBatch], None],
        on_failed: Callable[[WorkerHandle, wm.RequestFailed], None],
        on_death: Callable[[WorkerHandle], None],
        on_kv: Callable[[WorkerHandle, wm.KVReady | wm.KVImported], None] | None = None,
        liveness: Liveness | None = None,
        on_error: Callable[[WorkerHandle, str, int], None] | None = None,
        on_tokens: Callable[[WorkerHandle, wm.Tokenized], None] | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        """`on_error(handle, where, n)`: n more errors caught on this worker's request path;
        `on_tokens`: a request's prompt tokenized (the core asked with Tokenize); `launcher`:
        where and how the process runs (server/launcher.py; local when None)."""
        self.device_index = device_index
        self.launcher: Launcher = launcher or LocalLauncher()
        self.devices = devices
        self._on_batch = on_batch
        self._on_failed = on_failed
        self._on_death = on_death
        self._on_kv = on_kv
        self._on_error = on_error
        self._on_tokens = on_tokens
        self._worker_errors: dict[str, int] = {}  # the current process's Stats.errors last seen
        self.state = WorkerState.STOPPED  # server/process_states.py: its table of moves
        self.pid: int | None = None
        self.restarts = 0
        self.proc: WorkerProcess | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._wait_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._seq = itertools.count(1)
        self._enc = msgspec.msgpack.Encoder()
        self._dec = wm.from_worker_decoder()
        self.last_stats: wm.Stats | None = None
        self.memcpy_bps = 0.0  # the worker's host copy bandwidth, measured at its start
        self.liveness = liveness or Liveness(heartbeat_s=0.0)
        self.hung: str | None = None  # why the current process was declared hung
        self.hangs = 0  # processes declared hung, ever
        self.last_pong: float | None = None  # monotonic time of the last heartbeat answer
        self._beat_task: asyncio.Task[None] | None = None

    @property
    def placement(self) -> Placement:
        """Where this device's worker runs (its node's host for transfers; its node's name)."""
        return self.launcher.placement(self.device_index)

    @property
    def ready(self) -> bool:
        return self.state is W.READY

    def fail(self) -> None:
        """Its restart budget is spent: the device is given up (server/worker_supervision.py)."""
        self._to(W.FAILED)

    def absent(self) -> None:
        """No node offers this device slot (the ray launcher: none at start, or its node left):
        no worker until one joins (server/node_joins.py)."""
        self._to(W.ABSENT)

    def _to(self, target: WorkerState) -> None:
        self.state = moved(self.state, target, WORKER_MOVES, f"worker for device {self.device_index}")

    def worker_args(self) -> list[str]:
        """The worker's own arguments; how it reaches the daemon is the launcher's to add."""
        d = self.devices
        args = [
            "--device-index", str(self.device_index),
            "--kind", d.kind,
            "--memory-bytes", str(d.memory_mib << 20),
            "--page-size", str(d.page_size_mib << 20),
            "--resident-bytes", str(d.resident_mib << 20),
            "--transfer-protocol", d.transfer_protocol,
            "--transfer-nice", str(d.transfer_nice),
            "--transfer-host", self.placement.host,
            "--torch-threads", os.environ.get("JANUSD_WORKER_TORCH_THREADS") or str(d.worker_torch_threads()),
        ]
        if d.cpu_cores:
            args += ["--cpu-cores", ",".join(map(str, d.cpu_cores[self.device_index]))]
        return args

    async def start(self, timeout_s: float) -> None:
        """Launch the worker and wait for its Ready frame; raise WorkerError on failure."""
        # forget the previous process first: a signal about it that arrives while this
        # start awaits (its EOF and its exit are seen separately) must find it stale
        self.proc = None
        self.pid = None
        self.hung = None
        self._writer = None
        self._worker_errors = {}
        self._to(W.STARTING)
        try:
            self.proc = proc = await self.launcher.spawn(self.device_index, self.worker_args())
        except BaseException:
            self._to(W.DEAD)
            raise
        self.pid = proc.pid
        name = f"worker for device {self.device_index}"
        try:
            reader, first = await asyncio.wait_for(self._handshake(proc), timeout_s)
        except asyncio.TimeoutError:
            await self._kill()
            raise WorkerError(f"{name} not ready within {timeout_s:g} s", "unavailable") from None
        except WorkerError:
            await self._kill()
            raise
        except (asyncio.IncompleteReadError, ConnectionError, FrameError, msgspec.DecodeError) as e:
            await self._kill()
            raise WorkerError(f"{name} failed during start-up: {e}", "unavailable") from None
        if not isinstance(first, wm.Ready):
            why = first.message if isinstance(first, wm.ErrorReply) else "it exited before the handshake"
            await self._kill()
            raise WorkerError(f"{name} failed to start: {why}", "unavailable")
        self.pid = proc.pid  # a remote worker's pid is known once it connected
        self._to(W.READY)
        self.memcpy_bps = first.memcpy_bps
        self._reader_task = asyncio.create_task(self._read_loop(reader, proc), name=f"worker{self.device_index}-reader")
        self._wait_task = asyncio.create_task(
            self._wait_exit(proc, self._reader_task), name=f"worker{self.device_index}-wait"
        )
        if self.liveness.heartbeat_s > 0:
            self._beat_task = asyncio.create_task(self._heartbeat(proc), name=f"worker{self.device_index}-beat")

    async def _handshake(self, proc: WorkerProcess) -> tuple[asyncio.StreamReader, Any]:
        """The worker's stream and its first message (None: it closed before one)."""
        reader, self._writer = await proc.connected()
        body = await read_frame(reader)
        return reader, (self._dec.decode(body) if body is not None else None)

    async def _heartbeat(self, proc: WorkerProcess) -> None:
        """Ping the worker until it is gone; declare it hung when it stops answering or a
        step never ends (see the module docs)."""
        lv = self.liveness
        while proc is self.proc and self.state is W.READY:
            await asyncio.sleep(lv.heartbeat_s)
            if proc is not self.proc or self.state is not W.READY:
                return
            try:
                pong: wm.Pong = await self.call(lambda seq: wm.Ping(seq), lv.heartbeat_timeout_s)
            except asyncio.TimeoutError:
                self._declare_hung(proc, f"no heartbeat answer within {lv.heartbeat_timeout_s:g} s")
                return
            except WorkerError:
                return  # died or stopping: the death path reports it
            self.last_pong = clock()
            if pong.busy_s > lv.step_timeout_s:
                self._declare_hung(proc, f"one engine step has run for {pong.busy_s:.1f} s "
                                         f"(worker_step_timeout_s = {lv.step_timeout_s:g})")
                return

    def _declare_hung(self, proc: WorkerProcess, why: str) -> None:
        if proc is not self.proc or self.state is not W.READY:
            return
        self.hung = why
        self.hangs += 1
        log.warning(f"worker for device {self.device_index} (pid {proc.pid}) is hung: {why}; killing it")
        proc.kill()  # SIGKILL ends a stopped process too; its exit takes the usual death path

    def kill(self, why: str) -> None:
        """End the current process now (SIGKILL) for `why`; its death takes the usual path."""
        proc = self.proc
        if proc is None or self.state is not W.READY:
            return
        log.warning(f"worker for device {self.device_index} (pid {proc.pid}): killing it: {why}")
        proc.kill()

    async def _read_loop(self, reader: asyncio.StreamReader, proc: WorkerProcess) -> None:
        try:
            while True:
                body = await read_frame(reader)
                if body is None:
                    break
                msg = self._dec.decode(body)
                if isinstance(msg, wm.StepBatch):
                    self._deliver_batch(msg)
                elif isinstance(msg, (wm.RequestFailed, wm.KVReady, wm.KVImported, wm.Tokenized)):
                    self._deliver(msg)
                else:
                    if isinstance(msg, wm.Stats):
                        self._count_worker_errors(msg.errors)
                    fut = self._pending.pop(getattr(msg, "seq", -1), None)
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
        except (asyncio.IncompleteReadError, ConnectionError, FrameError, msgspec.DecodeError):
            pass
        finally:
            self._died(proc)

    def _deliver_batch(self, batch: wm.StepBatch) -> None:
        """One output at a time: a handler that raises on one request's tokens must not
        drop the tokens of the requests after it in the same step. The one it failed on is
        ended: the worker stops generating it, the owner fails it (a clear 500, where
        it would otherwise wait for tokens that no longer reach it)."""
        outputs = batch.outputs
        for d in outputs:
            try:
                self._on_batch(self, batch if len(outputs) == 1 else wm.StepBatch([d]))
            except Exception:
                self._handler_failed(f"handling the tokens of request {d.req_id}")
                self.send(wm.Abort(d.req_id))
                self._deliver(wm.RequestFailed(d.req_id, "the daemon failed handling the request's output "
                                               "(see the daemon log)", "internal"))

    def _deliver(self, msg: wm.RequestFailed | wm.KVReady | wm.KVImported | wm.Tokenized) -> None:
        try:
            if isinstance(msg, wm.RequestFailed):
                self._on_failed(self, msg)
            elif isinstance(msg, wm.Tokenized):
                if self._on_tokens is not None:
                    self._on_tokens(self, msg)
            elif self._on_kv is not None:
                self._on_kv(self, msg)
        except Exception:  # a bug in a handler must not look like a dead worker
            self._handler_failed(f"handling {type(msg).__name__} of request {msg.req_id}")

    def _handler_failed(self, what: str) -> None:
        log.error(f"worker for device {self.device_index}: {what} failed", exc_info=True)
        self._count("handler", 1)

    def _count_worker_errors(self, counts: dict[str, int]) -> None:
        """Stats carry the worker's counts since its process started: the growth since
        the last Stats of the same process is new."""
        for where, n in counts.items():
            if n > self._worker_errors.get(where, 0):
                self._count(where, n - self._worker_errors.get(where, 0))
        self._worker_errors = dict(counts)

    def _count(self, where: str, n: int) -> None:
        if self._on_error is not None:
            self._on_error(self, where, n)

    async def _wait_exit(self, proc: WorkerProcess, reader_task: asyncio.Task[None]) -> None:
        await proc.wait()
        if not reader_task.done():
            # let the reader deliver what the worker wrote before it died; its EOF then
            # reports the death, or we do once the bound has passed
            await asyncio.wait({reader_task}, timeout=READER_DRAIN_S)
        self._died(proc)

    def _died(self, proc: WorkerProcess | None) -> None:
        """The process `proc` is gone; acts once per process, and only for the current one."""
        if proc is not self.proc or self.state in (W.DEAD, W.STOPPED):
            return
        was_stopping = self.state is W.STOPPING
        self._to(W.STOPPED if was_stopping else W.DEAD)
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(WorkerError(f"worker for device {self.device_index} died", "unavailable"))
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()
        if not was_stopping:
            self._on_death(self)

    def send(self, msg: Any) -> bool:
        """Queue a message to the worker; False when it is not running."""
        if self._writer is None or self.state not in (W.READY, W.STARTING) or self._writer.is_closing():
            return False
        self._writer.write(encode_frame(self._enc, msg))
        return True

    async def call(self, make: Callable[[int], Any], timeout_s: float | None = None) -> Any:
        """Send make(seq) and await the reply with that seq; ErrorReply raises WorkerError."""
        seq = next(self._seq)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[seq] = fut
        if not self.send(make(seq)):
            self._pending.pop(seq, None)
            raise WorkerError(f"worker for device {self.device_index} is not running", "unavailable")
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        finally:
            self._pending.pop(seq, None)
        if isinstance(reply, wm.ErrorReply):
            raise WorkerError(reply.message, reply.kind)
        return reply

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not within timeout_s."""
        if self.proc is None or self.state is W.STOPPED:
            return
        if self.state is W.READY:
            self.send(wm.Shutdown())
        self._to(W.STOPPING)
        try:
            await asyncio.wait_for(self.proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            await self._kill()
        self._to(W.STOPPED)
        if self._writer is not None:
            self._writer.close()
        for t in (self._reader_task, self._wait_task, self._beat_task):
            if t is not None and not t.done():
                t.cancel()

    async def _kill(self) -> None:
        if self._writer is not None:
            self._writer.close()  # a failed start must not leak its socket
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        self._to(W.DEAD)
