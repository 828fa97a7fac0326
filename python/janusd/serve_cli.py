"""`janus serve` (also installed as `janusd`): run the daemon in the foreground.

Flags override the config file; with no --config the embedded default is served (two
CPU virtual devices: SmolLM2 on device 0, two demo models on device 1). systemd runs
this with Type=notify (systemd/janusd.service). Top-level imports stay light: the
daemon and uvloop are imported in run().
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file (default: the embedded default)")
    p.add_argument("--host", help="listen address (overrides server.host)")
    p.add_argument("--port", type=int, help="listen port (overrides server.port; 0 = any free port)")
    p.add_argument("--print-config", action="store_true", help="print the effective configuration and exit")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                   help="daemon log level (default info); lines are `TIME LEVEL janusd: message`")


def effective_config(args: argparse.Namespace):  # -> JanusConfig
    import msgspec

    from janusd.config import ConfigError, load_config

    cfg = load_config(args.config)
    server = cfg.server
    if args.host is not None:
        server = msgspec.structs.replace(server, host=args.host)
    if args.port is not None:
        if not 0 <= args.port <= 65535:
            raise ConfigError(f"--port: must be in [0, 65535], got {args.port}")
        server = msgspec.structs.replace(server, port=args.port)
    return msgspec.structs.replace(cfg, server=server)


def run(args: argparse.Namespace) -> int:
    from janusd.config import ConfigError, dump_config

    try:
        cfg = effective_config(args)
    except ConfigError as e:
        print(f"janus serve: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        sys.stdout.write(dump_config(cfg))
        return 0
    import asyncio

    import uvloop

    from janusd.log import setup

    setup(args.log_level)

    from janusd.server.admin import AdminSocketError
    from janusd.server.daemon import Daemon

    async def main() -> int:
        overrides = {k: getattr(args, k) for k in ("host", "port") if getattr(args, k) is not None}
        return await Daemon(cfg, args.config, overrides).run()

    try:
        rc = uvloop.run(main())
    except AdminSocketError as e:
        print(f"janus serve: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"janus serve: {e}", file=sys.stderr)
        return 1
    # The daemon has stopped its workers and helpers and removed its socket: nothing it
    # holds outlives the process, so skip the interpreter's finalization, whose garbage
    # collection of the loaded libraries' objects took ~2 s of an idle SIGTERM (measured
    # with gdb: Py_FinalizeEx -> gc_collect_main), as the workers do (engine/worker.py).
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
