"""A real `janus serve` in a subprocess for the benchmarks that measure through the API.

Models load after the daemon starts serving, so a benchmark waits until /health shows
each of its models with the expected number of Active instances; a load failure in the
log ends the wait at once with the log's tail instead of a 5-minute timeout.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def health(port: int, timeout_s: float = 10.0) -> tuple[int, dict[str, Any]]:
    """GET /health: (HTTP status, its JSON body or {}); (0, {}) when nothing answers."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
    except OSError:
        return 0, {}
    try:
        out = json.loads(body)
    except ValueError:
        out = {}
    return resp.status, out if isinstance(out, dict) else {}


def active_instances(port: int) -> dict[str, int]:
    """Active instances per model, from /health; {} when the daemon does not answer."""
    return dict(health(port)[1].get("models", {}))


def start(config_text: str, run_dir: Path, torch_threads: int, active: dict[str, int],
          timeout_s: float = 300.0) -> tuple[subprocess.Popen[bytes], int]:
    """Start the daemon on `config_text` (port 0); return it and its port once `active`
    (model -> instances) holds. Raises RuntimeError with the log's tail otherwise."""
    cfg = run_dir / "bench.toml"
    cfg.write_text(config_text)
    log = run_dir / "daemon.log"
    env = {**os.environ, "JANUSD_WORKER_TORCH_THREADS": str(torch_threads)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "janusd.cli", "serve", "--config", str(cfg)], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if re.search(r"janusd: loading \S+ on device \d+ failed", text):
            break
        m = re.search(r"serving on http://127\.0\.0\.1:(\d+)", text)
        if m and active_instances(int(m.group(1))) == active:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the daemon did not start or load its models:\n{log.read_text(errors='replace')[-4000:]}")


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> int:
    """SIGTERM (drain and exit), then kill if it does not exit in time; the exit code."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _sse_events(resp: http.client.HTTPResponse, model: str) -> Iterator[dict[str, Any]]:
    """The JSON events of an SSE stream; an error event raises RuntimeError."""
    while line := resp.readline():
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(f"{model}: {ev['error']}")
            yield ev


def _post_stream(port: int, path: str, body: dict[str, Any], model: str) -> tuple[Any, Any, float]:
    """POST a streaming request: (connection, response, send time); a non-200 raises RuntimeError."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        err = resp.read()[:300]
        conn.close()
        raise RuntimeError(f"{model}: HTTP {resp.status}: {err!r}")
    return conn, resp, t0


def stream_completion(port: int, model: str, prompt: str, max_tokens: int,
                      on_token: Any = None) -> tuple[list[float], str, int]:
    """One greedy streamed completion (ignore_eos): the arrival time of each token event
    (s after sending), the whole text and the prompt's token count. `on_token(n)` is
    called as the n-th token event arrives (returning True stops reading: the connection
    closes and the daemon cancels the request); an HTTP or stream error raises RuntimeError."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    conn, resp, t0 = _post_stream(port, "/v1/completions", body, model)
    times: list[float] = []
    text: list[str] = []
    prompt_tokens = 0
    for ev in _sse_events(resp, model):
        if ev.get("usage"):
            prompt_tokens = ev["usage"]["prompt_tokens"]
        if ev.get("choices"):
            times.append(time.perf_counter() - t0)
            text.append(ev["choices"][0]["text"])
            if on_token is not None and on_token(len(times)):
                break  # the caller has what it needs: closing the connection cancels the request
    conn.close()
    return times, "".join(text), prompt_tokens


@dataclass
class ChatStream:
    """One streamed chat completion as a client sees it (times in s after sending)."""

    token_times: list[float]  # arrival of each event that carried tokens
    tokens: int  # completion tokens: the usage's when the server sent one, else counted
    text: str
    prompt_tokens: int


def _event_tokens(choice: dict[str, Any]) -> int:
    """Tokens one chat chunk carries: its `token_ids` (janusd sends them: a chunk may hold
    several) or one per chunk with text (llama-server: a chunk per token)."""
    if "token_ids" in choice:
        return len(choice["token_ids"])
    return 1 if (choice.get("delta") or {}).get("content") else 0


def stream_chat(port: int, model: str, messages: list[dict[str, str]], max_tokens: int) -> ChatStream:
    """One greedy streamed OpenAI chat completion (ignore_eos, usage requested) against any
    OpenAI-compatible server on 127.0.0.1 (janusd or a peer); errors raise RuntimeError."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    conn, resp, t0 = _post_stream(port, "/v1/chat/completions", body, model)
    times: list[float] = []
    text: list[str] = []
    counted, usage = 0, None
    try:
        for ev in _sse_events(resp, model):
            usage = ev.get("usage") or usage
            for choice in ev.get("choices") or ():
                n = _event_tokens(choice)
                if n:
                    times.append(time.perf_counter() - t0)
                    counted += n
                text.append((choice.get("delta") or {}).get("content") or "")
    finally:
        conn.close()
    tokens = int(usage["completion_tokens"]) if usage else counted
    return ChatStream(times, tokens, "".join(text), int(usage["prompt_tokens"]) if usage else 0)
