"""End to end: `janus replay` against a real `janus serve` (one CPU device, a tiny demo model)."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from janusd.trace.formats import Trace, write_trace

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """
[server]
host = "127.0.0.1"
port = {port}
admin_socket = "{tmp}/admin.sock"
cache_dir = "{tmp}/cache"

[devices]
kind = "cpu"
count = 1
memory_mib = 512

[[models]]
name = "demo-llama"
checkpoint = "demo:llama-tiny"
app = "demo"
ttft_slo_ms = 5000.0
tpot_slo_ms = 1000.0
devices = [0]
kv_cache_mib = 64
max_model_len = 512
"""


def _wait_healthy(url, proc, log, limit_s=180):
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"janus serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"janus serve not healthy within {limit_s} s:\n{log.read_text()[-3000:]}")


def test_replay_against_janus_serve(tmp_path):
    port = _free_port()
    cfg = tmp_path / "janusd.toml"
    cfg.write_text(CONFIG.format(port=port, tmp=tmp_path))
    log = tmp_path / "serve.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with open(log, "wb") as logf:
        proc = subprocess.Popen([sys.executable, "-m", "janusd.cli", "serve", "--config", str(cfg)],
                                stdout=logf, stderr=subprocess.STDOUT, env=env)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc, log)
        n = 6
        trace = Trace.build(np.arange(n) * 0.2, ["demo"] * n, ["demo-llama"] * n, np.full(n, 16), np.full(n, 8))
        write_trace(trace, tmp_path / "t.csv")
        out = subprocess.run(
            [sys.executable, "-m", "janusd.cli", "replay", "--url", url, "--trace", str(tmp_path / "t.csv"),
             "--out", str(tmp_path / "run"), "--ttft-slo-ms", "5000", "--tpot-slo-ms", "1000", "--timeout-s", "60",
             "--devices-poll-s", "0.2"],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr + log.read_text()[-3000:]
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        assert summary["valid"] is True
        assert summary["requests"] == n and summary["ok_requests"] == n, summary
        assert summary["tokens"] == 8 * n  # ignore_eos + max_tokens held the output length
        rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
        for r in rows:
            assert r["status"] == "ok" and len(r["token_times_s"]) == 8
            assert all(a <= b for a, b in zip(r["token_times_s"], r["token_times_s"][1:], strict=False))
        # an idle daemon and a tiny model against 5 s / 1 s targets: every token on time
        assert summary["token_attainment"] == 1.0, summary
        # devices.csv, sampled from the daemon's /metrics: one device, one model instance on it
        lines = (tmp_path / "run" / "devices.csv").read_text().splitlines()
        assert lines[0] == "t_s,active_devices,active_instances"
        samples = [[float(x) for x in line.split(",")] for line in lines[1:]]
        assert summary["device_poll_failures"] == 0 and len(samples) == summary["device_polls"] >= 3, summary
        t = [s[0] for s in samples]
        assert all(a < b for a, b in zip(t, t[1:], strict=False)) and 0.0 <= t[0] < 0.2  # trace axis: first arrival 0
        assert all(s[1:] == [1.0, 1.0] for s in samples), samples
        report = [sys.executable, "-m", "janusd.cli", "report", str(tmp_path / "run"), "--out", str(tmp_path / "rep")]
        rep = subprocess.run(report, capture_output=True, text=True, env=env, timeout=120)
        assert rep.returncode == 0, rep.stderr
        assert "Active devices" not in (tmp_path / "rep" / "summary.md").read_text()  # the panel was drawn
        png = (tmp_path / "rep" / "timeline.png").read_bytes()
        assert int.from_bytes(png[20:24], "big") == round((2.0 * 3 + 0.4) * 130)  # three panels tall, not two
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
