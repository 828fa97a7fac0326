"""Open-loop replay against a real aiohttp SSE server on a real socket.

The server here is a stand-in for the network peer only (an OpenAI-compatible
/v1/completions that streams tokens with scripted timing per model name); the real
daemon end-to-end test is tests/test_replay_daemon.py.
"""

import argparse
import asyncio
import json
import threading
import time

import numpy as np
import pytest
from aiohttp import web

from janusd import replay_cli
from janusd.trace.formats import Trace, write_trace
from janusd.trace.replay import PromptMaker, ReplayConfig, replay
from janusd.trace.results import read_results

# model -> (first token delay, per-token delay, tokens per chunk)
BEHAVIOUR = {"fast": (0.02, 0.005, 1), "slow": (0.02, 0.25, 1), "batch": (0.02, 0.01, 2)}


class FakeServer:
    def __init__(self, api_key=None):
        self.api_key = api_key
        self.seen = []  # (monotonic receive time, body)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def completions(self, request):
        t = time.monotonic()
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": "bad key"}, status=401)
        body = await request.json()
        self.seen.append((t, body))
        model = body["model"]
        if model == "fail":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if model == "hang":
            await asyncio.sleep(2.5)
            return web.json_response({"error": "too late"}, status=503)
        first, per, per_chunk = BEHAVIOUR[model]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = body["max_tokens"]
        sent = 0
        await asyncio.sleep(first)
        while sent < n:
            k = min(per_chunk, n - sent)
            chunk = {"object": "text_completion", "model": model, "choices": [{"index": 0, "text": " tok" * k, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            sent += k
            if sent < n:
                await asyncio.sleep(per)
        usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
        await resp.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        await resp.write_eof()
        return resp

    def __enter__(self):
        self.thread.start()

        async def start():
            app = web.Application()
            app.router.add_post("/v1/completions", self.completions)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            return site._server.sockets[0].getsockname()[1]

        self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _trace(models, gap=0.05, out_tokens=6):
    n = len(models)
    return Trace.build(
        np.arange(n) * gap + 3.0, [f"app-{m}" for m in models], models, np.full(n, 12), np.full(n, out_tokens),
        np.full(n, 300.0), np.full(n, 50.0),
    )  # fmt: skip


def test_prompt_maker_gives_about_n_words():
    make = PromptMaker()
    assert len(make(1).split()) == 1
    assert len(make(5000).split()) == 5000
    assert len(make(7).split()) == 7 and make(7) == make(7)


def test_replay_keeps_schedule_and_measures_attainment(tmp_path):
    models = ["fast", "slow", "fast", "batch"] * 6 + ["fail", "hang"]
    trace = _trace(models)
    with FakeServer() as server:
        cfg = ReplayConfig(url=server.url, max_lag_ms=100.0, timeout_s=1.8)
        summary = asyncio.run(replay(trace, cfg, tmp_path))
        seen = sorted(server.seen, key=lambda s: s[0])
    # open loop: the server saw the requests at the trace's relative times
    assert len(seen) == len(models)
    recv = np.array([s[0] for s in seen]) - seen[0][0]
    np.testing.assert_allclose(recv, np.arange(len(models)) * 0.05, atol=0.05)
    body = seen[0][1]
    assert body["stream"] is True and body["ignore_eos"] is True and body["max_tokens"] == 6
    assert len(body["prompt"].split()) == 12
    assert body["slo"] == {"ttft_ms": 300.0, "tpot_ms": 50.0}
    assert summary["valid"] is True and summary["lag_max_ms"] < 100.0

    res = read_results(tmp_path / "results.jsonl")
    assert len(res) == len(models)
    counts = dict(zip(models, res.token_counts.tolist(), strict=False))
    assert counts["fast"] == 6 and counts["slow"] == 6 and counts["batch"] == 6  # batch: 3 chunks + usage
    assert res.status.tolist()[-2:] == ["error", "timeout"]
    # fast: all 6 on time; slow: tokens at ~0.02 + 0.25k vs deadlines 0.3 + 0.05k -> 2 of 6; batch: 6
    o = res.outcomes()
    by = {m: int(o.on_time[i]) for i, m in enumerate(models)}
    assert by["fast"] == 6 and by["slow"] == 2 and by["batch"] == 6 and by["fail"] == 0 and by["hang"] == 0
    tok_total = 6 * len(models)
    assert summary["tokens"] == tok_total
    assert summary["tokens_on_time"] == 6 * (6 + 2 + 6 + 6)
    assert summary["token_attainment"] == pytest.approx(6 * 20 / tok_total)
    assert summary["ttft_attainment"] == pytest.approx(24 / 26)
    assert summary["e2e_attainment"] == pytest.approx(18 / 26)
    assert summary["errors"] == 1 and summary["timeouts"] == 1
    assert summary["goodput_rps"] == pytest.approx(18 / trace.duration_s)
    assert json.loads((tmp_path / "summary.json").read_text())["token_attainment"] == summary["token_attainment"]
    # token times are measured from submission and non-decreasing
    first = res.token_times[(np.cumsum(res.token_counts) - res.token_counts)[:4]]
    assert np.all(first > 0.015) and np.all(first < 0.2)


def _cli(*argv):
    p = argparse.ArgumentParser()
    replay_cli.add_arguments(p)
    return replay_cli.run(p.parse_args(list(argv)))


def test_replay_cli_refuses_a_run_that_fell_behind(tmp_path, capsys):
    # one connection, requests 10 ms apart that each take ~0.27 s: the replayer must queue
    write_trace(_trace(["slow"] * 4, gap=0.01, out_tokens=2), tmp_path / "t.csv")
    with FakeServer(api_key="sekret") as server:
        rc = _cli("--url", server.url, "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "run"),
                  "--max-connections", "1", "--max-lag-ms", "50", "--api-key", "sekret")  # fmt: skip
    out = capsys.readouterr()
    assert rc == 3
    assert "INVALID run" in out.err
    summary = json.loads(out.out.strip().splitlines()[-1])
    assert summary["valid"] is False and summary["lag_max_ms"] > 500 and summary["ok_requests"] == 4


def test_replay_counts_connection_errors_and_bad_key_as_misses(tmp_path, capsys):
    write_trace(_trace(["fast"] * 2), tmp_path / "t.csv")
    with FakeServer(api_key="right") as server:
        assert _cli("--url", server.url, "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "a"), "--api-key", "wrong") == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["errors"] == 2 and summary["token_attainment"] == 0.0
    res = read_results(tmp_path / "a" / "results.jsonl")
    assert res.status.tolist() == ["error", "error"]
    # nothing listening: connection refused is an error result, not a crash
    assert _cli("--url", server.url, "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "b")) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["errors"] == 2
    assert _cli("--url", "ftp://x", "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "c")) == 2


def test_replay_processes_share_one_schedule(tmp_path, capsys):
    models = ["fast"] * 30
    write_trace(_trace(models, gap=0.03), tmp_path / "t.csv")
    with FakeServer() as server:
        rc = _cli("--url", server.url, "--trace", str(tmp_path / "t.csv"), "--out", str(tmp_path / "run"), "--processes", "3")
        seen = sorted(server.seen, key=lambda s: s[0])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["processes"] == 3 and summary["valid"] is True and summary["ok_requests"] == 30
    res = read_results(tmp_path / "run" / "results.jsonl")
    assert len(res) == 30 and res.arrival_s.tolist() == sorted(res.arrival_s.tolist())
    assert res.token_counts.tolist() == [6] * 30
    recv = np.array([s[0] for s in seen]) - seen[0][0]
    np.testing.assert_allclose(recv, np.arange(30) * 0.03, atol=0.05)


def test_token_times_and_lag_are_not_quantised_by_uvloops_cached_clock(tmp_path):
    """`janus replay` runs on uvloop, whose loop.time() is cached per loop iteration at
    whole milliseconds: timing by it quantised every token time and lag to 1 ms and, on a
    busy iteration, reported times (and lag) from the iteration's start, too early."""
    import uvloop

    with FakeServer() as server:
        summary = uvloop.run(replay(_trace(["fast"] * 4), ReplayConfig(url=server.url), tmp_path))
    assert summary["valid"] is True and summary["ok_requests"] == 4
    res = read_results(tmp_path / "results.jsonl")
    token_us = np.round(res.token_times * 1e6).astype(np.int64)
    lag_us = np.round(res.send_lag_ms * 1e3).astype(np.int64)
    assert len(token_us) == 24 and np.all(token_us > 15_000)
    assert np.any(token_us % 1000 != 0), token_us
    assert np.any(lag_us % 1000 != 0), lag_us
