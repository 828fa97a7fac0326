"""Operator mistakes get one clear line and a non-zero exit, never a traceback.

Real processes and real Unix sockets: `janus ctl` against a missing socket and a daemon
that never answers, and a device worker started with a device kind it cannot serve.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import msgspec

from janusd.wire.framing import BlockingFramedSocket

JANUS = [sys.executable, "-m", "janusd.cli"]


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)  # type: ignore[call-overload]


def _one_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    return lines[-1]


def test_ctl_missing_socket_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.sock"
    r = _run([*JANUS, "ctl", "--socket", str(path), "status"])
    assert r.returncode == 1
    line = _one_error_line(r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1
    assert line.startswith("janus ctl: cannot reach the daemon's admin socket") and str(path) in line


def test_ctl_timeout_must_be_positive() -> None:
    for bad in ("0", "-1", "soon"):
        r = _run([*JANUS, "ctl", "--socket", "/nonexistent.sock", "--timeout", bad, "status"])
        assert r.returncode == 2, (bad, r.stderr)
        assert "--timeout" in _one_error_line(r.stderr)


def test_ctl_silent_daemon_times_out_with_a_clear_message(tmp_path: Path) -> None:
    # A listening socket that never accepts: connect succeeds (backlog), no reply comes.
    path = tmp_path / "silent.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(str(path))
        srv.listen(4)
        r = _run([*JANUS, "ctl", "--socket", str(path), "--timeout", "0.5", "status"])
    finally:
        srv.close()
    assert r.returncode == 1
    assert _one_error_line(r.stderr) == f"janus ctl: {path}: no reply within 0.5 s (raise --timeout)"


def test_worker_with_an_unusable_device_kind_logs_one_line_and_replies_the_error() -> None:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "janusd.engine.worker", "--fd", str(child.fileno()), "--device-index", "0",
             "--kind", "bogus", "--memory-bytes", str(4 << 20)],
            pass_fds=[child.fileno()], capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        child.close()
        parent.settimeout(10)
        body = BlockingFramedSocket(parent).recv()
    finally:
        parent.close()
        if child.fileno() != -1:
            child.close()
    assert proc.returncode == 1
    line = _one_error_line(proc.stderr)
    assert line.endswith("cannot start the device engine: unknown device kind 'bogus' (cpu, cuda, npu)"), line
    assert body is not None
    assert "device bogus:0: unknown device kind 'bogus'" in str(msgspec.msgpack.decode(body))


def test_ctl_load_and_unload_need_a_name() -> None:
    for action in ("load", "unload"):
        r = _run([*JANUS, "ctl", "--socket", "/nonexistent.sock", action])
        assert r.returncode == 1
        assert _one_error_line(r.stderr) == f"janus ctl: {action}: a model name is required (janus ctl {action} NAME)"


def test_ctl_subcommands_without_a_name_refuse_an_extra_argument() -> None:
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "janusd.cli", "ctl", "--socket", "/nonexistent/admin.sock",
                          "status", "extra", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "status takes no argument (got 'extra')" in json.loads(out.stdout)["error"]
