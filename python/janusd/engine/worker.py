"""The worker PROCESS: one per device, started by the daemon as
`python -m janusd.engine.worker --fd N --device-index I ...` (spawn/exec, never fork), or,
under the ray launcher, by a Ray task on the device's node with `--connect HOST:PORT
--launch ID` and the daemon's token in JANUSD_WORKER_TOKEN: it then dials the daemon and
sends a wire/hello.py Hello first (server/connect_back.py).

This module is the process around the engine loop (engine/worker_proc.py WorkerProc):
it pins the cores, starts the device engine, answers the daemon's handshake, and exits
without the interpreter's teardown. The daemon tokenizes through us so that it never
imports engine/ or torch (DESIGN.md). A clean EOF from the daemon (it died or closed)
ends the worker: no orphans.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import traceback

from janusd.engine.worker_env import die_with_parent
from janusd.engine.worker_log import log
from janusd.engine.worker_proc import WorkerProc
from janusd.wire import worker_msgs as wm
from janusd.wire.framing import BlockingFramedSocket
from janusd.wire.hello import TOKEN_ENV, Hello


def _pin(spec: str) -> None:
    """Run on the given host cores (devices.cpu_cores), before torch starts its threads so
    they inherit the set; ValueError naming the cores when the host has no such core."""
    try:
        cores = {int(c) for c in spec.split(",") if c.strip()}
    except ValueError:
        raise ValueError(f"--cpu-cores {spec!r}: not a comma-separated list of core numbers") from None
    try:
        os.sched_setaffinity(0, cores)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot pin to host cores {sorted(cores)} (devices.cpu_cores; this host lets this "
                         f"process use {sorted(os.sched_getaffinity(0))}): {e}") from None


def _dial(address: str, launch: str, timeout_s: float = 30.0) -> socket.socket:
    """Connect to the daemon's worker listener and prove who we are (the token is read
    from the environment and dropped from it, so no child process inherits it)."""
    die_with_parent()
    host, _, port = address.rpartition(":")
    token = os.environ.pop(TOKEN_ENV, "")
    if not host or not port.isdigit() or not token:
        raise SystemExit(f"--connect {address!r}: need HOST:PORT and the token in {TOKEN_ENV}")
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    BlockingFramedSocket(sock).send(Hello(token, launch, os.getpid()))
    return sock


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m janusd.engine.worker", description=__doc__)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--fd", type=int, help="inherited socket fd connected to the daemon")
    how.add_argument("--connect", help="HOST:PORT of the daemon's worker listener (token in $JANUSD_WORKER_TOKEN)")
    p.add_argument("--launch", default="", help="the launch id the daemon gave this start (with --connect)")
    p.add_argument("--device-index", type=int, required=True)
    p.add_argument("--kind", default="cpu")
    p.add_argument("--memory-bytes", type=int, required=True)
    p.add_argument("--page-size", type=int, default=2 << 20)
    p.add_argument("--resident-bytes", type=int, default=0, help="top of the pool kept backed (cpu)")
    p.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    p.add_argument("--cpu-cores", default="", help="host cores to run on, comma-separated (empty: any)")
    p.add_argument("--transfer-protocol", default="auto", help="Mooncake protocol (auto: by device kind)")
    p.add_argument("--transfer-nice", type=int, default=0,
                   help="how much nicer the transfer engine's threads run (0-19)")
    p.add_argument("--transfer-host", default="127.0.0.1",
                   help="the address peers reach this worker's transfer engine at (its node's)")
    args = p.parse_args(argv)
    # The daemon owns our life: SIGINT from a terminal's Ctrl-C or SIGTERM sent to the whole
    # process group must not kill a worker mid-drain; we exit on Shutdown or on EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd) if args.fd is not None else _dial(args.connect, args.launch)
    conn = BlockingFramedSocket(sock)
    try:
        if args.cpu_cores:
            _pin(args.cpu_cores)
        import torch

        if args.torch_threads > 0:
            torch.set_num_threads(args.torch_threads)
        from janusd.engine.device_engine import DeviceEngine

        de = DeviceEngine(
            kind=args.kind, device_index=args.device_index, memory_bytes=args.memory_bytes, page_size=args.page_size,
            resident_bytes=args.resident_bytes,
        )
    except Exception as e:
        from janusd.engine.types import EngineError

        # A missing runtime or a bad setting is the operator's to fix: one line, no traceback.
        expected = isinstance(e, (EngineError, ValueError))
        log(f"cannot start the device engine: {e}" if expected
            else "cannot start the device engine:\n" + traceback.format_exc())
        try:
            conn.send(wm.ErrorReply(0, f"device {args.kind}:{args.device_index}: {e}", "internal"))
        except OSError:
            pass
        return 1
    from janusd.lifecycle.transfer import preload_engine

    preload_engine()  # before serving: its first use may be a fork whose source is serving
    WorkerProc(conn, de, args.device_index, args.kind, args.transfer_protocol, args.transfer_nice,
               args.transfer_host).serve()
    # Nothing a worker holds outlives it (device memory, pinned host memory, transfer
    # registrations all belong to the process), so skip the interpreter's teardown: freeing
    # every pool page, torch's and the transfer engine's destructors took ~0.7 s of an idle
    # daemon's SIGTERM (measured), and on a device runtime can take longer.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
