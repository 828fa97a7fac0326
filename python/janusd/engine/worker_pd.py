"""The worker's half of P/D disaggregation: hand a prefilled request's KV to a decode
worker, or take one in (PAPER.md §2 elastic instances, §7 base + offset transfer).

A prefill-role engine holds a request's blocks after its first token (`kv_ready`); this
worker then tells the daemon where they are (KVReady: block pieces as offsets in our
pool's global region, plus our Mooncake session). The daemon picks a decode worker and
sends it ImportKV; that worker reserves blocks (`begin_import`), READS the bytes from
the prefill worker's global region into its own over Mooncake on a transfer thread (so
the models already decoding here keep stepping), then starts decoding
(`finish_import`) and reports KVImported, after which the daemon frees the prefill side.

Reading (pull) rather than pushing keeps every write into a pool inside the process
that owns it. Blocks being written to must not be reused, so an Abort that arrives while
a request's bytes are in flight is applied only when the transfer thread is done with it,
and an UnloadModel of its model waits likewise (without blocking the main thread).
The transport is created on the first P/D-role model load: workers of plain deployments
never start a transfer engine.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from janusd.wire import worker_msgs as wm


class Imported(msgspec.Struct):
    """The transfer thread's result for one import, handed back through the inbox."""

    req_id: int
    model: str
    error: str
    nbytes: int
    seconds: float


class Parked(msgspec.Struct):
    """An ImportKV that found no free KV blocks: retried as pages come back, until deadline."""

    msg: wm.ImportKV
    params: Any
    since: float
    deadline: float


