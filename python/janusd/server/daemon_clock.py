"""The daemon's one clock, shared by daemon.py and the parts it is built from
(daemon_requests.py, worker_supervision.py), which must not import daemon.py."""

import time

# The daemon's clock for request times (arrival, deadlines, per-token timestamps) and for
# the core. Not loop.time(): uvloop's is cached per loop iteration at 1 ms resolution,
# too coarse for per-token times; both read CLOCK_MONOTONIC.
clock = time.monotonic
# The wall clock, for the timestamps clients and operators read (an OpenAI response's
# `created`, the daemon's start time): never for a duration or a deadline.
wall_clock = time.time
