"""Start a real `janus serve` in a subprocess for integration tests (not a test file).

The daemon gets a temporary config (port 0, a temporary admin socket, a shared cache
dir for demo checkpoints) and its log in a file; `start_daemon` returns once the log
says it is serving and the health check answers. Workers run with one torch thread
(JANUSD_WORKER_TORCH_THREADS=1): the test machine has two shared cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED_CACHE = Path(tempfile.gettempdir()) / "janusd-test-cache"

DEMO_MODELS = """
[[models]]
name = "demo-llama"
checkpoint = "demo:llama-tiny"
ttft_slo_ms = 1000.0
tpot_slo_ms = 100.0
kv_cache_mib = 32
devices = [0]

[[models]]
name = "demo-qwen2"
checkpoint = "demo:qwen2-tiny"
ttft_slo_ms = 1000.0
tpot_slo_ms = 100.0
kv_cache_mib = 32
devices = [1]
"""


def server_section(run_dir: Path, **extra: Any) -> str:
    lines = [
        "[server]",
        'host = "127.0.0.1"',
        "port = 0",
        f'admin_socket = "{run_dir / "admin.sock"}"',
        f'cache_dir = "{SHARED_CACHE}"',
        "drain_timeout_s = 10.0",
        "worker_ready_timeout_s = 120.0",
    ]
    for k, v in extra.items():
        lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


class Daemon:
    def __init__(self, proc: subprocess.Popen[bytes], run_dir: Path, config: Path, log: Path, port: int) -> None:
        self.proc = proc
        self.run_dir = run_dir
        self.config = config
        self.log = log
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.admin_socket = str(run_dir / "admin.sock")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def http(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
             raw: bytes | None = None, timeout: float = 60.0) -> tuple[int, dict[str, str], Any]:
        """(status, headers, parsed JSON or text) of one HTTP call; never raises on 4xx/5xx."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        if data is not None and "Content-Type" not in (headers or {}):
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, hdrs, text = r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            status, hdrs, text = e.code, dict(e.headers), e.read().decode()
        try:
            return status, hdrs, json.loads(text)
        except ValueError:
            return status, hdrs, text

    def ctl(self, req: Any) -> Any:
        from janusd.ctl_cli import call

        return call(self.admin_socket, req, 120.0)

    def worker_pids(self) -> dict[int, int]:
        from janusd.wire import admin_msgs as am

        reply = self.ctl(am.StatusReq())
        return {w["device"]: w["pid"] for w in reply.data["workers"]}

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def managed_header(devices: int, *, warm_after_s: float = 2.0, cold_after_s: float = 600.0) -> str:
    """The [devices], [oracle] and [control] sections of the controller's daemon tests: a
    managed daemon on `devices` cpu devices of 64 MiB, its oracle offline with its state in
    the run dir, short control periods (window 3 s, slow 0.5 s, fast 0.25 s) and the given
    keep-alive windows. Each test appends its [[models]]."""
    return (f"\n[devices]\ncount = {devices}\nmemory_mib = 64\n\n"
            '[oracle]\nonline = false\nstate_dir = "@RUN@/state"\n\n'
            "[control]\nmanaged = true\nwindow_s = 3.0\nslow_period_s = 0.5\nfast_period_s = 0.25\n\n"
            f"[control.keepalive]\nwarm_after_s = {warm_after_s}\ncold_after_s = {cold_after_s}\n")


def start_daemon(config_text: str, env: dict[str, str] | None = None, timeout_s: float = 150.0,
                 args: list[str] | None = None) -> Daemon:
    run_dir = Path(tempfile.mkdtemp(prefix="jd-"))
    config = run_dir / "janusd.toml"
    config.write_text(config_text.replace("@RUN@", str(run_dir)))
    log = run_dir / "daemon.log"
    full_env = {**os.environ, "JANUSD_WORKER_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "janusd.cli", "serve", "--config", str(config), *(args or [])],
            stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        m = re.search(r"serving on http://127\.0\.0\.1:(\d+)", text)
        if m:
            return Daemon(proc, run_dir, config, log, int(m.group(1)))
        if proc.poll() is not None:
            raise RuntimeError(f"janus serve exited with {proc.returncode} before serving:\n{text}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"janus serve not serving within {timeout_s} s:\n{log.read_text(errors='replace')}")


async def until(pred: Any, timeout_s: float) -> bool:
    """wait_until for a test's own event loop: poll `pred` every 10 ms, False on timeout."""
    import asyncio

    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


def wait_until(pred: Any, timeout_s: float, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            return v
        time.sleep(interval_s)


def open_stream(d: Daemon, model: str, max_tokens: int, prompt: str = "once upon a time") -> tuple[Any, Any]:
    """A streaming completion (ignore_eos, usage included) left open: (connection, response)."""
    import http.client

    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise AssertionError(f"stream refused: {resp.status} {resp.read()[:300]!r}")
    return conn, resp


def sse_events(resp: Any) -> Any:
    """Yield (receive time, decoded event or '[DONE]') from an SSE response."""
    while True:
        line = resp.readline()
        if not line:
            return
        line = line.strip()
        if line.startswith(b"data: "):
            payload = line[6:]
            yield time.monotonic(), ("[DONE]" if payload == b"[DONE]" else json.loads(payload))


def kill_mid_stream(d: Daemon, model: str, pid: int) -> tuple[list[tuple[float, Any]], list[tuple[float, Any]]]:
    """SIGKILL `pid` once a long stream of `model` has sent its first token: (the events
    after the kill, those of them that are errors, each with its seconds after the kill)."""
    import os
    import signal

    conn, resp = open_stream(d, model, 1500)
    events = sse_events(resp)
    _, first = next(events)
    assert first["choices"][0]["finish_reason"] is None
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    rest = [(t - t_kill, e) for t, e in events]
    conn.close()
    return rest, [(t, e) for t, e in rest if isinstance(e, dict) and "error" in e]