class PDLink:
    def __init__(self, pool: Any, kind: str, inbox: queue.Queue[Any], protocol: str = "auto",
                 thread_nice: int = 0, host: str = "127.0.0.1") -> None:
        self.pool = pool
        self.host = host  # the address peers reach our transfer engine at (the node's, under Ray)
        self.kind = kind
        self.protocol = protocol
        self.thread_nice = thread_nice  # of the transfer engine's threads (devices.transfer_nice)
        self.inbox = inbox
        self.transport: Any = None
        self._jobs: queue.Queue[tuple[int, str, str, int, list[Any]]] = queue.Queue()
        self._writing: dict[int, str] = {}  # req_id -> model while bytes arrive (transfer thread clears)
        self._pending: set[int] = set()  # begun, not yet finished on the main thread
        self._abort_after: set[int] = set()
        self._unload_after: dict[str, Any] = {}
        self._parked: list[Parked] = []  # imports waiting for KV blocks, oldest first  # model -> UnloadModel waiting for its writes to end
        self._idle = threading.Condition()
        self._thread: threading.Thread | None = None

    def ensure(self) -> None:
        """Start the transfer engine with our global region registered (once)."""
        if self.transport is not None:
            return
        from janusd.lifecycle.transfer import GlobalRegionTransport

        self.transport = GlobalRegionTransport(self.pool.global_base, self.pool.global_nbytes, kind=self.kind,
                                               host=self.host, protocol=self.protocol, thread_nice=self.thread_nice)
        self._thread = threading.Thread(target=self._run, name="janusd-kv-transfer", daemon=True)
        self._thread.start()

    # ---- prefill side ----
    def kv_ready(self, me: Any, req_id: int) -> wm.KVReady:
        kv = me.export_kv(str(req_id))
        return wm.KVReady(req_id, kv, self.transport.session, int(self.pool.global_base))

    # ---- decode side ----
    def start_import(self, me: Any, msg: wm.ImportKV, params: Any) -> None:
        """Reserve blocks and queue the read; raises RequestError/TransferError/ValueError."""
        from janusd.lifecycle.transfer import match_pieces

        if self.transport is None:
            raise RuntimeError(f"model {msg.model!r} on this worker is not a decode instance (no transfer engine)")
        ticket = me.begin_import(msg.kv, params, str(msg.req_id))
        try:
            pieces = [
                p for src, dst in zip(msg.kv.global_offsets, ticket.global_offsets, strict=True)
                for p in match_pieces([(int(a), int(n)) for a, n in src], [(int(a), int(n)) for a, n in dst])
            ]  # fmt: skip
        except ValueError:
            me.abort(str(msg.req_id))
            raise
        with self._idle:
            self._writing[msg.req_id] = msg.model
        self._pending.add(msg.req_id)
        self._jobs.put((msg.req_id, msg.model, msg.peer, msg.peer_base, pieces))

    def park(self, msg: wm.ImportKV, params: Any, timeout_s: float, now: float) -> None:
        """Queue an import behind the older waiting ones (retry_parked starts them)."""
        self._parked.append(Parked(msg, params, now, now + timeout_s))

    @property
    def parked(self) -> bool:
        return bool(self._parked)

    def retry_parked(self, models: dict[str, Any], live: Callable[[int, str], bool], now: float) -> list[Any]:
        """Start waiting imports in arrival order; returns the RequestFailed of those that
        failed or waited past their deadline. Blocks held by other requests come back as
        they finish, so an import waits for them like a new request does
        (engine.kv_wait_timeout_s), then fails (503). One that still finds no room holds
        back the newer imports of its model (they time out, but never overtake it: a stream
        of newer imports cannot starve it). `live(req_id, model)`: still wanted here."""
        from janusd.engine.types import KVCapacityError, RequestError

        parked, self._parked = self._parked, []
        blocked: set[str] = set()
        failed: list[Any] = []
        for p in parked:
            rid, model = p.msg.req_id, p.msg.model
            if not live(rid, model):
                continue  # aborted, failed or unloaded meanwhile
            waited = f" after waiting {now - p.since:.2f} s" if now > p.since else ""
            if model in blocked:
                if now < p.deadline:
                    self._parked.append(p)
                else:
                    failed.append(wm.RequestFailed(rid, f"cannot take over the request's KV{waited}: kv import: no "
                                                        f"room for KV blocks on model {model!r} (older imports wait "
                                                        "for them first)", "unavailable"))
                continue
            me = models.get(model)
            try:
                if me is None:
                    raise RuntimeError(f"model {model!r} is not loaded on this worker")
                self.start_import(me, p.msg, p.params)
            except KVCapacityError as e:
                if now < p.deadline:
                    self._parked.append(p)
                    blocked.add(model)
                else:
                    failed.append(wm.RequestFailed(rid, f"cannot take over the request's KV{waited}: {e}", "unavailable"))
            except (RequestError, ValueError, TypeError, RuntimeError) as e:
                failed.append(wm.RequestFailed(rid, f"cannot take over the request's KV: {e}", "internal"))
        return failed

    def _run(self) -> None:
        while True:
            rid, model, peer, base, pieces = self._jobs.get()
            t0 = time.perf_counter()
            try:
                n = self.transport.read(peer, base, pieces)
                err = ""
            except Exception as e:  # a dead peer, a refused read: this request fails, not the worker
                n, err = 0, f"{type(e).__name__}: {e}"
            self._job_done(rid, model, err, n, time.perf_counter() - t0)

    def _job_done(self, rid: int, model: str, err: str, nbytes: int, seconds: float) -> None:
        """Transfer thread: nothing writes into `rid`'s blocks any more. Its result, then an
        unload of its model that waited for its last write, go to the main thread in order."""
        with self._idle:
            self._writing.pop(rid, None)
            busy = model in self._writing.values()
            unload = None if busy else self._unload_after.pop(model, None)
            self._idle.notify_all()
        self.inbox.put(Imported(rid, model, err, nbytes, seconds))
        if unload is not None:
            self.inbox.put(unload)

    def finish(self, done: Imported, me: Any) -> Any:
        """Main thread: apply a finished transfer; returns the message for the daemon (or None)."""
        if done.req_id not in self._pending:
            return None  # forgotten (its model was unloaded while the bytes arrived)
        self._pending.discard(done.req_id)
        aborted = done.req_id in self._abort_after
        self._abort_after.discard(done.req_id)
        if me is None:
            return None  # the model went away meanwhile; its blocks went with it
        if aborted:
            me.abort(str(done.req_id))
            return None
        if done.error:
            me.abort(str(done.req_id))
            return wm.RequestFailed(done.req_id, f"KV transfer from the prefill worker failed: {done.error}",
                                    "unavailable")
        try:
            me.finish_import(str(done.req_id))
        except Exception as e:  # the request is gone from the engine: fail it, never the worker's loop
            me.abort(str(done.req_id))
            return wm.RequestFailed(done.req_id, f"cannot start decoding the imported KV: {e}", "internal")
        return wm.KVImported(done.req_id, done.nbytes, done.seconds)

    def defer_abort(self, req_id: int) -> bool:
        """An Abort for a request whose bytes are still arriving waits for the transfer."""
        if req_id in self._pending:
            self._abort_after.add(req_id)
            return True
        return False

    def forget(self, req_id: int) -> None:
        """The request was dropped with its model; a late transfer result is ignored."""
        self._pending.discard(req_id)
        self._abort_after.discard(req_id)

    def defer_unload(self, msg: Any) -> bool:
        """An unload of a model whose blocks a transfer still writes waits for the transfer
        (bounded by the transport's stall timeout), queued again by the transfer thread:
        the main thread keeps stepping the other models meanwhile instead of blocking."""
        with self._idle:
            if msg.name not in self._writing.values():
                return False
            self._unload_after[msg.name] = msg
            return True

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
