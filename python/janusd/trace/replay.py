"""Open-loop trace replay against an OpenAI-compatible server (PAPER.md §9).

Open loop: request i is sent at start + (arrival_i - arrival_0) whatever happened to the
earlier ones, so a slow server faces the trace's real load instead of a load that backs
off when it struggles. Each request is `POST /v1/completions` with `stream: true`, the
trace's model, a synthetic prompt of about input_tokens tokens, `max_tokens` =
output_tokens and `ignore_eos: true` (+ `min_tokens`) so output lengths hold; a row's own
SLO is sent as `slo: {ttft_ms, tpot_ms}` (janusd schedules by it; other servers ignore it).

Timing: a token's time is the arrival of the SSE chunk that carried it, relative to the
moment the request was handed to the connection (its submission). A chunk counts one
token, or len(choices[0].token_ids) when the server sends ids; if the final usage chunk
reports more completion tokens than were counted, the missing ones are placed at the
last chunk's time (a server batching several tokens per chunk delivered them by then).

Clock: time.monotonic() for every send, token and schedule time, never loop.time():
under uvloop (what `janus replay` runs on) that is cached per loop iteration at whole
milliseconds, which quantised token times and, on a busy iteration, reported them (and
the replayer's lag) from the iteration's start, i.e. too early.

Self-check: the replayer records its lag (send time minus scheduled time, including any
wait for a free connection of the bounded pool) and declares the run invalid when the
maximum lag exceeds the bound: its figures would describe the client, not the server.
Errors, HTTP failures, broken streams and timeouts are results with status != ok and
count as misses in slo.py.

Devices: alongside the requests a DevicePoller (devices_poll.py) samples the server's
GET /metrics every devices_poll_s into devices.csv, on its own connection, so the report
can draw active devices over time; failed polls are counted in the summary, not fatal.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from janusd.trace import slo
from janusd.trace.devices_poll import DevicePoller
from janusd.trace.formats import Trace
from janusd.trace.results import RequestResult, jsonable, results_from

WORDS = (
    "the of and to in is that for it as with was on be by at this are from or an have not "
    "but which one all were they we there can more so if has their will time about would "
    "them other these some into only its new two first like than then also"
).split()


class PromptMaker:
    """Prompts of about n tokens: n common one-token words, built once and sliced."""

    def __init__(self) -> None:
        self._text = ""
        self._ends = np.zeros(1, dtype=np.int64)

    def __call__(self, n_tokens: int) -> str:
        n = max(1, int(n_tokens))
        if n >= len(self._ends):
            count = max(n + 1, 2 * len(self._ends))
            words = [WORDS[i % len(WORDS)] for i in range(count)]
            self._text = " ".join(words)
            self._ends = np.cumsum([len(w) + 1 for w in words]) - 1
        return self._text[: int(self._ends[n - 1])]


@dataclass(frozen=True)
class ReplayConfig:
    url: str
    max_connections: int = 512
    max_lag_ms: float = 100.0
    api_key: str | None = None
    timeout_s: float = 600.0
    ttft_slo_ms: float = 1000.0  # used where the trace row has no SLO of its own
    tpot_slo_ms: float = 200.0
    start_delay_s: float = 0.2
    window_s: float = 10.0
    devices_poll_s: float = 1.0  # GET /metrics period for devices.csv; 0 = off (devices_poll.py)

    def check(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if not (self.max_lag_ms > 0 and self.timeout_s > 0 and self.ttft_slo_ms > 0 and self.tpot_slo_ms > 0):
            raise ValueError("max_lag_ms, timeout_s and the SLO defaults must be > 0")
        if not (self.devices_poll_s == 0 or (self.devices_poll_s >= 0.05 and math.isfinite(self.devices_poll_s))):
            raise ValueError(f"devices_poll_s must be 0 (off) or >= 0.05 s, got {self.devices_poll_s}")


def _completions_url(base: str) -> str:
    base = base.rstrip("/")
    if base.endswith("/v1/completions"):
        return base
    return base + ("/completions" if base.endswith("/v1") else "/v1/completions")


class _Stream:
    """Collects token times from SSE lines of one response."""

    def __init__(self, t_send: float) -> None:
        self.t_send = t_send
        self.times: list[float] = []
        self.done = False
        self.usage_tokens: int | None = None
        self.error: str | None = None

    def feed(self, line: bytes, now: float) -> None:
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return
        try:
            msg = json.loads(data)
        except ValueError:
            self.error = f"bad SSE data: {data[:120]!r}"
            return
        if not isinstance(msg, dict):
            return
        if msg.get("error"):
            self.error = f"server error: {str(msg['error'])[:200]}"
            return
        usage = msg.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        choices = msg.get("choices") or []
        if choices and isinstance(choices[0], dict):
            ids = choices[0].get("token_ids")
            n = len(ids) if isinstance(ids, list) else (1 if choices[0].get("text") else 0)
            self.times.extend([round(now - self.t_send, 6)] * n)

    def token_times(self) -> list[float]:
        if self.usage_tokens is not None and self.usage_tokens > len(self.times) and self.times:
            self.times.extend([self.times[-1]] * (self.usage_tokens - len(self.times)))
        return self.times


async def _one(session, sem, cfg: ReplayConfig, url: str, i: int, row: dict, target: float, prompt: str) -> RequestResult:  # type: ignore[no-untyped-def]
    import aiohttp

    clock = time.monotonic
    async with sem:
        t_send = clock()
        stream = _Stream(t_send)
        status, error, http_status = "ok", None, None
        body = {
            "model": row["model"], "prompt": prompt, "max_tokens": row["output_tokens"],
            "min_tokens": row["output_tokens"], "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0,
        }  # fmt: skip
        if row["own_slo"]:  # the trace's per-request SLO travels with the request (janusd's `slo` field)
            body["slo"] = {"ttft_ms": row["ttft_slo_ms"], "tpot_ms": row["tpot_slo_ms"]}
        try:
            async with asyncio.timeout(cfg.timeout_s):
                async with session.post(url, json=body) as resp:
                    http_status = resp.status
                    if resp.status != 200:
                        text = (await resp.text())[:300]
                        status, error = "error", f"HTTP {resp.status}: {text}"
                    else:
                        async for line in resp.content:  # read to the end so the connection is reused
                            if not stream.done:
                                stream.feed(line, clock())
                            if stream.error:
                                break
                        if stream.error:
                            status, error = "error", stream.error
                        elif not stream.done:
                            status, error = "error", "stream ended without [DONE]"
        except TimeoutError:
            status, error = "timeout", f"no complete response within {cfg.timeout_s} s"
        except (aiohttp.ClientError, OSError) as e:
            status, error = "error", f"{type(e).__name__}: {e}"[:300]
        except Exception as e:  # noqa: BLE001 - one bad response must not end the run
            status, error = "error", f"unexpected {type(e).__name__}: {e}"[:300]
    return RequestResult(
        index=i, arrival_s=row["arrival_s"], app=row["app"], model=row["model"],
        input_tokens=row["input_tokens"], output_tokens=row["output_tokens"],
        ttft_slo_ms=row["ttft_slo_ms"], tpot_slo_ms=row["tpot_slo_ms"],
        send_lag_ms=round((t_send - target) * 1000.0, 3), token_times_s=stream.token_times(),
        status=status, error=error, http_status=http_status,  # type: ignore[arg-type]
    )  # fmt: skip


def _rows(trace: Trace, cfg: ReplayConfig) -> list[dict]:
    apps, models = trace.app_names(), trace.model_names()
    tt = np.where(np.isnan(trace.ttft_slo_ms), cfg.ttft_slo_ms, trace.ttft_slo_ms).tolist()
    tp = np.where(np.isnan(trace.tpot_slo_ms), cfg.tpot_slo_ms, trace.tpot_slo_ms).tolist()
    own = (~np.isnan(trace.ttft_slo_ms) & ~np.isnan(trace.tpot_slo_ms)).tolist()
    arr, ins, outs = trace.arrival_s.tolist(), trace.input_tokens.tolist(), trace.output_tokens.tolist()
    return [
        {"arrival_s": arr[i], "app": apps[i], "model": models[i], "input_tokens": ins[i], "output_tokens": outs[i],
         "ttft_slo_ms": tt[i], "tpot_slo_ms": tp[i], "own_slo": own[i]}  # fmt: skip
        for i in range(len(trace))
    ]


async def replay(
    trace: Trace, cfg: ReplayConfig, out_dir: str | Path, *, shard: tuple[int, int] = (0, 1), start_at: float | None = None
) -> dict:
    """Run the replay; write out_dir/results.jsonl, summary.json and (when polling,
    cfg.devices_poll_s > 0, and shard k == 0 so n processes poll once) devices.csv.

    shard=(k, n) replays only rows k, k+n, k+2n, ... (indices stay those of the whole
    trace) and start_at (a time.time() instant) puts time 0 of the schedule there, so n
    processes started together share one schedule (see replay_cli --processes).
    """
    import aiohttp

    cfg.check()
    if len(trace) == 0:
        raise ValueError("the trace is empty")
    k, n = shard
    if not (n >= 1 and 0 <= k < n):
        raise ValueError(f"shard must be k/n with 0 <= k < n, got {k}/{n}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "devices.csv").unlink(missing_ok=True)  # never leave an earlier run's series beside these results
    url = _completions_url(cfg.url)
    rows = _rows(trace, cfg)
    prompts = PromptMaker()
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    connector = aiohttp.TCPConnector(limit=cfg.max_connections, limit_per_host=cfg.max_connections)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(cfg.timeout_s, 30.0))
    enc = msgspec.json.Encoder()
    results: list[RequestResult] = []
    clock = time.monotonic  # not loop.time(): see the module docstring
    t_wall = time.time()
    poller = DevicePoller(cfg.url, cfg.devices_poll_s, headers) if cfg.devices_poll_s > 0 and k == 0 else None
    with open(out / "results.jsonl", "wb") as sink:

        def done(task: asyncio.Task) -> None:
            r = task.result()
            results.append(r)
            sink.write(enc.encode(r) + b"\n")

        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
            sem = asyncio.Semaphore(cfg.max_connections)
            t0 = clock() + (cfg.start_delay_s if start_at is None else start_at - time.time())
            a0 = rows[0]["arrival_s"]
            polling = asyncio.create_task(poller.run(t0, a0)) if poller else None
            tasks = []
            try:
                for i in range(k, len(rows), n):
                    row = rows[i]
                    target = t0 + (row["arrival_s"] - a0)
                    delay = target - clock()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    task = asyncio.create_task(_one(session, sem, cfg, url, i, row, target, prompts(row["input_tokens"])))
                    task.add_done_callback(done)
                    tasks.append(task)
                await asyncio.gather(*tasks)
            finally:
                if polling is not None:
                    polling.cancel()
                    await asyncio.gather(polling, return_exceptions=True)
    summary = summarize_run(results, cfg.max_lag_ms, trace.duration_s, time.time() - t_wall)
    if poller is not None:
        poller.write(out / "devices.csv")
        summary.update(poller.summary())
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def summarize_run(rows: list[RequestResult], max_lag_ms: float, span_s: float, wall_s: float) -> dict:
    """Replay figures + SLO figures; `valid` is False when max lag exceeded the bound."""
    res = results_from(rows)
    o = res.outcomes()
    lag = res.send_lag_ms
    duration = span_s if span_s > 0 else float("nan")
    figures = slo.summarize(o, res.app_id, len(res.apps), duration)
    status = res.status
    max_lag = float(lag.max()) if len(lag) else 0.0
    return jsonable({
        "valid": bool(max_lag <= max_lag_ms),
        "max_lag_ms_bound": max_lag_ms,
        "lag_p50_ms": float(np.percentile(lag, 50)) if len(lag) else 0.0,
        "lag_p99_ms": float(np.percentile(lag, 99)) if len(lag) else 0.0,
        "lag_max_ms": max_lag,
        "errors": int((status == "error").sum()),
        "timeouts": int((status == "timeout").sum()),
        "span_s": span_s,
        "wall_s": round(wall_s, 3),
        **figures,
    })  # type: ignore[return-value]
