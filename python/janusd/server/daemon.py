"""The daemon (`janus serve`): the real-time shell around the serving core.

The core (core/serving.py) decides; this file supplies what it must not touch: the
real clock, real worker processes (server/workers.py), the HTTP API (server/api.py), the
admin socket (server/admin.py), signals and systemd. Life cycle as explicit state
(STYLE.md #10): starting -> running -> draining -> stopped. Signal handlers only record
what was asked (SIGTERM/SIGINT: shutdown, SIGHUP: reload) and wake the main coroutine,
which acts:
- start: spawn one worker per device and wait for each Ready handshake, load the
  models, then listen (HTTP, admin socket) and tell systemd READY=1;
- SIGHUP: re-read the config file and apply model additions and removals;
- SIGTERM: STOPPING=1, refuse new requests (503), let in-flight ones finish for up to
  drain_timeout_s, fail the rest, stop listening, stop workers, exit 0.
A worker that dies is restarted (with back-off) and its models reloaded; its in-flight
requests fail and every other model keeps serving. One task ticks the core: at the
time the core asks for, or at once after any event that may change its plan.
The request side (admit, tokenize, cancel) is server/daemon_requests.py's and the
workers' events (tokens, deaths, restarts) server/worker_supervision.py's: parts of
Daemon, each its own module; the clock is server/daemon_clock.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from typing import Any

from janusd.config import JanusConfig, ModelConfig, cache_dir, dump_config
from janusd.core import Failure, Limits, Observers, ServingCore
from janusd.log import log
from janusd.server import model_ops, sdnotify
from janusd.server.admin import AdminSocketError, check_admin_socket_free, start_admin
from janusd.server.api import start_http
from janusd.server.controller import Controller
from janusd.server.daemon_clock import clock, wall_clock
from janusd.server.daemon_requests import RequestFront
from janusd.server.decisions import DecisionLog
from janusd.server.lifecycle_ops import LifecycleOps
from janusd.server.metrics import Metrics
from janusd.server.model_ops import ConfigHolder, ModelOps
from janusd.server.node_joins import NodeJoins
from janusd.server.oracle_refit import OracleRefit
from janusd.server.process_states import DAEMON_MOVES, DaemonState, WorkerState, moved
from janusd.server.restart_policy import RestartBudget
from janusd.server.steady_start import added_placement, first_placement
from janusd.server.tick_backoff import TickBackoff
from janusd.server.worker_supervision import WorkerSupervision
from janusd.server.launchers import make_launcher
from janusd.server.workers import Liveness, WorkerError, WorkerHandle
from janusd.telemetry import Telemetry
from janusd.wire import worker_msgs as wm

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


def _log(msg: str, level: int = logging.INFO) -> None:
    log.log(level, msg)


class Daemon(RequestFront, WorkerSupervision, NodeJoins):
    """The whole daemon: its life cycle here; its request side (daemon_requests.py) and
    its workers' events (worker_supervision.py) are its parts."""

    def __init__(self, cfg: JanusConfig, config_path: str | None = None,
                 server_overrides: dict[str, Any] | None = None) -> None:
        # `janus serve --host/--port`: re-applied to a reloaded file so SIGHUP compares like with like
        self.config = ConfigHolder(cfg, config_path, dict(server_overrides or {}))
        self.state = DaemonState.STARTING  # server/process_states.py: its table of moves
        self.started_wall = wall_clock()
        self.started_loop = 0.0
        self._wake = asyncio.Event()
        self._shutdown_requested = False
        self._reload_requested = False
        self._tick_now = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        sv = cfg.server
        live = Liveness(sv.worker_heartbeat_s, sv.worker_heartbeat_timeout_s, sv.worker_step_timeout_s)
        self.launcher = make_launcher(cfg.devices, cfg.ray)  # where workers run (server/launcher.py)
        self.workers = [
            WorkerHandle(i, cfg.devices, self._on_batch, self._on_failed, self._on_death, self._on_kv, live,
                         lambda w, where, n: self.metrics.worker_error(w.device_index, where, n), self._on_tokens,
                         self.launcher)
            for i in range(cfg.devices.count)
        ]
        self.homeless: set[str] = set()  # models waiting for a node to join (server/node_joins.py)
        self.restarts = {w.device_index: RestartBudget(sv.worker_restart_budget, sv.worker_restart_window_s)
                         for w in self.workers}
        self.metrics = Metrics(self.snapshot)
        self.core = ServingCore(
            cfg.dispatch, {w.device_index: w for w in self.workers},
            Limits(cfg.server.queue_limit, cfg.server.model_wait_timeout_s, cfg.server.default_max_tokens),
            Observers(finished=self._finished, rejected=self.metrics.reject, refused=self.metrics.refused,
                      kv_transfer=self.metrics.kv_transfer,
                      estimate_error=self.metrics.prefill_estimate_error, wake=self._wake_model, idle=self._on_idle),
            Telemetry(window_s=cfg.control.window_s),
        )
        self.ops = ModelOps(self.core, self.workers, cfg.engine, str(cache_dir(cfg.server)),
                            cfg.server.worker_ready_timeout_s, cfg.server.drain_timeout_s, clock, cfg.lifecycle)
        self.life = LifecycleOps(self.ops, cfg.lifecycle, self.metrics.lifecycle)
        self.ops.starter = self.life.start
        self.ops.poke = self.poke
        self.ops.tp_timeout_s = cfg.server.worker_step_timeout_s
        self.ops.reply_timeout_s = cfg.server.worker_heartbeat_timeout_s
        # the decisions carried out with their reasons (`ctl events`, `janus top`): the
        # controller's Ops and the wakes requests start
        self.decisions = DecisionLog(cfg.control.decisions_kept, self.metrics.controller_decision)
        self.life.decisions = self.decisions
        self.clock = clock
        # the performance oracle: priors, stored fits, online refits off the loop ([O])
        self.oracle = OracleRefit(cfg.oracle, cfg.devices, str(cache_dir(cfg.server)), eager=cfg.control.managed)
        # the two control loops ([C]); None unless control.managed
        self.controller: Controller | None = None
        if cfg.control.managed:
            self.controller = Controller(self, clock, self.metrics.controller_op, self.metrics.controller_elastic,
                                         self.metrics.controller_move, self.metrics.controller_figure,
                                         self.decisions, absent=self._absent_devices)
        if self.controller is not None:
            self.controller.room.on_undone = self.metrics.controller_undone
        self.http_port: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def cfg(self) -> JanusConfig:
        return self.config.cfg

    # ---- signals: only record and wake ----
    def request_shutdown(self) -> None:
        self._shutdown_requested = True
        self._wake.set()

    def request_reload(self) -> None:
        self._reload_requested = True
        self._wake.set()

    def _to(self, target: DaemonState) -> None:
        self.state = moved(self.state, target, DAEMON_MOVES, "the daemon")

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        t = asyncio.create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    # ---- main ----
    async def run(self) -> int:
        try:
            _check_port_free(self.cfg.server.host, self.cfg.server.port)
            check_admin_socket_free(self.cfg.server.admin_socket)
        except (OSError, AdminSocketError) as e:
            _log(f"start-up failed: {e}", logging.ERROR)
            return 1

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.request_shutdown)
        loop.add_signal_handler(signal.SIGINT, self.request_shutdown)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        timeout = self.cfg.server.worker_ready_timeout_s
        sdnotify.notify(f"STATUS=starting {len(self.workers)} workers")
        try:
            await self.launcher.open()
        except (WorkerError, OSError) as e:
            _log(f"start-up failed: {e}", logging.ERROR)
            await self.launcher.close()
            return 1
        for w in self.workers:
            if not self.launcher.present(w.device_index):
                w.absent()  # no node offers it yet (server/node_joins.py)
        present = [w for w in self.workers if w.state is not WorkerState.ABSENT]
        results = await asyncio.gather(*(w.start(timeout) for w in present), return_exceptions=True)
        bad = [r for r in results if isinstance(r, BaseException)]
        if bad:
            for err in bad:
                _log(f"start-up failed: {err}", logging.ERROR)
            await asyncio.gather(*(w.stop() for w in self.workers))
            await self.launcher.close()
            return 1
        _log(f"{len(present)} workers ready: " + ", ".join(
            f"device {w.device_index} pid {w.pid}" + ("" if w.placement.node == "local" else f" on {w.placement.node}")
            for w in present) + "".join(f"; device {w.device_index} absent" for w in self.workers if not w.ready))
        measured = [w.memcpy_bps for w in self.workers if w.memcpy_bps > 0]
        if measured:  # the restore path estimates start from this machine's copy bandwidth
            self.life.bw.memcpy = min(measured)
        self._spawn(self._tick_loop(), "dispatch")
        sdnotify.notify(f"STATUS=loading {len(self.cfg.models)} models")
        placement = None
        if self.controller is not None:  # models without devices: packed by the oracle's sizes ([C])
            placement = await first_placement(self.cfg, self.oracle.describe_now, self.predictor())
        await self.ops.add_and_load(list(self.cfg.models), self.cfg.models, self.cfg.devices.count, placement)
        self.poke()
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
        self._spawn(self.launcher.watch(), "launcher")
        if self.cfg.devices.launcher == "ray":
            self._spawn(self._watch_joins(), "joins")
        self._spawn(self.oracle.run(self), "oracle")
        if self.controller is not None:
            self._spawn(self.controller.run(), "controller")
        wd = sdnotify.watchdog_interval_s()
        if wd:
            self._spawn(self._watchdog(wd), "watchdog")
        self._to(DaemonState.RUNNING)
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
        t_start = clock()
        self._to(DaemonState.DRAINING)
        sdnotify.notify("STOPPING=1\nSTATUS=draining")
        n = self.core.in_flight()
        _log(f"shutting down: draining {n} in-flight requests (up to {self.cfg.server.drain_timeout_s:g} s)")
        try:
            await asyncio.wait_for(self._idle.wait(), self.cfg.server.drain_timeout_s)
        except asyncio.TimeoutError:
            self.core.fail_all(Failure(503, "the server is shutting down", code="shutting_down"), clock())
        t_drained = clock()
        await asyncio.sleep(0.05)  # let handlers write their last bytes
        admin.close()
        await runner.cleanup()
        with contextlib.suppress(OSError):
            os.unlink(self.cfg.server.admin_socket)
        t_http = clock()
        if self.controller is not None:
            await self.controller.close()
        await self.oracle.close()  # its helper process is terminated, not joined at exit
        await self._stop_workers()
        self._to(DaemonState.STOPPED)
        _log(f"stopped (drain {t_drained - t_start:.3f} s, listeners {t_http - t_drained:.3f} s, "
             f"workers {clock() - t_http:.3f} s)")

    async def _stop_workers(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*(w.stop() for w in self.workers), return_exceptions=True)
        await self.launcher.close()

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

    # ---- the core's clock: tick when asked, or at once after an event ----
    def poke(self) -> None:
        self._tick_now.set()

    async def _tick_loop(self) -> None:
        backoff = TickBackoff()
        while True:
            self._tick_now.clear()
            try:
                wake_at = self.core.tick(clock())
            except Exception as e:  # never let one bad tick stop dispatching for good
                self.metrics.tick_errors.inc()
                v = backoff.failed(clock(), e)
                if v.message is not None:
                    log.error(v.message, exc_info=v.traceback)
                # deaf to pokes meanwhile (events arrive at token rate): the next tick serves them
                await asyncio.sleep(v.wait_s)
                continue
            if (note := backoff.succeeded(clock())) is not None:
                log.warning(note)
            # at least 1 ms: a wake-up already due must not spin the loop
            timeout = None if wake_at is None else max(0.001, wake_at - clock())
            try:
                await asyncio.wait_for(self._tick_now.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    # ---- config reload and admin operations (server/model_ops.py) ----
    async def reload(self) -> dict[str, Any]:
        ctl = self.controller

        async def placer(cfg: JanusConfig, added: list[ModelConfig]) -> dict[str, list[int]]:
            elastic = [p.app for p in ctl.room.pools if p.pool == "elastic"] if ctl is not None else []
            return await added_placement(cfg, added, self.core,
                                         self.oracle.describe_now, self.predictor(), elastic, self.clock())

        out = await model_ops.reload(self.ops, self.config, placer if ctl is not None else None)
        self.poke()
        return out

    async def load_model(self, name: str, checkpoint: str | None, devices: list[int]) -> dict[int, str]:
        out = await model_ops.load_model(self.ops, self.config, name, checkpoint, devices)
        self.poke()
        return out

    async def unload_model(self, name: str) -> dict[str, Any]:
        return await model_ops.unload_model(self.ops, name)

    async def remove_model(self, name: str) -> dict[str, Any]:
        return await model_ops.remove_model(self.ops, self.config, name)

    async def set_state(self, name: str, device: int, target: str, probe: bool = True,
                        role: str | None = None) -> dict[str, Any]:
        out = await self.life.set_state(name, device, target, probe, role)
        self.poke()
        return out

    def predictor(self) -> Any:
        """The oracle the controller asks (a fitted GP or the roofline prior per model)."""
        return self.oracle.oracle

    async def fork(self, name: str, src: int, dst: int) -> dict[str, Any]:
        out = await self.life.fork(name, src, dst)
        self.poke()
        return out

    def _absent_devices(self) -> list[int]:
        """Device slots no node offers now (server/node_joins.py): not the controller's to place on."""
        return [w.device_index for w in self.workers if w.state is WorkerState.ABSENT]

    # ---- views ----
    def health(self) -> dict[str, Any]:
        trouble = self.launcher.trouble  # the ray launcher's cluster not answering
        ok = self.state is DaemonState.RUNNING and all(w.ready for w in self.workers) and not trouble
        return {
            "status": "ok" if ok else ("draining" if self.state is DaemonState.DRAINING else "degraded"),
            "state": self.state,
            "workers": {str(w.device_index): w.state for w in self.workers},
            # devices not serving and why: restarting after a death or a hang, or failed
            "degraded_devices": {str(w.device_index): (w.hung and f"hung: {w.hung}") or w.state
                                 for w in self.workers if not w.ready},
            "models": {n: len(m.active) for n, m in self.core.models().items()},
            **({"launcher": trouble} if trouble else {}),
        }

    def snapshot(self) -> dict[str, Any]:
        s = self.core.snapshot(clock())
        s["workers"] = {w.device_index: (w.ready, w.restarts) for w in self.workers}
        s["worker_hangs"] = {w.device_index: w.hangs for w in self.workers}
        s["worker_failed"] = {w.device_index: w.state is WorkerState.FAILED for w in self.workers}
        s["pools"] = {w.device_index: w.last_stats.pool for w in self.workers if w.last_stats is not None}
        s["kv_usage"] = {w.device_index: w.last_stats.kv_usage for w in self.workers
                         if w.last_stats is not None and w.ready}
        s["engine"] = {w.device_index: w.last_stats.engine for w in self.workers
                       if w.last_stats is not None and w.ready}
        s["fork_fallbacks"] = self.life.fork_fallbacks
        return s

    def models_view(self) -> list[dict[str, Any]]:
        return [{"id": n, "max_model_len": m.max_model_len, "default_max_tokens": self.core.default_max_tokens(m),
                 "active_instances": len(m.active)}
                for n, m in self.core.models().items()]

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def config_toml(self) -> str:
        return dump_config(self.cfg)
