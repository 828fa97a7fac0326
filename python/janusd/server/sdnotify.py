"""systemd's notify protocol, written directly: one datagram to $NOTIFY_SOCKET.

Type=notify units learn READY=1 (serving), STOPPING=1 (shutdown began) and WATCHDOG=1
(alive) this way. Why not a library: the protocol is a single sendto() of "KEY=VALUE"
lines on an AF_UNIX datagram socket; a leading '@' names an abstract socket.
Without NOTIFY_SOCKET (not under systemd) every call is a no-op returning False.
"""

from __future__ import annotations

import os
import socket


def notify(state: str, env: dict[str, str] | None = None) -> bool:
    """Send `state` (e.g. "READY=1\\nSTATUS=serving"); True when a datagram was sent."""
    path = (env if env is not None else os.environ).get("NOTIFY_SOCKET", "")
    if not path:
        return False
    addr = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.sendto(state.encode(), addr)
    except OSError:
        return False
    return True


def watchdog_interval_s(env: dict[str, str] | None = None) -> float | None:
    """Half of WATCHDOG_USEC in seconds (systemd's advice), or None when no watchdog is
    set or it is meant for another process (WATCHDOG_PID names someone else)."""
    e = env if env is not None else os.environ
    usec = e.get("WATCHDOG_USEC", "")
    pid = e.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    return int(usec) / 2e6
