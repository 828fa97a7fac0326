"""`janus ctl`: operate a running daemon over its admin Unix socket.

status | models | instances | pools | load NAME | unload NAME | remove NAME | drain | config |
state NAME --device N active|warm|cold | fork NAME --from N --to M | oracle | plan.
Prints rich tables, or exactly one JSON object with --json (for scripts). The socket
path comes from --socket, else from --config's server.admin_socket, else the default.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from typing import Any

from janusd.lifecycle.states import TARGETS

SUBCOMMANDS = ("status", "models", "instances", "pools", "load", "unload", "remove", "drain", "config", "state", "fork",
               "oracle", "plan")
_NAMED = ("load", "unload", "remove", "state", "fork")


def _seconds(text: str) -> float:
    """--timeout: a positive number (0 would make the socket non-blocking: EAGAIN, not a wait)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return v


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", help="admin socket path (default: server.admin_socket of --config or the default)")
    p.add_argument("--config", metavar="FILE", help="config file to read the admin socket path from")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--timeout", type=_seconds, default=600.0, help="seconds to wait for the reply (load can be slow)")
    p.add_argument("action", choices=SUBCOMMANDS)
    p.add_argument("name", nargs="?", help="model name (load, unload, remove, state, fork)")
    p.add_argument("target", nargs="?", choices=tuple(TARGETS), help="state: the state to move to")
    p.add_argument("--checkpoint", help="load: checkpoint spec of a model not in the config")
    p.add_argument("--device", type=int, action="append", default=[],
                   help="load: device index (repeatable); state: the instance's device")
    p.add_argument("--from", dest="from_device", type=int, help="fork: the device serving the model")
    p.add_argument("--to", dest="to_device", type=int, help="fork: the device to bring it up on")


def _socket_path(args: argparse.Namespace) -> str:
    if args.socket:
        return str(args.socket)
    from janusd.config import load_config

    return load_config(args.config).server.admin_socket


def _request(args: argparse.Namespace) -> Any:
    from janusd.wire import admin_msgs as am

    a = args.action
    if a in _NAMED and not args.name:
        raise ValueError(f"{a}: a model name is required (janus ctl {a} NAME)")
    if a not in _NAMED and args.name:
        raise ValueError(f"{a} takes no argument (got {args.name!r})")
    if (args.target is not None) != (a == "state"):
        raise ValueError("state needs a target (janus ctl state NAME --device N active|warm|cold)" if a == "state"
                         else f"{a} takes no state argument (got {args.target!r})")
    if a == "state" and len(args.device) != 1:
        raise ValueError("state: give exactly one --device N")
    if a == "fork" and (args.from_device is None or args.to_device is None):
        raise ValueError("fork: give --from N and --to M")
    return {
        "status": lambda: am.StatusReq(),
        "models": lambda: am.ModelsReq(),
        "instances": lambda: am.InstancesReq(),
        "pools": lambda: am.PoolsReq(),
        "load": lambda: am.LoadReq(args.name, args.checkpoint, list(args.device)),
        "unload": lambda: am.UnloadReq(args.name),
        "remove": lambda: am.RemoveReq(args.name),
        "drain": lambda: am.DrainReq(),
        "config": lambda: am.ConfigReq(),
        "state": lambda: am.StateReq(args.name, args.device[0] if args.device else 0, args.target or ""),
        "fork": lambda: am.ForkReq(args.name, args.from_device, args.to_device),
        "oracle": lambda: am.OracleReq(),
        "plan": lambda: am.PlanReq(),
    }[a]()


