"""SIGTERM with a client that stopped reading its stream (its handler blocked in write by
backpressure): the daemon still exits 0 soon after the drain timeout, well inside systemd's
TimeoutStopSec, and frees the request on the worker."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

from daemon_harness import server_section, start_daemon, wait_until
from janusd.wire import admin_msgs as am

MODEL = """
[[models]]
name = "demo-llama"
checkpoint = "demo:llama-tiny"
kv_cache_mib = 32
devices = [0]
"""


def test_sigterm_with_a_stalled_stream_client_exits_zero_soon_after_the_drain():
    text = server_section(Path("@RUN@")).replace("drain_timeout_s = 10.0", "drain_timeout_s = 1.0")
    d = start_daemon(text + "[devices]\ncount = 1\nmemory_mib = 128\n" + MODEL)
    try:
        body = json.dumps({"model": "demo-llama", "prompt": "once upon a time", "max_tokens": 2000,
                           "ignore_eos": True, "stream": True}).encode()
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # a client that reads nothing, soon blocks us
        s.connect(("127.0.0.1", d.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert s.recv(12).startswith(b"HTTP/1.1 200")
        time.sleep(0.5)  # the stream outruns the socket buffers; the handler waits in write()
        assert d.ctl(am.StatusReq()).data["in_flight"] == 1  # still generating when SIGTERM comes
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: d.proc.poll() is not None, 20.0), "still running 20 s after SIGTERM"
        assert d.proc.returncode == 0, d.log_text()
        assert time.monotonic() - t0 < 1.0 + 5.0, time.monotonic() - t0
        assert "Traceback" not in d.log_text()
        s.close()
    finally:
        d.stop()


def test_a_second_daemon_on_a_busy_port_or_admin_socket_fails_before_loading_models(tmp_path):
    """The check runs before any worker starts: the exit comes in well under a model load."""
    import subprocess
    import sys

    d = start_daemon(server_section(Path("@RUN@")) + "[devices]\ncount = 1\nmemory_mib = 128\n" + MODEL)
    try:
        cases = [
            # same port, fresh admin socket
            server_section(tmp_path).replace("port = 0", f"port = {d.port}"),
            # free port, the running daemon's admin socket
            server_section(tmp_path).replace(f'"{tmp_path / "admin.sock"}"', f'"{d.run_dir / "admin.sock"}"'),
        ]
        for i, text in enumerate(cases):
            cfg = tmp_path / f"second{i}.toml"
            cfg.write_text(text + "[devices]\ncount = 1\nmemory_mib = 128\n" + MODEL)
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "janusd.cli", "serve", "--config", str(cfg)],
                                  capture_output=True, text=True, timeout=60)
            out = proc.stdout + proc.stderr
            assert proc.returncode == 1, out
            assert "start-up failed" in out and "worker" not in out.split("start-up failed")[0], out
            assert ("cannot listen on 127.0.0.1:" in out) if i == 0 else ("another daemon is listening" in out), out
            assert time.monotonic() - t0 < 10.0
        # the first daemon is unharmed
        assert d.http("GET", "/health")[0] == 200
    finally:
        d.stop()


def test_sighup_with_command_line_overrides_and_an_unchanged_file_reports_no_server_change(tmp_path):
    """`janus serve --port P` then SIGHUP: the reloaded file gets the same overrides, so an
    unchanged file is not reported as a [server] change needing a restart."""
    import re
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "janusd.toml"
    cfg.write_text(server_section(tmp_path) + "[devices]\ncount = 1\nmemory_mib = 128\n" + MODEL)
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "janusd.cli", "serve", "--config", str(cfg), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: re.search(rf"serving on http://127\.0\.0\.1:{port}", log.read_text()), 120.0), \
            log.read_text()
        proc.send_signal(signal.SIGHUP)
        assert wait_until(lambda: "reload: removed" in log.read_text(), 10.0), log.read_text()
        assert "need a restart" not in log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_idle_sigterm_exits_well_under_a_second():
    """Idle: nothing to drain, so the exit is the listeners closing plus the workers exiting.
    Workers used to run the interpreter's full teardown (pool pages, torch, the transfer
    engine): ~0.7 s of a ~0.87 s exit with two demo workers; they now leave at once."""
    import re

    two = MODEL + MODEL.replace('"demo-llama"', '"demo-llama-b"').replace("devices = [0]", "devices = [1]")
    d = start_daemon(server_section(Path("@RUN@")) + "[devices]\ncount = 2\nmemory_mib = 128\n" + two)
    try:
        assert d.http("GET", "/health")[0] == 200
        pids = d.worker_pids()
        t0 = time.monotonic()
        d.proc.send_signal(signal.SIGTERM)
        assert d.proc.wait(20) == 0
        took = time.monotonic() - t0
        m = re.search(r"stopped \(drain ([\d.]+) s, listeners ([\d.]+) s, workers ([\d.]+) s\)", d.log_text())
        assert m, d.log_text()
        assert float(m.group(3)) < 0.3, m.group(0)
        assert took < 0.6, (took, m.group(0))
        for pid in pids.values():  # exited, not orphaned: gone or a zombie awaiting its reaper
            assert wait_until(lambda: _exited(pid), 2.0), f"worker {pid} outlived the daemon"
    finally:
        d.stop()


def _exited(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] == "Z"
    except OSError:
        return True
