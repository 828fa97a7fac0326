"""A remotely launched worker dies with the process that started it (server/ray_task.py's
Ray task); the token's variable is wire/hello.py's TOKEN_ENV (both sides name it)."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """SIGKILL us when the process that started us dies (Linux): a Ray task cancelled or
    lost with its node must not leave a worker holding its device. Exits at once when the
    parent is already gone (the race before the call)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent or parent == 1:
        os._exit(1)
