"""`janus ctl`: operate a running daemon over its admin Unix socket.

status | models | instances | pools | load NAME | unload NAME | remove NAME | drain | config |
state NAME --device N active|warm|cold | fork NAME --from N --to M | oracle | plan |
events [--follow] [--last N].
Prints rich tables that fit 80 columns (the essential columns; --wide: all of them,
ctl_tables.py), or exactly one JSON object with --json (for scripts; `events --follow
--json` prints one JSON object per line, one per decision as it starts and as it ends).
The socket path comes from --socket, else from --config's server.admin_socket, else the
default.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from typing import Any

from janusd.cli_types import positive_number, whole_number

from janusd.lifecycle.states import TARGETS

SUBCOMMANDS = ("status", "models", "instances", "pools", "load", "unload", "remove", "drain", "config", "state", "fork",
               "oracle", "plan", "events")
_NAMED = ("load", "unload", "remove", "state", "fork")


_seconds = positive_number  # --timeout: 0 would make the socket non-blocking (EAGAIN, not a wait)
_count = whole_number(0)  # --last: a negative count is refused, not read as 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", help="admin socket path (default: server.admin_socket of --config or the default)")
    p.add_argument("--config", metavar="FILE", help="config file to read the admin socket path from")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--wide", action="store_true", help="tables with every column (default: the essential ones, "
                   "to fit 80 columns)")
    p.add_argument("--timeout", type=_seconds, default=600.0, help="seconds to wait for the reply (load can be slow)")
    p.add_argument("action", choices=SUBCOMMANDS)
    p.add_argument("name", nargs="?", help="model name (load, unload, remove, state, fork)")
    p.add_argument("target", nargs="?", choices=tuple(TARGETS), help="state: the state to move to")
    p.add_argument("--checkpoint", help="load: checkpoint spec of a model not in the config")
    p.add_argument("--device", type=int, action="append", default=[],
                   help="load: device index (repeatable); state: the instance's device")
    p.add_argument("--from", dest="from_device", type=int, help="fork: the device serving the model")
    p.add_argument("--to", dest="to_device", type=int, help="fork: the device to bring it up on")
    p.add_argument("--follow", "-f", action="store_true", help="events: keep printing decisions as they start "
                   "and end (Ctrl-C stops)")
    p.add_argument("--last", type=_count, default=0, metavar="N", help="events: only the last N (default: all kept)")
    p.add_argument("--interval", type=_seconds, default=0.5, help="events --follow: seconds between polls")


def take_rest(args: argparse.Namespace, rest: list[str]) -> bool:
    """Positionals argparse left over because an option came between them (`state NAME
    --device N warm`): they fill NAME and the target in order, else they are refused."""
    if any(w.startswith("-") for w in rest):
        return False
    words = list(rest)
    if args.name is None and words:
        args.name = words.pop(0)
    if args.target is None and words and words[0] in TARGETS:
        args.target = words.pop(0)
    return not words


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
    if a != "events" and (args.follow or args.last):
        raise ValueError(f"{a}: --follow and --last are for `janus ctl events`")
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
        "events": lambda: am.EventsReq(0, args.last),
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


def _print(action: str, data: dict[str, Any], wide: bool = False) -> None:
    from janusd.ctl_tables import print_reply

    print_reply(action, data, wide)


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
    if args.action == "events" and args.follow:
        return _follow(path, args, reply.data)
    if args.json:
        print(json.dumps(reply.data, default=str))
    else:
        _print(args.action, reply.data, args.wide)
    return 0


def _follow(path: str, args: argparse.Namespace, first: dict[str, Any]) -> int:
    """`ctl events --follow`: the kept decisions, then each change as it comes (a line,
    or a JSON object per line), polling every --interval; a daemon that goes away is
    waited for (its new ring starts again at version 0). Ctrl-C ends it (status 0)."""
    from janusd.ctl_tables import event_line
    from janusd.wire import admin_msgs as am

    def out(events: list[dict[str, Any]]) -> None:
        for e in events:
            print(json.dumps(e, default=str) if args.json else event_line(e), flush=True)

    after, away = first["version"], False
    try:  # Ctrl-C ends it cleanly wherever it lands, the first lines included
        out(first["events"])
        while True:
            time.sleep(args.interval)
            try:
                reply = call(path, am.EventsReq(after, 0), args.timeout)
            except OSError as e:
                if not away:
                    print(f"janus ctl: {e}; waiting for the daemon", file=sys.stderr, flush=True)
                away = True
                continue
            if isinstance(reply, am.AdminError):
                print(f"janus ctl: {reply.message}", file=sys.stderr)
                return 1
            data = reply.data
            if data["version"] < after:  # a new daemon: its ring starts again
                reply = call(path, am.EventsReq(0, 0), args.timeout)
                data = reply.data if isinstance(reply, am.AdminResult) else {"events": [], "version": 0}
            if away:
                print("janus ctl: the daemon is back", file=sys.stderr, flush=True)
                away = False
            out(data["events"])
            after = data["version"]
    except KeyboardInterrupt:
        return 0
