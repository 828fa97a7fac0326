"""A core tick that raises (server/daemon.py _tick_loop, server/tick_backoff.py): the loop
goes on, but a persistent failure neither spins (it used to retry every 10 ms, and at
once on every poke) nor floods the log (one traceback, then one line per 30 s with the
count of the rest), is counted in /metrics, and ticking resumes at once when it heals."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest

from janusd.config import parse_config
from janusd.server.daemon import Daemon
from janusd.server.tick_backoff import LOG_EVERY_S, TickBackoff


def test_the_wait_doubles_to_its_cap_and_resets_after_a_success():
    b = TickBackoff()
    err = RuntimeError("boom")
    waits = [b.failed(float(i), err).wait_s for i in range(9)]
    assert waits == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0])
    b.succeeded(9.0)
    assert b.failed(10.0, err).wait_s == pytest.approx(0.01)


def test_one_traceback_then_one_line_per_period_with_the_count_of_the_rest():
    b = TickBackoff()
    err = RuntimeError("boom")
    first = b.failed(0.0, err)
    assert first.traceback and "1 in a row" in first.message and "RuntimeError: boom" in first.message
    quiet = [b.failed(t, err) for t in (1.0, 2.0, 10.0, LOG_EVERY_S - 0.1)]
    assert [v.message for v in quiet] == [None] * 4
    later = b.failed(LOG_EVERY_S + 0.5, err)
    assert later.message is not None and not later.traceback  # the same failure: no second traceback
    assert "6 in a row" in later.message and "(4 more not logged since the last line)" in later.message
    changed = b.failed(2 * LOG_EVERY_S + 1.0, KeyError("gone"))
    assert changed.traceback and "KeyError" in changed.message  # a new failure shows its traceback
    assert b.succeeded(2 * LOG_EVERY_S + 2.0) is None  # recovered, but the limit holds the line back
    assert b.total == 7 and b.streak == 0


def test_the_recovery_is_logged_with_how_long_it_failed():
    b = TickBackoff()
    assert b.succeeded(0.0) is None  # nothing failed
    for t in (100.0, 100.5, 101.0, 131.0):
        b.failed(t, RuntimeError("boom"))
    assert b.succeeded(161.5) == "the core's tick works again after 4 failures in 61.50 s"


BASE = "[devices]\ncount = 1\n[[models]]\nname = 'm'\ncheckpoint = 'demo:llama-tiny'\n"


def test_a_failing_tick_backs_off_under_pokes_and_ticks_again_when_it_heals(caplog):
    """The core's tick is made to fail for 0.4 s (a fault injected at the one call the
    loop makes) while the daemon is poked every millisecond, as a token stream does."""
    d = Daemon(parse_config(BASE))
    real_tick = d.core.tick
    calls: list[tuple[float, bool]] = []
    heal_at = time.monotonic() + 0.4

    def tick(now: float) -> float | None:
        ok = time.monotonic() >= heal_at
        calls.append((time.monotonic(), ok))
        if not ok:
            raise RuntimeError("tick broke")
        return real_tick(now)

    d.core.tick = tick  # type: ignore[method-assign]

    async def run() -> None:
        loop = asyncio.create_task(d._tick_loop())
        end = heal_at + 0.3
        while time.monotonic() < end:
            d.poke()
            await asyncio.sleep(0.001)
        loop.cancel()

    with caplog.at_level(logging.WARNING, logger="janusd"):
        asyncio.run(run())
    failed = [t for t, ok in calls if not ok]
    healed = [t for t, ok in calls if ok]
    # 10, 20, 40, 80, 160 ms apart: 5-7 tries in 0.4 s, where the old loop made ~40 (and one per poke)
    assert 4 <= len(failed) <= 7, len(failed)
    assert healed and healed[0] - heal_at < 0.35  # the back-off is at most the last wait (160-320 ms)
    assert len(healed) >= 20  # ticking at the pokes' pace again (a back-off would allow 1 or 2)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None and errors[0].exc_info[0] is RuntimeError
    recovered = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert recovered == []  # within 30 s of the first line: the recovery waits for the next line
    m = re.search(r"^janusd_tick_errors_total (\S+)$", d.metrics_text().decode(), re.M)
    assert m is not None and float(m.group(1)) == len(failed)
