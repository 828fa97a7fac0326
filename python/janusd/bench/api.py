"""`janus bench api`: what the daemon adds on top of the engine, and how much load it takes.

1. Overhead: the same requests (one at a time, max_tokens=1, streaming) are timed to
   the first token through the HTTP API of a real daemon (`janus serve` in a subprocess,
   one CPU worker) and directly on an in-process engine with the same model. The
   daemon's overhead is the difference of the p50s and of the p99s: HTTP parsing,
   tokenization round trip, dispatch, two socket hops, SSE framing.
2. Capacity: open-loop Poisson arrivals of 1-token requests at rising rates, each for a
   fixed duration over loopback; the result is the highest rate whose p99 TTFT stays
   within twice the p99 at the lowest rate (a failed request counts as infinitely late).
   The baseline is that open-loop point, not phase 1: open-loop requests open their own
   connections, which phase 1's sequential requests on one kept-alive connection do not
   pay, so only the same method at a low rate is "unloaded" for this comparison.
`--launcher ray` runs the daemon's worker through the ray launcher (a local Ray head the
daemon starts, the worker connecting back over TCP): phase 1's overhead then includes
the TCP hop instead of the socketpair's, the figure [R] compares with the local launcher.
`--launcher both` runs a daemon of each at once and alternates phase 1's requests between
them (local, ray, local, ...): a paired comparison, so a loaded machine's drift falls on
both alike; it reports their TTFTs and the difference, nothing else.
Both phases run on the same machine, one after the other, so ratios are meaningful even
on a noisy box; absolute numbers are for orientation only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from janusd.bench import daemon_proc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default="demo:llama-tiny", help="model checkpoint spec (default demo:llama-tiny)")
    p.add_argument("--requests", type=int, default=60, help="sequential requests per path for the overhead phase")
    p.add_argument("--prompt-words", type=int, default=32, help="prompt length in words")
    p.add_argument("--rates", default="5,10,20,40,80,160,320", help="comma-separated request rates (req/s) to try")
    p.add_argument("--duration-s", type=float, default=4.0, help="seconds of load per rate")
    p.add_argument("--cache-dir", default=None, help="checkpoint cache dir (default: the config default)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads of the worker and the engine")
    p.add_argument("--launcher", choices=("local", "ray", "both"), default="local",
                   help="where the daemon's worker runs (devices.launcher; ray: a local Ray head of the daemon's; "
                        "both: a daemon of each at once, phase 1 only, their requests alternating)")


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("inf")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def _config(args: argparse.Namespace, cache: str, run_dir: Path) -> str:
    return (
        f'[server]\nport = 0\nadmin_socket = "{run_dir / "admin.sock"}"\ncache_dir = "{cache}"\nqueue_limit = 100000\n'
        f'[devices]\ncount = 1\nmemory_mib = 512\nlauncher = "{args.launcher}"\n'
        f'[[models]]\nname = "bench"\ncheckpoint = "{args.checkpoint}"\nkv_cache_mib = 128\nttft_slo_ms = 60000.0\n'
    )


async def _api_ttft(session: Any, url: str, prompt: str) -> float | None:
    """Seconds from sending the request to the first token's SSE event; None on failure."""
    body = {"model": "bench", "prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True,
            "stream": True}
    t0 = time.perf_counter()
    try:
        async with session.post(url, json=body) as r:
            if r.status != 200:
                await r.read()
                return None
            first = None
            async for line in r.content:
                if line.startswith(b"data: {") and first is None:
                    first = time.perf_counter() - t0
            return first
    except Exception:
        return None


async def _overhead_api(port: int, prompts: list[str]) -> list[float]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    out = []
    async with aiohttp.ClientSession() as s:
        for p in prompts[:3]:
            await _api_ttft(s, url, p)  # warm-up
        for p in prompts:
            t = await _api_ttft(s, url, p)
            if t is not None:
                out.append(t)
    return out


async def _paired(ports: dict[str, int], prompts: list[str]) -> dict[str, list[float]]:
    """Phase 1 against several daemons, each prompt sent to each in turn."""
    import aiohttp

    out: dict[str, list[float]] = {k: [] for k in ports}
    async with aiohttp.ClientSession() as s:
        for i, p in enumerate(prompts[:3] + prompts):
            for name, port in ports.items():
                t = await _api_ttft(s, f"http://127.0.0.1:{port}/v1/completions", p)
                if t is not None and i >= 3:  # the first three are the warm-up
                    out[name].append(t)
    return out