def call(path: str, req: Any, timeout: float = 60.0) -> Any:
    """Send one admin request and return the decoded reply (AdminResult or AdminError)."""
    import msgspec

    from janusd.wire import admin_msgs as am
    from janusd.wire.framing import BlockingFramedSocket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        try:
            s.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise ConnectionError(f"cannot reach the daemon's admin socket {path} ({e.strerror}); is `janus serve` "
                                  "running with this server.admin_socket? (--socket or --config choose it)") from None
        conn = BlockingFramedSocket(s, msgspec.msgpack.Encoder())
        try:
            conn.send(req)
            body = conn.recv()
        except TimeoutError:
            raise TimeoutError(f"{path}: no reply within {timeout:g} s (raise --timeout)") from None
    if body is None:
        raise ConnectionError(f"{path}: the daemon closed the connection without a reply")
    return am.reply_decoder().decode(body)


def _table(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    for c in cols:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*("" if r.get(c) is None else str(r.get(c)) for c in cols))
    # piped output (no terminal) gets a wide page instead of rich's 80 columns
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def _print(action: str, data: dict[str, Any]) -> None:
    if action == "config":
        sys.stdout.write(data["toml"])
        return
    if action == "pools":
        keep = ("device", "state", "models", "running", "engine_requests", "num_pages", "free_pages",
                "weight_pages", "kv_pages", "cached_pages", "fragmentation_pct")
        _table("pools", [{k: r[k] for k in keep if k in r} for r in data["pools"]])
        return
    key = {"models": "models", "instances": "instances", "oracle": "oracle"}.get(action)
    if key:
        _table(key, data[key])
        return
    if action == "status":
        flat = {k: v for k, v in data.items() if k not in ("workers", "dispatch")}
        _table("janusd", [flat])
        _table("workers", data["workers"])
        _table("dispatch", [data["dispatch"]])
        return
    if action == "plan":
        p = data["plan"]
        if not p.get("managed"):
            _table("plan", [p])
            return
        st = p.get("steady") or {}
        if st.get("bins_used") is not None:
            _table("steady placement", [{k: st[k] for k in ("planned_at_s_ago", "bins_used", "phi", "migrations",
                                                             "failed_plans") if k in st}])
            _table("steady devices", st["devices"])
            _table("steady moves (last plan)", st["moves"])
            _table("steady moves running / queued", st["running"] + st["queued"])
            _table("steady moves done", st["recent"])
            if st.get("notes"):
                _table("steady notes", [{"note": n} for n in st["notes"]])
        e = p["elastic"]
        _table("elastic", [{k: v for k, v in e.items() if k != "apps"}])
        _table("pools", p.get("pools", []))
        _table("elastic models", [{k: v for k, v in a.items() if k not in ("instances", "held")} for a in e["apps"]])
        roles = [{"model": a["model"], **i} for a in e["apps"] for i in a.get("instances", ())]
        if roles:  # elastic P/D models: each instance's role now
            _table("P/D roles", roles)
            _table("P/D removals held", [{"model": a["model"], **h} for a in e["apps"] for h in a.get("held", ())])
        _table("keep-alive", p["keepalive"])
        _table("in flight", p["in_flight"])
        _table("recent operations", [{k: v for k, v in r.items() if k != "phases"} for r in p["recent"]])
        return
    if action in ("state", "fork"):  # one row for the move, one for its phases
        _table(action, [{k: v for k, v in data.items() if k != "phases"}])
        if data.get("phases"):
            _table("phases (s)", [data["phases"]])
        return
    _table(action, [data])


def run(args: argparse.Namespace) -> int:
    from janusd.wire import admin_msgs as am

    try:
        path = _socket_path(args)
        reply = call(path, _request(args), args.timeout)
    except (OSError, ValueError) as e:
        msg = f"janus ctl: {e}"
        print(json.dumps({"error": msg}) if args.json else msg, file=sys.stdout if args.json else sys.stderr)
        return 1
    if isinstance(reply, am.AdminError):
        print(json.dumps({"error": reply.message}) if args.json else f"janus ctl: {reply.message}",
              file=sys.stdout if args.json else sys.stderr)
        return 1
    if args.json:
        print(json.dumps(reply.data, default=str))
    else:
        _print(args.action, reply.data)
    return 0
