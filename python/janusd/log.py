"""The daemon's log: the standard logging module, one format (time, level, message),
one logger ("janusd"), to stderr (systemd's journal adds its own metadata). `janus serve
--log-level` picks the level; the core and the shells log through `log` below, worker
processes keep their own stderr lines (their `janusd-worker` prefix)."""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("janusd")

LEVELS = ("debug", "info", "warning", "error")


def setup(level: str = "info") -> None:
    """Idempotent: one handler on the janusd logger, messages as `TIME LEVEL janusd: text`."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    for h in list(log.handlers):
        log.removeHandler(h)
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(logging.Formatter("%(asctime)s.%(msecs)03d %(levelname)s janusd: %(message)s",
                                     datefmt="%Y-%m-%dT%H:%M:%S"))
    log.addHandler(h)
    log.setLevel(level.upper())
    log.propagate = False
