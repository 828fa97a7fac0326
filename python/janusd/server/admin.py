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
from typing import TYPE_CHECKING, Any

import msgspec

from janusd.wire import admin_msgs as am
from janusd.wire.framing import FrameError, encode_frame, read_frame

if TYPE_CHECKING:
    from janusd.server.daemon import Daemon

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


async def start_admin(daemon: Daemon, path: str) -> asyncio.AbstractServer:
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


async def _serve(daemon: Daemon, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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


def _fit(daemon: Daemon, model: str, device: int) -> dict[str, Any]:
    """The online prefill-time fit t = a + b * tokens of one instance (PAPER.md §6 p_j)."""
    est = daemon.sched.estimators.get((model, device))
    if est is None:
        return {}
    a, b = est.coefficients()
    return {"prefill_a_ms": round(a * 1e3, 3), "prefill_b_us_per_token": round(b * 1e6, 3),
            "prefill_samples": est.n}


async def handle(daemon: Daemon, req: Any) -> dict[str, Any]:
    from janusd.server.daemon import clock

    if isinstance(req, am.StatusReq):
        return {
            "state": daemon.state,
            "pid": os.getpid(),
            "uptime_s": round(clock() - daemon.started_loop, 3),
            "http": f"{daemon.cfg.server.host}:{daemon.http_port}",
            "workers": [{"device": w.device_index, "state": w.state, "pid": w.pid, "restarts": w.restarts}
                        for w in daemon.workers],
            "models": len(daemon.models.models),
            "in_flight": daemon.requests.count(),
            "dispatch": daemon.sched.stats(),
        }
    if isinstance(req, am.ModelsReq):
        rows = []
        for name, e in daemon.models.models.items():
            rows.append({
                "name": name, "checkpoint": e.cfg.checkpoint, "app": e.cfg.app_name,
                "devices": sorted(e.placements), "active": len(e.active), "ttft_slo_ms": e.cfg.ttft_slo_ms,
                "tpot_slo_ms": e.cfg.tpot_slo_ms, "queued": daemon.sched.pending(name),
                "in_flight": daemon.requests.count(name), "max_model_len": e.max_model_len,
            })
        return {"models": rows}
    if isinstance(req, am.InstancesReq):
        rows = []
        now = clock()
        for e in daemon.models.models.values():
            for p in e.placements.values():
                role = e.role_on(p.device) if e.cfg.prefill_devices else e.cfg.role
                rows.append({
                    "instance": p.inst.instance_id if p.inst else None, "model": p.model, "device": p.device,
                    "state": p.state, "role": role, "error": p.error, "load_s": round(p.load_s, 3),
                    "served": p.inst.served if p.inst else 0,
                    "decoding": len(p.inst.decoding) if p.inst else 0,  # P/D decode backlog (sequences)
                    **_fit(daemon, p.model, p.device),
                    "epdt_in_s": round(max(0.0, daemon.sched.epdt(p.inst, now) - now), 4)
                    if p.inst and p.inst.dispatched else None,
                })
        return {"instances": rows}
    if isinstance(req, am.PoolsReq):
        await daemon.refresh_stats()
        rows = []
        for w in daemon.workers:
            row: dict[str, Any] = {"device": w.device_index, "state": w.state}
            if w.last_stats is not None:
                row["models"] = w.last_stats.models
                row["running"] = w.last_stats.running
                row["engine_requests"] = w.last_stats.engine_requests
                row.update(w.last_stats.pool)
            rows.append(row)
        return {"pools": rows}
    if isinstance(req, am.LoadReq):
        return {"loaded": req.name, "devices": await daemon.load_model(req.name, req.checkpoint, req.devices)}
    if isinstance(req, am.UnloadReq):
        return {"unloaded": req.name, **await daemon.unload_model(req.name)}
    if isinstance(req, am.DrainReq):
        n = daemon.requests.count()
        daemon.request_shutdown()
        return {"draining": n, "drain_timeout_s": daemon.cfg.server.drain_timeout_s}
    if isinstance(req, am.ConfigReq):
        return {"toml": daemon.config_toml(), "path": daemon.config_path}
    raise ValueError(f"unknown admin request {type(req).__name__}")
