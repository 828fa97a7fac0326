"""What runs inside the Ray task on a device's node (server/ray_launcher.py submits it).

It only starts `python -m janusd.engine.worker --connect ...` beside itself and waits:
the worker dials the daemon and speaks frames to it directly, so Ray carries the launch
arguments in and an exit code out, never a janus message. The worker ties its life to
this task's process (PR_SET_PDEATHSIG in engine/worker.py), so a task Ray cancels, or a
node that goes down, ends the worker too, and its TCP stream's EOF tells the daemon.
This module imports nothing of Ray: any Ray version that can run a plain function can
run it, and it stays importable (and testable) without Ray.
"""

from __future__ import annotations

import os
import subprocess
import sys

from janusd.wire.hello import TOKEN_ENV


# how often the task looks whether its node's raylet (its parent) is still there
RAYLET_CHECK_S = 0.05


def run_worker(worker_args: list[str], token: str) -> int:
    """Start the worker with the daemon's token in its environment (not on its command
    line, where any user of the node could read it); its exit code.

    A node taken down kills its raylet first; Ray's worker process notices that only at
    its own death check (`raylet_death_check_interval_milliseconds`, 1 s by default), so
    the task watches its parent itself and kills the worker the moment the raylet is
    gone: the daemon sees the stream's EOF well inside the 1 s a client may wait."""
    raylet = os.getppid()
    env = {**os.environ, TOKEN_ENV: token}
    proc = subprocess.Popen([sys.executable, "-m", "janusd.engine.worker", *worker_args],
                            env=env, stdin=subprocess.DEVNULL)
    while True:
        try:
            return proc.wait(RAYLET_CHECK_S)
        except subprocess.TimeoutExpired:
            if os.getppid() != raylet:
                proc.kill()
                return proc.wait()
