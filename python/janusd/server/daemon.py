"""The daemon (`janus serve`): one asyncio process on uvloop that owns every decision.

Life cycle as explicit state (STYLE.md #10): starting -> running -> draining ->
stopped. Signal handlers only record what was asked (SIGTERM/SIGINT: shutdown,
SIGHUP: reload) and wake the main coroutine, which acts:
- start: spawn one worker per device and wait for each Ready handshake, load the
  models, then listen (HTTP, admin socket) and tell systemd READY=1;
- SIGHUP: re-read the config file and apply model additions and removals;
- SIGTERM: STOPPING=1, refuse new requests (503), let in-flight ones finish for up to
  drain_timeout_s, fail the rest, stop listening, stop workers, exit 0.
A worker that dies is restarted (with back-off) and its models reloaded; its in-flight
requests fail and every other model keeps serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from typing import Any

import msgspec

from janusd.config import JanusConfig, cache_dir, dump_config
from janusd.server import model_ops, sdnotify
from janusd.server.kv_handoff import KVHandoff
from janusd.server.metrics import Metrics
from janusd.server.models import ModelEntry, ModelManager, place
from janusd.server.openai_types import ApiError, Parsed
from janusd.server.requests import Failure, Request, RequestTable
from janusd.server.scheduling import Instance, Scheduler
from janusd.server.workers import WorkerError, WorkerHandle
from janusd.wire import worker_msgs as wm

# The daemon's clock for request times (arrival, deadlines, per-token timestamps) and for
# the dispatcher. Not loop.time(): uvloop's is cached per loop iteration at 1 ms
# resolution, too coarse for per-token times; both read CLOCK_MONOTONIC.
clock = time.monotonic


def _check_port_free(host: str, port: int) -> None:
    """Bind the API address once before the workers start, so a busy port fails in
    milliseconds instead of after every model has loaded (port 0 always binds)."""
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(f"server.host {host!r}: cannot resolve: {e.strerror}") from None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError as e:
                raise OSError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def _log(msg: str) -> None:
    print(f"janusd: {msg}", file=sys.stderr, flush=True)


class Daemon:
    def __init__(self, cfg: JanusConfig, config_path: str | None = None,
                 server_overrides: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.config_path = config_path
        # `janus serve --host/--port`: re-applied to a reloaded file so SIGHUP compares like with like
        self.server_overrides = dict(server_overrides or {})
        self.state = "starting"  # starting | running | draining | stopped
        self.started_wall = time.time()
        self.started_loop = 0.0
        self._wake = asyncio.Event()
        self._shutdown_requested = False
        self._reload_requested = False
        self.requests = RequestTable(on_finish=self._finished)
        self.sched = Scheduler(cfg.dispatch, self._on_assign, self._on_reject)
        self.workers = [
            WorkerHandle(i, cfg.devices, self._on_batch, self._on_failed, self._on_death, self._on_kv)
            for i in range(cfg.devices.count)
        ]
        self.models = ModelManager(
            self.workers, self.sched, self.requests, cfg.engine, str(cache_dir(cfg.server)),
            cfg.server.worker_ready_timeout_s,
        )
        self.metrics = Metrics(self.snapshot)
        self.handoff = KVHandoff(self.sched, self.requests, self.workers, self.metrics)
        self.http_port: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._tok_rr = 0
        self._admitting: dict[str, int] = {}

    # ---- signals: only record and wake ----
    def request_shutdown(self) -> None:
        self._shutdown_requested = True
        self._wake.set()

    def request_reload(self) -> None:
        self._reload_requested = True
        self._wake.set()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        t = asyncio.create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ---- main ----
    async def run(self) -> int:
        from janusd.server.admin import AdminSocketError, check_admin_socket_free, start_admin
        from janusd.server.api import start_http

        try:
            _check_port_free(self.cfg.server.host, self.cfg.server.port)
            check_admin_socket_free(self.cfg.server.admin_socket)
        except (OSError, AdminSocketError) as e:
            _log(f"start-up failed: {e}")
            return 1

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.request_shutdown)
        loop.add_signal_handler(signal.SIGINT, self.request_shutdown)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        timeout = self.cfg.server.worker_ready_timeout_s
        sdnotify.notify(f"STATUS=starting {len(self.workers)} workers")
        results = await asyncio.gather(*(w.start(timeout) for w in self.workers), return_exceptions=True)
        bad = [r for r in results if isinstance(r, BaseException)]
        if bad:
            for e in bad:
                _log(f"start-up failed: {e}")
            await asyncio.gather(*(w.stop() for w in self.workers))
            return 1
        _log(f"{len(self.workers)} workers ready: " + ", ".join(f"device {w.device_index} pid {w.pid}"
                                                                 for w in self.workers))
        self._spawn(self.sched.run(clock), "dispatch")
        sdnotify.notify(f"STATUS=loading {len(self.cfg.models)} models")
        placement = place(self.cfg.models, self.cfg.devices.count)
        entries = [self.models.add(m, placement[m.name]) for m in self.cfg.models]
        await asyncio.gather(*(self.models.load_all(e) for e in entries))
        if self._shutdown_requested:
            await self._stop_workers()
            return 0
        try:
            runner, self.http_port = await start_http(self, self.cfg.server.host, self.cfg.server.port)
            admin = await start_admin(self, self.cfg.server.admin_socket)
        except BaseException:
            await self._stop_workers()
            raise
        self._spawn(self._poll_stats(), "stats")
        wd = sdnotify.watchdog_interval_s()
        if wd:
            self._spawn(self._watchdog(wd), "watchdog")
        self.state = "running"
        self.started_loop = clock()
        _log(f"serving on http://{self.cfg.server.host}:{self.http_port} (admin {self.cfg.server.admin_socket})")
        sdnotify.notify(f"READY=1\nSTATUS=serving on port {self.http_port}\nMAINPID={os.getpid()}")
        while not self._shutdown_requested:
            await self._wake.wait()
            self._wake.clear()
            if self._reload_requested and not self._shutdown_requested:
                self._reload_requested = False
                await self.reload()
        await self._shutdown(runner, admin)
        return 0

    async def _shutdown(self, runner: Any, admin: Any) -> None:
        self.state = "draining"
        sdnotify.notify("STOPPING=1\nSTATUS=draining")
        n = self.requests.count()
        _log(f"shutting down: draining {n} in-flight requests (up to {self.cfg.server.drain_timeout_s:g} s)")
        try:
            await asyncio.wait_for(self.requests.idle.wait(), self.cfg.server.drain_timeout_s)
        except asyncio.TimeoutError:
            for rid, req in list(self.requests.by_id.items()):
                if req.worker is not None:
                    req.worker.send(wm.Abort(rid))
                self.requests.fail(rid, Failure(503, "the server is shutting down", code="shutting_down"))
        await asyncio.sleep(0.05)  # let handlers write their last bytes
        admin.close()
        await runner.cleanup()
        with contextlib.suppress(OSError):
            os.unlink(self.cfg.server.admin_socket)
        await self._stop_workers()
        self.state = "stopped"
        _log("stopped")

    async def _stop_workers(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)

    async def _watchdog(self, interval: float) -> None:
        while True:
            sdnotify.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def refresh_stats(self) -> None:
        async def one(w: WorkerHandle) -> None:
            with contextlib.suppress(WorkerError, asyncio.TimeoutError):
                w.last_stats = await w.call(lambda seq: wm.GetStats(seq), 5.0)

        await asyncio.gather(*(one(w) for w in self.workers if w.ready))

    async def _poll_stats(self) -> None:
        while True:
            await self.refresh_stats()
            await asyncio.sleep(1.0)

    # ---- requests ----
    async def admit(self, p: Parsed) -> Request:
        """Check, tokenize and queue a request; raises ApiError for every refusal.

        The request's clock (SLO deadlines, token times) starts here, before tokenizing."""
        arrival = clock()
        entry = self.models.models.get(p.model)
        if entry is None:
            raise ApiError(404, f"model {p.model!r} does not exist", param="model", code="model_not_found")
        if self.state != "running":
            raise ApiError(503, "the server is shutting down", "server_error", code="shutting_down")
        if self.queue_length(p.model) >= self.cfg.server.queue_limit:
            self.metrics.reject(p.model, "queue_full")
            raise ApiError(429, f"too many requests queued for model {p.model!r}; retry later",
                           "rate_limit_error", code="queue_full", headers={"Retry-After": "1"})
        # requests being tokenized count as queued, so a burst cannot pass the bound at once
        self._admitting[p.model] = self._admitting.get(p.model, 0) + 1
        try:
            ids = p.prompt_ids if p.prompt_ids is not None else await self._tokenize(entry, p)
            return self._enqueue(entry, p, ids, arrival)
        finally:
            self._admitting[p.model] -= 1

    def queue_length(self, model: str) -> int:
        return self.sched.pending(model) + self._admitting.get(model, 0)

    def _enqueue(self, entry: ModelEntry, p: Parsed, ids: list[int], now: float) -> Request:
        if self.models.models.get(p.model) is not entry:
            # unloaded (or replaced by a reload) while we tokenized: its queue is gone, so a
            # request queued now would wait for an instance that never comes
            raise ApiError(404, f"model {p.model!r} was unloaded", param="model", code="model_not_found")
        max_len = entry.max_model_len
        where = "messages" if p.chat else "prompt"
        if len(ids) >= max_len:
            raise ApiError(400, f"{where}: the prompt has {len(ids)} tokens; this model's context is {max_len}",
                           param=where, code="context_length_exceeded")
        sampling = p.sampling
        if not p.max_tokens_given:
            sampling = msgspec.structs.replace(sampling, max_tokens=max_len - len(ids))
        elif len(ids) + sampling.max_tokens > max_len:
            raise ApiError(400, f"max_tokens: {len(ids)} prompt tokens + max_tokens {sampling.max_tokens} exceed "
                                f"this model's context of {max_len}", param="max_tokens",
                           code="context_length_exceeded")
        ttft = (p.ttft_ms or entry.cfg.ttft_slo_ms) / 1000.0
        tpot = (p.tpot_ms or entry.cfg.tpot_slo_ms) / 1000.0
        req = Request(self.requests.new_id(), p.model, ids, sampling, now, ttft, tpot)
        self.requests.add(req)
        self.sched.submit(req.rid, p.model, now, now + ttft, len(ids))
        return req

    async def _tokenize(self, entry: ModelEntry, p: Parsed) -> list[int]:
        active = [pl for pl in entry.active if self.workers[pl.device].ready]
        if not active:
            raise ApiError(503, f"model {p.model!r} is not ready (loading or restarting); retry later",
                           "server_error", code="model_not_ready", headers={"Retry-After": "1"})
        self._tok_rr += 1
        w = self.workers[active[self._tok_rr % len(active)].device]
        try:
            reply: wm.Tokenized = await w.call(lambda seq: wm.Tokenize(seq, p.model, p.prompt, p.messages), 30.0)
        except WorkerError as e:
            status = 400 if e.kind == "bad_request" else 503
            raise ApiError(status, str(e), "invalid_request_error" if status == 400 else "server_error",
                           param="messages" if p.chat and status == 400 else None) from None
        except asyncio.TimeoutError:
            raise ApiError(503, "tokenization timed out", "server_error") from None
        return reply.token_ids

    def cancel(self, req: Request) -> None:
        """The client went away: abort on the worker (frees KV) and forget the request."""
        if req.worker is not None:
            req.worker.send(wm.Abort(req.rid))
        self.requests.fail(req.rid, Failure(499, "client closed the request", code="cancelled"))

    def _finished(self, req: Request) -> None:
        self.handoff.on_finished(req)
        if not req.prefill_seen:
            self.sched.cancel(req.rid, clock())
        if not req.failed:
            outcome = "ok"
        else:
            f = req.failure
            outcome = {499: "cancelled", 400: "bad_request"}.get(getattr(f, "status", 0), "failed")
            if getattr(f, "code", None) == "slo_unattainable":
                outcome = "rejected"
        self.metrics.observe(req, outcome)

    def _on_assign(self, rid: int, inst: Instance) -> None:
        req = self.requests.by_id.get(rid)
        if req is None:
            self.sched.cancel(rid, clock())
            return
        w = self.workers[inst.device]
        req.instance, req.worker = inst, w
        try:
            sent = w.send(wm.Generate(rid, req.model, req.prompt_ids, req.sampling))
        except Exception as e:  # e.g. a frame over the limit: this request fails, dispatching goes on
            _log(f"request {rid}: cannot send it to device {inst.device}: {type(e).__name__}: {e}")
            self.requests.fail(rid, Failure(500, f"internal error sending the request to its worker: {e}"))
            return
        if not sent:
            self.requests.fail(rid, Failure(503, f"the worker for device {inst.device} is not running"))

    def _on_reject(self, rid: int) -> None:
        req = self.requests.by_id.get(rid)
        if req is not None:
            self.metrics.reject(req.model, "slo")
            self.requests.fail(rid, Failure(
                503, f"request rejected: it cannot meet its TTFT SLO of {req.ttft_slo_s * 1000:g} ms "
                     f"(dispatch policy {self.cfg.dispatch.policy}, requeue={self.cfg.dispatch.requeue})",
                code="slo_unattainable"))

    def _on_batch(self, w: WorkerHandle, batch: wm.StepBatch) -> None:
        now = clock()
        for d in batch.outputs:
            req = self.requests.by_id.get(d.req_id)
            if req is not None and not req.prefill_seen and d.token_ids:
                # before deliver(): a request whose first token is also its last ends inside
                # deliver(), and its prefill time must still reach the estimator and EPDT
                req.prefill_seen = True
                self.sched.prefill_done(req.rid, now, len(req.prompt_ids), d.prefill_s)
            self.requests.deliver(d, now)

    def _on_failed(self, w: WorkerHandle, f: wm.RequestFailed) -> None:
        if not self.handoff.accept_failure(w, f.req_id):
            return  # P/D: a stale report from the prefill worker after the handoff
        status = {"bad_request": 400, "unavailable": 503}.get(f.kind, 500)
        self.requests.fail(f.req_id, Failure(status, f.message, "invalid_request_error" if status == 400
                                             else "server_error"))

    def _on_kv(self, w: WorkerHandle, msg: wm.KVReady | wm.KVImported) -> None:
        self.handoff.on_message(w, msg)

    def _on_death(self, w: WorkerHandle) -> None:
        dev = w.device_index
        _log(f"worker for device {dev} (pid {w.pid}) died; failing its requests and restarting it")
        self.models.on_worker_death(dev)
        for req in self.requests.on_worker(w):
            self.requests.fail(req.rid, Failure(503, f"the worker for device {dev} died while serving this "
                                                     "request", code="worker_died"))
        if self.state in ("running", "starting"):
            self._spawn(self._restart(w), f"restart{dev}")

    async def _restart(self, w: WorkerHandle) -> None:
        delay = 0.2
        while self.state in ("running", "starting"):
            await asyncio.sleep(delay)
            try:
                await w.start(self.cfg.server.worker_ready_timeout_s)
            except (WorkerError, OSError) as e:
                _log(f"restarting worker {w.device_index} failed: {e}")
                delay = min(delay * 2, 10.0)
                continue
            w.restarts += 1
            _log(f"worker for device {w.device_index} restarted (pid {w.pid}); reloading its models")
            await self.models.reload_device(w.device_index)
            return

    # ---- config reload and admin operations (server/model_ops.py) ----
    async def reload(self) -> dict[str, Any]:
        return await model_ops.reload(self)

    async def load_model(self, name: str, checkpoint: str | None, devices: list[int]) -> dict[int, str]:
        return await model_ops.load_model(self, name, checkpoint, devices)

    async def unload_model(self, name: str) -> dict[str, Any]:
        return await model_ops.unload_model(self, name)

    # ---- views ----
    def health(self) -> dict[str, Any]:
        ok = self.state == "running" and all(w.ready for w in self.workers)
        return {
            "status": "ok" if ok else ("draining" if self.state == "draining" else "degraded"),
            "state": self.state,
            "workers": {str(w.device_index): w.state for w in self.workers},
            "models": {n: len(e.active) for n, e in self.models.models.items()},
        }

    def snapshot(self) -> dict[str, Any]:
        insts = [(p.model, p.device, p.state) for e in self.models.models.values() for p in e.placements.values()]
        return {
            "queues": {n: self.queue_length(n) for n in self.models.models},
            "relaxed": {n: self.sched.relaxed_of(n) for n in self.models.models},
            "in_flight": {n: self.requests.count(n) for n in self.models.models},
            "dispatch": self.sched.stats(),
            "instances": insts,
            "workers": {w.device_index: (w.ready, w.restarts) for w in self.workers},
            "pools": {w.device_index: w.last_stats.pool for w in self.workers if w.last_stats is not None},
        }

    def config_toml(self) -> str:
        return dump_config(self.cfg)
