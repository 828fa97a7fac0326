"""D2D fork between two real processes over Mooncake (loopback tcp): byte-identical
weights and generations; after kill -9 of the source, a fork falls back on its own to
the host copy (H2D) or, with none, to a cold start (the converted image), and still
ends Active."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent / "python"), str(HERE)]),
       "MC_TCP_PROGRESS_TIMEOUT_SEC": "2"}


def test_fork_is_byte_identical_and_falls_back_when_the_source_dies():
    source = subprocess.Popen([sys.executable, str(HERE / "fork_peer.py"), "source"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=ENV, text=True)
    target = None
    try:
        pub = json.loads(source.stdout.readline())
        target = subprocess.Popen([sys.executable, str(HERE / "fork_peer.py"), "target", json.dumps(pub["source"])],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=ENV, text=True)
        forked = json.loads(target.stdout.readline())
        assert forked["path"] == "d2d" and not forked["fallback"], forked
        assert forked["sha"] == pub["sha"] and forked["greedy"] == pub["greedy"]
        source.send_signal(signal.SIGKILL)
        source.wait(10)
        target.stdin.write("go\n")
        target.stdin.flush()
        h2d = json.loads(target.stdout.readline())
        assert h2d["path"] == "h2d" and h2d["fallback"], h2d
        assert h2d["sha"] == pub["sha"] and h2d["greedy"] == pub["greedy"]
        cold = json.loads(target.stdout.readline())
        assert cold["path"] == "image" and cold["fallback"], cold  # the image its warm copy left on disk
        assert cold["sha"] == pub["sha"] and cold["greedy"] == pub["greedy"] and cold["weight_pages"] == 1
        target.stdin.close()
        assert target.wait(30) == 0
    finally:
        for p in (source, target):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_source_killed_mid_transfer_fails_the_pull_cleanly():
    """kill -9 of the source while the bytes move: the pull fails at once (no hang) and the
    target's pool is back to its free page count; at the model level the fork then falls
    back (the test above)."""
    import time

    nbytes = 256 << 20
    source = subprocess.Popen([sys.executable, "-m", "janusd.bench.restore_peer", str(nbytes)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=ENV, text=True)
    target = None
    try:
        src = source.stdout.readline()
        target = subprocess.Popen([sys.executable, str(HERE / "fork_peer.py"), "pull", str(nbytes), src],
                                  stdout=subprocess.PIPE, env=ENV, text=True)
        assert target.stdout.readline().strip() == "started"
        time.sleep(0.05)
        source.send_signal(signal.SIGKILL)
        out = json.loads(target.stdout.readline())
        assert "TransferError" in out.get("error", ""), out
        assert out["seconds"] < 10 and out["free_after"] == out["free_before"], out
        assert target.wait(30) == 0
    finally:
        for p in (source, target):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_paced_pull_keeps_its_cap_and_niced_transfer_threads():
    """lifecycle.fork_bandwidth_mib_s: a pull capped at 32 MiB/s takes at least the cap's
    time for its bytes (and still verifies); devices.transfer_nice: the transfer engine's
    threads run that much nicer than the process, the thread that made it does not."""
    import time

    nbytes, cap = 16 << 20, 32 << 20
    source = subprocess.Popen([sys.executable, "-m", "janusd.bench.restore_peer", str(nbytes)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=ENV, text=True)
    target = None
    try:
        src = source.stdout.readline()
        t0 = time.monotonic()
        target = subprocess.Popen([sys.executable, str(HERE / "fork_peer.py"), "pull", str(nbytes), src, str(cap), "7"],
                                  stdout=subprocess.PIPE, env=ENV, text=True)
        assert target.stdout.readline().strip() == "started"
        out = json.loads(target.stdout.readline())
        assert "error" not in out, out
        # pieces of cap/20 bytes, each started no earlier than the cap allows: the last one
        # starts at (nbytes - piece) / cap
        assert out["seconds"] >= (nbytes - cap / 20) / cap * 0.99, out
        assert out["nice"]["engine"] and set(out["nice"]["engine"]) == {min(19, out["nice"]["main"] + 7)}, out
        assert out["nice"]["main"] == os.getpriority(os.PRIO_PROCESS, 0), out  # ours, inherited: not lowered
        assert target.wait(30) == 0
        assert time.monotonic() - t0 < 60
    finally:
        for p in (source, target):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