def _run_both(args: argparse.Namespace, cache: str, prompts: list[str]) -> dict[str, Any]:
    procs: dict[str, Any] = {}
    ports: dict[str, int] = {}
    try:
        for launcher in ("local", "ray"):
            run_dir = Path(tempfile.mkdtemp(prefix=f"janus-bench-api-{launcher}-"))
            one = argparse.Namespace(**{**vars(args), "launcher": launcher})
            procs[launcher], ports[launcher] = daemon_proc.start(_config(one, cache, run_dir), run_dir,
                                                                 args.torch_threads, {"bench": 1})
        ttft = asyncio.run(_paired(ports, prompts))
    finally:
        exits = {k: daemon_proc.stop(p) for k, p in procs.items()}
    ms = lambda x: round(x * 1e3, 3)  # noqa: E731
    out: dict[str, Any] = {"bench": "api", "model": args.checkpoint, "launcher": "both",
                           "requests": min(len(v) for v in ttft.values())}
    for k, v in ttft.items():
        out[f"{k}_ttft_p50_ms"], out[f"{k}_ttft_p99_ms"] = ms(_pct(v, 0.5)), ms(_pct(v, 0.99))
    out["ray_minus_local_p50_ms"] = round(out["ray_ttft_p50_ms"] - out["local_ttft_p50_ms"], 3)
    out["ray_minus_local_p99_ms"] = round(out["ray_ttft_p99_ms"] - out["local_ttft_p99_ms"], 3)
    return {**out, "daemon_exit": exits}


def _overhead_engine(args: argparse.Namespace, cache: str, prompts: list[str]) -> list[float]:
    import torch

    from janusd.config import EngineConfig, ModelConfig
    from janusd.engine.device_engine import DeviceEngine
    from janusd.engine.types import SamplingParams

    torch.set_num_threads(args.torch_threads)
    de = DeviceEngine(kind="cpu", device_index=0, memory_bytes=512 << 20, page_size=2 << 20)
    me = de.load_model(ModelConfig(name="bench", checkpoint=args.checkpoint, kv_cache_mib=128), EngineConfig(),
                       Path(cache))
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    out = []
    for i, p in enumerate(prompts[:3] + prompts):
        ids = me.tokenizer.encode(p, add_special_tokens=True)
        t0 = time.perf_counter()
        me.add_request(f"r{i}", ids, params)
        done = False
        while not done:
            done = any(o.token_ids for o in de.step())
        if i >= 3:
            out.append(time.perf_counter() - t0)
    de.unload_model("bench")
    return out


async def _load_at(port: int, rate: float, duration_s: float, prompt: str, seed: int) -> dict[str, float]:
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/completions"
    rng = random.Random(seed)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        tasks = []
        t_end = time.perf_counter() + duration_s
        nxt = time.perf_counter()
        while nxt < t_end:
            delay = nxt - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_api_ttft(s, url, prompt)))
            nxt += rng.expovariate(rate)
        res = await asyncio.gather(*tasks)
    ok = [t for t in res if t is not None]
    lat = ok + [float("inf")] * (len(res) - len(ok))
    return {"rate": rate, "sent": len(res), "failed": len(res) - len(ok),
            "p50_ttft_ms": round(_pct(lat, 0.5) * 1e3, 2), "p99_ttft_ms": round(_pct(lat, 0.99) * 1e3, 2)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from janusd.config import ServerConfig, cache_dir

    cache = args.cache_dir or str(cache_dir(ServerConfig()))
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "cloud", "light"]
    rng = random.Random(0)
    prompts = [" ".join(rng.choice(words) for _ in range(args.prompt_words)) for _ in range(args.requests)]
    if args.launcher == "both":
        return _run_both(args, cache, prompts)
    run_dir = Path(tempfile.mkdtemp(prefix="janus-bench-api-"))
    proc, port = daemon_proc.start(_config(args, cache, run_dir), run_dir, args.torch_threads, {"bench": 1})
    try:
        api = asyncio.run(_overhead_api(port, prompts))
        engine = _overhead_engine(args, cache, prompts)  # daemon idle meanwhile
        sweep = []
        best = 0.0
        base_p99 = float("nan")
        for i, rate in enumerate(float(r) for r in args.rates.split(",")):
            point = asyncio.run(_load_at(port, rate, args.duration_s, prompts[0], i))
            sweep.append(point)
            if i == 0:
                base_p99 = point["p99_ttft_ms"]  # the lowest rate, measured the same way
            if point["failed"] or point["p99_ttft_ms"] > 2 * base_p99:
                break
            best = rate
    finally:
        exit_code = daemon_proc.stop(proc)
    ms = lambda x: round(x * 1e3, 3)  # noqa: E731
    return {
        "bench": "api",
        "model": args.checkpoint,
        "launcher": args.launcher,
        "requests": len(api),
        "api_ttft_p50_ms": ms(_pct(api, 0.5)),
        "api_ttft_p99_ms": ms(_pct(api, 0.99)),
        "engine_ttft_p50_ms": ms(_pct(engine, 0.5)),
        "engine_ttft_p99_ms": ms(_pct(engine, 0.99)),
        "overhead_p50_ms": ms(_pct(api, 0.5) - _pct(engine, 0.5)),
        "overhead_p99_ms": ms(_pct(api, 0.99) - _pct(engine, 0.99)),
        "max_rate_before_p99_doubles_rps": best,
        "base_p99_ttft_ms": base_p99,
        "sweep": json.loads(json.dumps(sweep)),
        "daemon_exit": exit_code,
    }
