"""`source_tpot_*` of `janus bench restore` (bench/restore.py): the inter-token gaps of a
stream on the source device while forks to the other device run, against its gaps in
quiet windows as long as each fork, in ABBA order.

Pairs of one fork window and one quiet window as long as it, in ABBA order (fork then
quiet, quiet then fork, ...: F Q Q F F Q Q F), so drift (the context growing, other work
on the machine) falls on both sides alike and a slow fork (a busy machine) gets as much
quiet time beside it. A gap counts for the window its token arrived in; the target's Cold
transition after each fork and SETTLE_S after it are in neither.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from typing import Any

from janusd.bench.restore_client import ctl, stream
from janusd.bench.restore_stats import p99, pair_bootstrap

TPOT_STREAM_TOKENS = 4000  # the source stream's length at most (max_model_len 4096); it stops when the pairs end
SETTLE_S = 0.2  # after the target's Cold transition, before the next window

Window = tuple[float, float, int]  # (start, end) in stream time and the tokens that arrived in it


class _SourceStream:
    """The source stream, in a thread: the tokens seen so far (a window counts its own),
    stopped at the next token once the pairs end."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.seen = 0
        self.cv = threading.Condition()
        self.stop = threading.Event()
        self.t_send: list[float] = []
        self.res: dict[str, list[float]] = {}
        self.th = threading.Thread(target=self._run)

    def _on_token(self, i: int) -> bool:
        with self.cv:
            self.seen = i
            self.cv.notify_all()
        return self.stop.is_set()

    def _run(self) -> None:
        self.t_send.append(time.perf_counter())
        try:
            self.res["t"] = stream(self.port, "m", TPOT_STREAM_TOKENS, self._on_token)
        finally:
            with self.cv:
                self.cv.notify_all()

    def start(self) -> None:
        """Start it and wait until it is decoding (the warm-up)."""
        self.th.start()
        while not self.t_send:
            time.sleep(0.001)
        with self.cv:
            self.cv.wait_for(lambda: self.seen >= 20 or not self.th.is_alive(), 600)

    def now(self) -> float:
        return time.perf_counter() - self.t_send[0]

    def alive(self) -> None:
        if not self.th.is_alive():
            raise RuntimeError("the source stream ended before the forks did: fewer --min-during-tokens")

    def quiet(self, d: float) -> Window:
        """A quiet window of d seconds."""
        self.alive()
        t0, n0 = self.now(), self.seen
        with self.cv:
            self.cv.wait_for(lambda: not self.th.is_alive(), d)
        self.alive()
        return t0, self.now(), self.seen - n0

    def finish(self) -> list[float]:
        """Stop it; the arrival times of all its tokens."""
        self.stop.set()
        self.th.join(600)
        return self.res["t"]


def _fork(src: _SourceStream, sock: str, args: argparse.Namespace, fork_rows: list[dict[str, Any]]) -> Window:
    """A fork window (fork 0 -> 1, or the A/A check's sleep), then device 1 back to Cold."""
    from janusd.wire import admin_msgs as am

    src.alive()
    t0, n0 = src.now(), src.seen
    if args.tpot_null_fork_s > 0:  # the A/A check: a window of no fork, as long as a fork
        time.sleep(args.tpot_null_fork_s)
    else:
        fork_rows.append(ctl(sock, am.ForkReq("m", 0, 1)))
    w = (t0, src.now(), src.seen - n0)
    ctl(sock, am.StateReq("m", 1, "cold"))
    time.sleep(SETTLE_S)
    return w


def _pairs(src: _SourceStream, sock: str, args: argparse.Namespace
           ) -> tuple[list[tuple[Window, Window]], list[dict[str, Any]]]:
    """(quiet, fork) windows: at least --forks pairs, an even number, more (up to
    --max-forks) until both sides have --min-during-tokens tokens; and the forks' replies."""
    min_tok = args.min_during_tokens
    max_pairs = max(args.forks, args.max_forks)
    fork_rows: list[dict[str, Any]] = []
    pairs: list[tuple[Window, Window]] = []
    while len(pairs) < max_pairs and (len(pairs) < args.forks or len(pairs) % 2
                                      or min(sum(q[2] for q, _ in pairs), sum(f[2] for _, f in pairs)) < min_tok):
        if len(pairs) % 2 == 0:  # A: fork, then quiet for as long
            f = _fork(src, sock, args, fork_rows)
            q = src.quiet(f[1] - f[0])
        else:  # B: quiet for as long as the last fork took, then fork
            q = src.quiet(pairs[-1][1][1] - pairs[-1][1][0])
            f = _fork(src, sock, args, fork_rows)
        pairs.append((q, f))
    return pairs, fork_rows


def _figures(times: list[float], pairs: list[tuple[Window, Window]], fork_rows: list[dict[str, Any]],
             args: argparse.Namespace) -> dict[str, Any]:
    gaps = [(b, b - a) for a, b in zip(times, times[1:])]

    def inside(w: Window) -> list[float]:
        return [g for t, g in gaps if w[0] < t <= w[1]]

    by_pair = [(inside(q), inside(f)) for q, f in pairs]
    before = [g for q, _ in by_pair for g in q]
    during = [g for _, f in by_pair for g in f]
    out: dict[str, Any] = {}
    out["source_tpot_order"] = "ABBA"
    out["source_tpot_pairs"] = len(pairs)
    out["source_tokens_quiet"] = len(before)
    out["source_tpot_p99_before_ms"] = round(p99(before) * 1e3, 2)
    out["source_tpot_p99_during_ms"] = round(p99(during) * 1e3, 2)
    out["source_tokens_during_forks"] = len(during)
    out["source_tpot_mean_increase_pct"] = round((statistics.fmean(during) / statistics.fmean(before) - 1) * 100, 1)
    out["source_tpot_p99_increase_ci90"] = pair_bootstrap(by_pair)
    out["source_tpot_p99_increase_pct"] = round((p99(during) / p99(before) - 1) * 100, 1)
    out["fork_paths"] = [r["path"] for r in fork_rows]
    out["fork_phases_s"] = fork_rows[-1]["phases"] if fork_rows else {}
    if args.tpot_null_fork_s > 0:
        out["tpot_null_fork_s"] = args.tpot_null_fork_s
    return out


def source_tpot(port: int, sock: str, args: argparse.Namespace) -> dict[str, Any]:
    """Source TPOT p99 without vs during forks 0 -> 1 (device 1 back to Cold after each)."""
    src = _SourceStream(port)
    src.start()
    pairs, fork_rows = _pairs(src, sock, args)
    times = src.finish()
    return _figures(times, pairs, fork_rows, args)
