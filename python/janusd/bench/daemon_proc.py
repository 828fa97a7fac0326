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
from pathlib import Path
from typing import Any


def active_instances(port: int) -> dict[str, int]:
    """Active instances per model, from /health; {} when the daemon does not answer."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/health")
        out = json.loads(conn.getresponse().read())
        conn.close()
        return dict(out.get("models", {}))
    except (OSError, ValueError):
        return {}


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


def stream_completion(port: int, model: str, prompt: str, max_tokens: int,
                      on_token: Any = None) -> tuple[list[float], str, int]:
    """One greedy streamed completion (ignore_eos): the arrival time of each token event
    (s after sending), the whole text and the prompt's token count. `on_token(n)` is
    called as the n-th token event arrives (returning True stops reading: the connection
    closes and the daemon cancels the request); an HTTP or stream error raises RuntimeError."""
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{model}: HTTP {resp.status}: {resp.read()[:300]!r}")
    times: list[float] = []
    text: list[str] = []
    prompt_tokens = 0
    while line := resp.readline():
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            if "error" in ev:
                raise RuntimeError(f"{model}: {ev['error']}")
            if ev.get("usage"):
                prompt_tokens = ev["usage"]["prompt_tokens"]
            if ev.get("choices"):
                times.append(time.perf_counter() - t0)
                text.append(ev["choices"][0]["text"])
                if on_token is not None and on_token(len(times)):
                    break  # the caller has what it needs: closing the connection cancels the request
    conn.close()
    return times, "".join(text), prompt_tokens
