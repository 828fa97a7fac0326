"""WorkerHandle (server/workers.py) against real worker processes, on uvloop as the
daemon runs: the ready handshake's timeout, and how a worker's death is reported.

A death is seen two ways (socket EOF, process exit). These tests pin down the two ways
that can go wrong: a late signal about the PREVIOUS process must not mark a restarted
worker dead, and replies the worker wrote before it died must reach their callers
before the death is reported (the exit watcher can fire while the reader is behind),
while the death is still reported within 1 s of the kill.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import uvloop

from daemon_harness import until
from janusd.config import DevicesConfig
from janusd.server.workers import WorkerError, WorkerHandle
from janusd.wire import worker_msgs as wm


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("JANUSD_WORKER_TORCH_THREADS", "1")


def _handle(deaths: list[tuple[float, int | None]]) -> WorkerHandle:
    return WorkerHandle(
        0, DevicesConfig(count=1, memory_mib=64),
        on_batch=lambda w, b: None, on_failed=lambda w, f: None,
        on_death=lambda w: deaths.append((time.monotonic(), w.pid)),
    )  # fmt: skip


def _stats(h: WorkerHandle):
    return h.call(lambda seq: wm.GetStats(seq), 10.0)


def test_a_worker_not_ready_in_time_is_killed_and_reported():
    async def go():
        h = _handle([])
        with pytest.raises(WorkerError, match="not ready within 0.05 s"):
            await h.start(0.05)  # a worker needs far longer to import torch
        assert h.state == "dead" and h.proc is not None and h.proc.returncode is not None
        assert h._writer is not None and h._writer.is_closing()  # its socket is not leaked

    uvloop.run(go())


def test_a_late_death_signal_of_the_previous_process_does_not_kill_the_restarted_worker():
    async def go():
        deaths: list[tuple[float, int | None]] = []
        h = _handle(deaths)
        await h.start(60.0)
        old = h.proc
        assert old is not None
        os.kill(old.pid, signal.SIGKILL)
        assert await until(lambda: deaths, 2.0)
        restart = asyncio.create_task(h.start(60.0))
        await asyncio.sleep(0)  # the restart is now spawning the new process
        assert h.state == "starting"
        h._died(old)  # the old process's other signal (EOF or exit) arrives meanwhile
        await restart
        assert h.ready and h.pid != old.pid
        # the old process's watcher reports its (long past) death only now
        h._died(old)
        assert h.ready and len(deaths) == 1
        assert isinstance(await _stats(h), wm.Stats)  # the new worker still answers
        await h.stop()
        assert h.state == "stopped" and len(deaths) == 1

    uvloop.run(go())


def test_replies_sent_before_the_death_are_delivered_before_it_is_reported():
    async def go():
        deaths: list[tuple[float, int | None]] = []
        h = _handle(deaths)
        await h.start(60.0)
        transport = h._writer.transport
        transport.pause_reading()  # the reader falls behind: replies wait in the socket
        calls = [asyncio.create_task(_stats(h)) for _ in range(5)]
        await asyncio.sleep(1.0)  # the worker answers all five meanwhile
        t_kill = time.monotonic()
        os.kill(h.pid, signal.SIGKILL)
        await asyncio.sleep(0.2)  # the exit watcher fires first; then the reader catches up
        transport.resume_reading()
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, wm.Stats) for r in results), results
        assert await until(lambda: deaths, 2.0)
        assert len(deaths) == 1 and deaths[0][0] - t_kill < 1.0
        assert h.state == "dead"

    uvloop.run(go())


def test_a_reader_that_never_catches_up_still_gets_the_death_within_a_second():
    async def go():
        deaths: list[tuple[float, int | None]] = []
        h = _handle(deaths)
        await h.start(60.0)
        h._writer.transport.pause_reading()  # and never resumed
        call = asyncio.create_task(_stats(h))
        await asyncio.sleep(0.5)
        t_kill = time.monotonic()
        os.kill(h.pid, signal.SIGKILL)
        assert await until(lambda: deaths, 2.0)
        assert deaths[0][0] - t_kill < 1.0, deaths[0][0] - t_kill
        with pytest.raises(WorkerError, match="died"):
            await call
        assert h.state == "dead"

    uvloop.run(go())


def test_a_pinned_worker_and_its_threads_run_only_on_its_cores_and_a_missing_core_is_refused():
    last = max(os.sched_getaffinity(0))

    async def go():
        h = WorkerHandle(0, DevicesConfig(count=1, memory_mib=64, cpu_cores=[[last]]), on_batch=lambda w, b: None,
                         on_failed=lambda w, f: None, on_death=lambda w: None)
        await h.start(60.0)
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{h.pid}/task")]
            assert len(tids) > 1  # torch and the reader threads started after the pin ...
            assert all(os.sched_getaffinity(t) == {last} for t in tids)  # ... and inherited it
        finally:
            await h.stop(10.0)
        bad = WorkerHandle(0, DevicesConfig(count=1, memory_mib=64, cpu_cores=[[4096]]), on_batch=lambda w, b: None,
                           on_failed=lambda w, f: None, on_death=lambda w: None)
        with pytest.raises(WorkerError, match=r"cannot pin to host cores \[4096\] \(devices.cpu_cores"):
            await bad.start(60.0)

    uvloop.run(go())
