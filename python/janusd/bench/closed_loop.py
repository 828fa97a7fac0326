"""Closed-loop and sequential load on a running daemon, for benches that must know what
the daemon sustains (dispatch-replay's capacity phase) or must warm it before a replay.

Each request streams (as the replayer's do) and forces its output length (min_tokens,
ignore_eos), so a request's cost is the (input, output) pair it was drawn with.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any


def completion_body(model: str, prompt: str, n_out: int, slo_ms: float | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": n_out, "min_tokens": n_out,
                            "ignore_eos": True, "stream": True, "temperature": 0.0}
    if slo_ms is not None:
        body["slo"] = {"ttft_ms": slo_ms, "tpot_ms": slo_ms}
    return body


async def complete(session: Any, url: str, body: dict[str, Any]) -> bool:
    """Send one streaming request and read it to the end; True when it completed."""
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            await resp.read()
            return False
        done = failed = False
        async for line in resp.content:
            if line.startswith(b"data: [DONE]"):
                done = True
            elif line.startswith(b'data: {"error"'):
                failed = True
        return done and not failed


def _item(model: str, item: tuple[Any, ...]) -> tuple[str, int, int]:
    """(model, input, output) of a (input, output) pair (for `model`) or a (model, input, output) triple."""
    if len(item) == 3:
        return str(item[0]), int(item[1]), int(item[2])
    return model, int(item[0]), int(item[1])


async def closed_loop(port: int, model: str, pairs: list[tuple[Any, ...]], concurrency: int, seconds: float,
                      slo_ms: float | None) -> dict[str, Any]:
    """`concurrency` clients, each sending the next (input, output) pair of `pairs` (in
    turn, shared; a (model, input, output) triple names its own model) as soon as its last
    request ends, for `seconds`: completion times (from the start), failures and requests
    sent. Requests still running at the end are not counted."""
    import aiohttp

    from janusd.trace.replay import PromptMaker

    url = f"http://127.0.0.1:{port}/v1/completions"
    prompts = PromptMaker()
    done_s: list[float] = []
    failures = 0
    nxt = 0
    t0 = time.monotonic()

    async def client(session: Any) -> None:
        nonlocal failures, nxt
        while time.monotonic() - t0 < seconds:
            name, n_in, n_out = _item(model, pairs[nxt % len(pairs)])
            nxt += 1
            try:
                ok = await complete(session, url, completion_body(name, prompts(n_in), n_out, slo_ms))
            except (aiohttp.ClientError, OSError):
                ok = False
            if ok:
                done_s.append(time.monotonic() - t0)
            else:
                failures += 1

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(concurrency)]
        await asyncio.sleep(seconds)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"done_s": done_s, "failures": failures, "sent": nxt}


async def warmup(port: int, model: str, lengths: list[tuple[Any, ...]], slo_ms: float | None) -> None:
    """One request per (input, output) pair (or (model, input, output) triple), one after the other."""
    import aiohttp

    from janusd.trace.replay import PromptMaker

    url = f"http://127.0.0.1:{port}/v1/completions"
    prompts = PromptMaker()
    async with aiohttp.ClientSession() as session:
        for item in lengths:
            name, n_in, n_out = _item(model, item)
            await complete(session, url, completion_body(name, prompts(n_in), n_out, slo_ms))
