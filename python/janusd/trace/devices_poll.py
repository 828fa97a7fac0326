"""Active devices over time, sampled from the server's GET /metrics during a replay.

The report's timeline draws how many devices the system held (PAPER.md §9); the replayer
is the one tool that watches a live server for the whole run, so it samples that number
itself: every `period_s` one GET /metrics on the replay's base URL, parsed as Prometheus
text. A device counts as active when some model has an instance on it whose
`janusd_instance_state{state="active"}` sample is 1 (server/metrics.py).

The poller must not change what it measures: it has its own one-connection session (a
poll never waits for, or takes, one of the replay's connections), polls are sequential
(a slow scrape delays the next one instead of piling up), ticks missed while a scrape was
slow are skipped, and a failed poll (connection error, HTTP error, timeout, unparsable
text, a page without the janusd metric) records nothing and is only counted. It never touches the request schedule.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from janusd.trace.results import DEVICES_COLUMNS

DEVICES_HEADER = ",".join(DEVICES_COLUMNS)  # the one devices.csv format (results.read_devices)


def metrics_url(base: str) -> str:
    """The server's /metrics for a replay URL (which may end in /v1 or /v1/completions)."""
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


def active_counts(text: str) -> tuple[int, int] | None:
    """(active devices, active instances) of one /metrics page, or None when the page has
    no janusd_instance_state family (not a janusd server); ValueError if unparsable."""
    from prometheus_client.parser import text_string_to_metric_families

    devices: set[str] = set()
    instances = 0
    seen = False
    for family in text_string_to_metric_families(text):
        if family.name != "janusd_instance_state":
            continue
        seen = True
        for s in family.samples:
            if s.labels.get("state") == "active" and s.value == 1:
                devices.add(s.labels.get("device", ""))
                instances += 1
    return (len(devices), instances) if seen else None


class DevicePoller:
    """Samples (t_s, active devices, active instances); t_s on the trace's time axis."""

    def __init__(self, base_url: str, period_s: float, headers: dict[str, str] | None = None) -> None:
        if not (period_s > 0):
            raise ValueError(f"the devices poll period must be > 0, got {period_s}")
        self.url = metrics_url(base_url)
        self.period_s = period_s
        self.headers = headers or {}
        self.samples: list[tuple[float, int, int]] = []
        self.failures = 0
        self.polls = 0

    async def run(self, t0: float, a0: float) -> None:
        """Poll at t0, t0 + period, ... (time.monotonic()) until cancelled; a sample taken
        at monotonic time t is stamped a0 + (t - t0), a0 being the trace's first arrival."""
        import aiohttp

        clock = time.monotonic
        timeout = aiohttp.ClientTimeout(total=max(self.period_s, 1.0))
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=self.headers) as session:
            tick = 0
            while True:
                delay = t0 + tick * self.period_s - clock()
                if delay > 0:
                    await asyncio.sleep(delay)
                self.polls += 1
                try:
                    async with session.get(self.url) as resp:
                        text = await resp.text() if resp.status == 200 else None
                    t = clock()
                    counts = None if text is None else active_counts(text)
                    if counts is None:
                        self.failures += 1
                    else:
                        self.samples.append((round(a0 + (t - t0), 3), *counts))
                except asyncio.CancelledError:
                    self.polls -= 1  # cut off by the end of the run: neither a sample nor a failure
                    raise
                except Exception:  # noqa: BLE001 - a failed poll is counted, never fatal to the replay
                    self.failures += 1
                # next tick in the future: ticks missed during a slow scrape are skipped
                tick = max(tick + 1, int((clock() - t0) / self.period_s) + 1)

    def write(self, path: str | Path) -> None:
        """devices.csv (results.py reads it); temp name + rename so no half file is seen.
        Nothing is written when no poll succeeded: an empty series would draw as 0 devices."""
        if not self.samples:
            return
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        lines = [DEVICES_HEADER] + [f"{t:.3f},{d},{i}" for t, d, i in self.samples]
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(path)

    def summary(self) -> dict[str, int]:
        return {"device_polls": self.polls, "device_poll_failures": self.failures}
