"""The admin Unix socket: msgspec msgpack requests and replies for `janus ctl`.

The socket is created with mode 0600 (umask held while binding, so it is never
reachable by others even for an instant) in a parent directory created 0700 if absent.
Every request gets exactly one reply; a request that cannot be decoded or that fails
gets an AdminError naming the problem, and the connection (and the daemon) live on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from janusd.config import JanusConfig
from janusd.core import ServingCore
from janusd.server.controller import Controller
from janusd.server.decisions import DecisionLog
from janusd.server.metrics import Metrics
from janusd.server.model_ops import ConfigHolder
from janusd.server.oracle_refit import OracleRefit
from janusd.server.workers import WorkerHandle
from janusd.wire import admin_msgs as am
from janusd.wire.framing import FrameError, encode_frame, read_frame


class AdminBackend(Protocol):
    """What the admin socket needs of the daemon (server/daemon.py implements it)."""

    core: ServingCore
    workers: list[WorkerHandle]
    config: ConfigHolder
    state: str
    started_loop: float
    http_port: int | None
    clock: Callable[[], float]
    oracle: OracleRefit
    controller: Controller | None
    decisions: DecisionLog
    metrics: Metrics

    @property
    def cfg(self) -> JanusConfig: ...
    def request_shutdown(self) -> None: ...
    async def refresh_stats(self) -> None: ...
    async def load_model(self, name: str, checkpoint: str | None, devices: list[int]) -> dict[int, str]: ...
    async def unload_model(self, name: str) -> dict[str, Any]: ...
    async def remove_model(self, name: str) -> dict[str, Any]: ...
    async def set_state(self, name: str, device: int, target: str) -> dict[str, Any]: ...
    async def fork(self, name: str, src: int, dst: int) -> dict[str, Any]: ...
    def config_toml(self) -> str: ...

MAX_ADMIN_FRAME = 1 << 20


class AdminSocketError(RuntimeError):
    pass


def _socket_in_use(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def check_admin_socket_free(path: str) -> None:
    """Fail before minutes of model loading, not after, when another daemon owns the socket."""
    if (Path(path).exists() or Path(path).is_symlink()) and _socket_in_use(path):
        raise AdminSocketError(f"{path}: another daemon is listening on this admin socket")


async def start_admin(daemon: AdminBackend, path: str) -> asyncio.AbstractServer:
    p = Path(path)
    if not p.parent.exists():
        p.parent.mkdir(parents=True, mode=0o700)
    if p.exists() or p.is_symlink():
        if _socket_in_use(path):
            raise AdminSocketError(f"{path}: another daemon is listening on this admin socket")
        p.unlink()
    old = os.umask(0o177)
    try:
        server = await asyncio.start_unix_server(lambda r, w: _serve(daemon, r, w), path=path)
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    return server


async def _serve(daemon: AdminBackend, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    enc = msgspec.msgpack.Encoder()
    dec = am.request_decoder()
    try:
        while True:
            try:
                body = await read_frame(reader, MAX_ADMIN_FRAME)
            except FrameError as e:
                writer.write(encode_frame(enc, am.AdminError(str(e))))
                break
            if body is None:
                break
            try:
                req = dec.decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                reply: Any = am.AdminError(f"bad admin request: {e}")
            else:
                try:
                    reply = am.AdminResult(await handle(daemon, req))
                except (ValueError, KeyError) as e:
                    reply = am.AdminError(str(e).strip("'\""))
                except Exception as e:  # an admin command must never take the daemon down
                    reply = am.AdminError(f"internal error: {type(e).__name__}: {e}")
            writer.write(encode_frame(enc, reply))
            await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


def _fit(core: ServingCore, model: str, device: int) -> dict[str, Any]:
    """The online prefill-time fit t = a + b * tokens of one instance (PAPER.md §6 p_j)."""
    est = core.prefill_fits(model).get(device)
    if est is None:
        return {}
    a, b = est.coefficients()
    return {"prefill_a_ms": round(a * 1e3, 3), "prefill_b_us_per_token": round(b * 1e6, 3),
            "prefill_samples": est.n}


def _where(daemon: AdminBackend) -> dict[int, dict[str, str]]:
    """Each device's host (its transfer address) and node (server/launcher.py Placement)."""
    return {w.device_index: {"host": w.placement.host, "node": w.placement.node} for w in daemon.workers}


def _instances(core: ServingCore, now: float, where: dict[int, dict[str, str]]) -> list[dict[str, Any]]:
    rows = []
    for m in core.models().values():
        for i in m.instances.values():
            epdt = core.epdt(i, now) if i.dispatched and i.active else None
            rows.append({
                "instance": i.instance_id, "model": i.model, "device": i.device, **where.get(i.device, {}),
                "state": i.state.value,
                "role": i.role if m.cfg.prefill_devices else m.cfg.role, "error": i.error,
                "load_s": round(i.load_s, 3), "served": i.served,
                "decoding": len(i.decoding),  # P/D decode backlog (sequences)
                **_fit(core, i.model, i.device),
                "epdt_in_s": round(max(0.0, epdt - now), 4) if epdt is not None else None,
            })
    return rows


