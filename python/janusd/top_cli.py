"""`janus top`: the operator's live view of a running daemon, over its admin socket.

Every --interval seconds (1 s) it asks the daemon for its status, models, instances,
pools and last decisions (five read-only admin requests on one connection) and redraws
the screen that top_view.py lays out from the replies: devices with their page pools,
models against their SLOs, the controller's decisions with their reasons. It fits the
terminal (80x24 at least; more columns and lines show more) and redraws on a resize.
q (or Ctrl-C) quits and gives the terminal back as it was. When the daemon cannot be
reached (stopped, restarting) the screen says DISCONNECTED with the last round still
shown, and it reconnects by itself.

--once prints one frame and exits (status 1 when the daemon cannot be reached): for
scripts and tests, at --width x --height (default: the terminal's, else 80 columns and
every line); with --json the frame's replies as one JSON object instead. Without a
terminal on stdin and stdout it does the same.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from typing import Any

from janusd.cli_types import positive_number, whole_number


_positive = positive_number
_size_arg = whole_number(1)  # --width, --height, --decisions


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--socket", help="admin socket path (default: server.admin_socket of --config or the default)")
    p.add_argument("--config", metavar="FILE", help="config file to read the admin socket path from")
    p.add_argument("--interval", type=_positive, default=1.0, help="seconds between refreshes (default 1)")
    p.add_argument("--once", action="store_true", help="print one frame and exit (no terminal needed)")
    p.add_argument("--json", action="store_true", help="with --once: the frame's admin replies as one JSON object")
    p.add_argument("--width", type=_size_arg, help="--once: columns (default: the terminal's, else 80)")
    p.add_argument("--height", type=_size_arg, help="--once: lines (default: the terminal's, else every line)")
    p.add_argument("--decisions", type=_size_arg, default=50, metavar="N", help="decisions asked for each round")


def _socket_path(args: argparse.Namespace) -> str:
    if args.socket:
        return str(args.socket)
    from janusd.config import load_config

    return load_config(args.config).server.admin_socket


class Client:
    """One connection to the admin socket, opened on demand and dropped on any error."""

    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self.path = path
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.conn: Any = None

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = self.conn = None

    def ask(self, req: Any) -> dict[str, Any]:
        import msgspec

        from janusd.wire import admin_msgs as am
        from janusd.wire.framing import BlockingFramedSocket

        if self.conn is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            try:
                s.connect(self.path)
            except OSError as e:
                s.close()
                raise ConnectionError(e.strerror or str(e)) from None
            self.sock, self.conn = s, BlockingFramedSocket(s, msgspec.msgpack.Encoder())
        try:
            self.conn.send(req)
            body = self.conn.recv()
        except (OSError, EOFError) as e:
            self.close()
            raise ConnectionError(str(e) or type(e).__name__) from None
        if body is None:
            self.close()
            raise ConnectionError("the daemon closed the connection")
        reply = am.reply_decoder().decode(body)
        if isinstance(reply, am.AdminError):
            raise ConnectionError(f"admin error: {reply.message}")
        return reply.data  # type: ignore[no-any-return]


def fetch(client: Client, last: Any, decisions: int = 50) -> Any:
    """One round of replies as a Frame; on an error, the last frame marked disconnected."""
    from janusd.top_view import Frame
    from janusd.wire import admin_msgs as am

    try:
        return Frame(socket=client.path, at=time.time(),
                     status=client.ask(am.StatusReq()),
                     models=client.ask(am.ModelsReq())["models"],
                     instances=client.ask(am.InstancesReq())["instances"],
                     pools=client.ask(am.PoolsReq(False))["pools"],
                     events=client.ask(am.EventsReq(0, decisions))["events"])
    except (ConnectionError, TimeoutError, KeyError) as e:
        client.close()
        old = last or Frame(socket=client.path)
        return Frame(socket=client.path, at=old.at, status=old.status, models=old.models, instances=old.instances,
                     pools=old.pools, events=old.events, error=str(e) or type(e).__name__)


def _size(args: argparse.Namespace) -> tuple[int, int | None]:
    tty = sys.stdout.isatty()
    try:
        cols, rows = os.get_terminal_size(sys.stdout.fileno()) if tty else (None, None)
    except OSError:
        cols, rows = None, None
    return args.width or cols or 80, args.height or rows


def run(args: argparse.Namespace) -> int:
    try:
        path = _socket_path(args)
    except (OSError, ValueError) as e:
        print(f"janus top: {e}", file=sys.stderr)
        return 1
    client = Client(path)
    if args.once or not (sys.stdout.isatty() and sys.stdin.isatty()):
        return _once(args, client)
    return _live(args, client)


def _once(args: argparse.Namespace, client: Client) -> int:
    from janusd.top_view import text

    frame = fetch(client, None, args.decisions)
    client.close()
    if args.json:
        print(json.dumps(frame.data(), default=str))
    else:
        width, height = _size(args)
        sys.stdout.write(text(frame, width, height))
    return 0 if frame.error is None else 1


def _terminal_size(console: Any) -> tuple[int, int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
        return size.columns, size.lines
    except OSError:
        return console.size  # type: ignore[no-any-return]


def _live(args: argparse.Namespace, client: Client) -> int:
    """The refreshing screen: the alternate screen, keys read without echo, q quits."""
    import select
    import signal
    import termios
    import tty

    from rich.console import Console
    from rich.live import Live

    from janusd.top_view import render

    console = Console()
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    resized = [False]
    old_winch = signal.signal(signal.SIGWINCH, lambda *_: resized.__setitem__(0, True))
    frame = None
    try:
        tty.setcbreak(fd)
        with Live(console=console, screen=True, auto_refresh=False, transient=True) as live:
            next_at = 0.0
            while True:
                now = time.monotonic()
                if now >= next_at:
                    frame = fetch(client, frame, args.decisions)
                    next_at = now + args.interval
                    resized[0] = True
                if resized[0] and frame is not None:
                    resized[0] = False
                    w, h = _terminal_size(console)
                    console.size = (w, h)  # the terminal's, not $COLUMNS / $LINES of the shell's start
                    live.update(render(frame, w, h), refresh=True)
                ready, _, _ = select.select([fd], [], [], max(0.0, min(0.1, next_at - time.monotonic())))
                if ready:
                    key = os.read(fd, 32)
                    if not key or b"q" in key or b"Q" in key or b"\x03" in key:  # q, Ctrl-C, or the terminal gone
                        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, old_winch)
        client.close()
