"""One replay against the profiled daemon and the daemon's own figures around it: the
workers' pool pages polled during the replay (peak KV), the engine's counters before and
after it (janusd_engine_*), both read from /metrics."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from janusd.oracle.dataset import ENGINE_COLUMNS
from janusd.profiling.args import ProfileArgs
from janusd.profiling.daemon import MODEL_NAME


def pool_pages(text: str) -> dict[str, dict[str, float]]:
    """device -> {weight_pages, kv_pages, num_pages, page_size} from one /metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == "janusd_pool_pages":
            for s in fam.samples:
                out.setdefault(s.labels["device"], {})[s.labels["kind"]] = s.value
        elif fam.name == "janusd_pool_stat":
            for s in fam.samples:
                if s.labels.get("stat") == "page_size":
                    out.setdefault(s.labels["device"], {})["page_size"] = s.value
    return out


ENGINE_COUNTERS = ENGINE_COLUMNS[:3]  # the rest of a row (wall_s) is the replay's own clock


def engine_counters(text: str) -> dict[str, float]:
    """The profiled model's engine counters (janusd_engine_*: steps, decode tokens, forward
    seconds), summed over its instances, from one /metrics scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(ENGINE_COUNTERS, 0.0)
    for fam in text_string_to_metric_families(text):
        key = fam.name.removeprefix("janusd_engine_").removesuffix("_total")  # exposition spells it either way
        if key in out and fam.name.startswith("janusd_engine_"):
            out[key] += sum(s.value for s in fam.samples
                            if s.labels.get("model") == MODEL_NAME and not s.name.endswith("_created"))
    return out


async def _engine_counters(port: int) -> dict[str, float]:
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        return engine_counters(await resp.text())


async def _poll_pools(port: int, peak: dict[str, dict[str, float]], period_s: float = 0.25) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    for dev, kinds in pool_pages(await resp.text()).items():
                        mine = peak.setdefault(dev, {})
                        for k, v in kinds.items():
                            mine[k] = max(mine.get(k, 0.0), v)
            except (aiohttp.ClientError, OSError, ValueError):
                pass
            await asyncio.sleep(period_s)


async def measure(port: int, trace: Any, out_dir: Path, a: ProfileArgs, span_s: float
                   ) -> tuple[list[Any], dict[str, Any], dict]:
    import msgspec

    from janusd.trace.replay import ReplayConfig, replay
    from janusd.trace.results import RequestResult

    peak: dict[str, dict[str, float]] = {}
    before = await _engine_counters(port)
    t0 = time.monotonic()
    poller = asyncio.create_task(_poll_pools(port, peak))
    try:
        cfg = ReplayConfig(url=f"http://127.0.0.1:{port}", ttft_slo_ms=a.ttft_slo_ms, tpot_slo_ms=a.tpot_slo_ms,
                           timeout_s=span_s + 60.0, devices_poll_s=0.0)
        summary = await replay(trace, cfg, out_dir)
    finally:
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
    after = await _engine_counters(port)
    summary["engine"] = {k: after[k] - before[k] for k in ENGINE_COUNTERS} | {"wall_s": time.monotonic() - t0}
    dec = msgspec.json.Decoder(RequestResult)
    rows = [dec.decode(line) for line in (out_dir / "results.jsonl").read_bytes().splitlines() if line.strip()]
    return rows, summary, peak


def arun(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