async def handle(daemon: AdminBackend, req: Any) -> dict[str, Any]:
    core = daemon.core
    now = daemon.clock()
    if isinstance(req, am.StatusReq):
        return {
            "state": daemon.state,
            "pid": os.getpid(),
            "uptime_s": round(now - daemon.started_loop, 3),
            "http": f"{daemon.cfg.server.host}:{daemon.http_port}",
            "workers": [{"device": w.device_index, "state": w.state, "pid": w.pid, "restarts": w.restarts,
                         "host": w.placement.host, "node": w.placement.node} for w in daemon.workers],
            "models": len(core.models()),
            "in_flight": core.in_flight(),
            "dispatch": core.dispatch_stats(),
        }
    if isinstance(req, am.ModelsReq):
        return {"models": _models(daemon, now)}
    if isinstance(req, am.InstancesReq):
        return {"instances": _instances(core, now, _where(daemon))}
    if isinstance(req, am.EventsReq):
        return daemon.decisions.view(req.after, req.limit or None)
    if isinstance(req, am.PoolsReq):
        if req.refresh:
            await daemon.refresh_stats()
        return {"pools": _pools(daemon)}
    if isinstance(req, am.LoadReq):
        return {"loaded": req.name, "devices": await daemon.load_model(req.name, req.checkpoint, req.devices)}
    if isinstance(req, am.UnloadReq):
        return {"unloaded": req.name, **await daemon.unload_model(req.name)}
    if isinstance(req, am.RemoveReq):
        return {"removed": req.name, **await daemon.remove_model(req.name)}
    if isinstance(req, am.StateReq):
        return await daemon.set_state(req.name, req.device, req.target)
    if isinstance(req, am.ForkReq):
        return await daemon.fork(req.name, req.src, req.dst)
    if isinstance(req, am.DrainReq):
        n = core.in_flight()
        daemon.request_shutdown()
        return {"draining": n, "drain_timeout_s": daemon.cfg.server.drain_timeout_s}
    if isinstance(req, am.PlanReq):
        if daemon.controller is None:
            return {"plan": {"managed": False, "note": "control.managed is false: every model stays as configured"}}
        return {"plan": daemon.controller.view(now)}
    if isinstance(req, am.OracleReq):
        return {"oracle": daemon.oracle.status(now)}
    if isinstance(req, am.ConfigReq):
        return {"toml": daemon.config_toml(), "path": daemon.config.path,
                "source": daemon.config.path or "embedded default",
                "config": msgspec.to_builtins(daemon.cfg)}
    raise ValueError(f"unknown admin request {type(req).__name__}")


def _models(daemon: AdminBackend, now: float) -> list[dict[str, Any]]:
    """`ctl models`: each model's config, instances, queue and the last minute's traffic."""
    core = daemon.core
    rows = []
    ctl = daemon.controller
    pools = {p.app: p.pool for p in ctl.room.pools} if ctl is not None else {}
    for name, m in core.models().items():
        win = core.window(name, now)  # the last minute of traffic (telemetry/)
        lat = daemon.metrics.recent.figures(name, now)  # the last minute's ended requests
        rows.append({
            "name": name, "checkpoint": m.cfg.checkpoint, "app": m.cfg.app_name,
            "devices": sorted(d for d, i in m.instances.items() if i.state.value != "unloaded"),
            "active": len(m.active), "ttft_slo_ms": m.cfg.ttft_slo_ms,
            "tpot_slo_ms": m.cfg.tpot_slo_ms, "queued": core.queue_length(name),
            "in_flight": core.in_flight(name), "max_model_len": m.max_model_len,
            "rate_rps": round(win.request_rate, 3), "out_tok_s": round(win.output_token_rate, 1),
            "in_len_mean": round(win.input_len_mean, 1), "out_len_mean": round(win.output_len_mean, 1),
            # the pool it is in now (the classifier's when managed), requests waiting for an
            # Active instance, and the last minute's latencies and per-token attainment
            "pool": pools.get(name, m.cfg.pool), "held": core.held_count(name),
            "ended_1m": lat.requests, "ttft_p50_ms": _ms(lat.ttft_p50_s), "ttft_p99_ms": _ms(lat.ttft_p99_s),
            "tpot_p50_ms": _ms(lat.tpot_p50_s), "tpot_p99_ms": _ms(lat.tpot_p99_s),
            "attainment_1m": None if lat.attainment is None else round(lat.attainment, 4),
        })
    return rows


def _pools(daemon: AdminBackend) -> list[dict[str, Any]]:
    """`ctl pools`: each worker's last Stats (models, running, pool pages)."""
    rows = []
    for w in daemon.workers:
        row: dict[str, Any] = {"device": w.device_index, "host": w.placement.host, "node": w.placement.node,
                               "state": w.state}
        if w.last_stats is not None:
            row["models"] = w.last_stats.models
            row["running"] = w.last_stats.running
            row["engine_requests"] = w.last_stats.engine_requests
            row["host_copies"] = w.last_stats.host_copies
            row.update(w.last_stats.pool)
        rows.append(row)
    return rows
