"""What `janus bench restore`'s daemon part (bench/restore_daemon.py, restore_tpot.py)
asks of the daemon and of the machine: admin calls, streamed tokens, the model's host
image in the page cache, a worker's RSS."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from janusd.bench import daemon_proc


def ctl(sock: str, req: Any) -> dict[str, Any]:
    from janusd.ctl_cli import call
    from janusd.wire import admin_msgs as am

    reply = call(sock, req, 600.0)
    if isinstance(reply, am.AdminError):
        raise RuntimeError(f"ctl: {reply.message}")
    return reply.data


def stream(port: int, model: str, max_tokens: int, on_token: Any = None) -> list[float]:
    """Arrival times (s after sending) of each streamed token."""
    return daemon_proc.stream_completion(port, model, "Tell me a long story about the sea.", max_tokens, on_token)[0]


def image_weights(args: argparse.Namespace, cache: str) -> Path | None:
    """The weights file of the model's host image (None when there is none yet)."""
    from janusd.engine.host_image import image_dir
    from janusd.engine.loader import checkpoint_path

    try:
        root = image_dir(Path(cache), checkpoint_path(args.checkpoint, Path(cache)), args.dtype)
    except Exception:
        return None
    w = root / "weights.bin"
    return w if (root / "meta.msgpack").exists() and w.is_file() else None


def cached_pct(path: Path | None) -> float:
    from janusd.engine.host_image import cached_fraction

    return float("nan") if path is None else cached_fraction(path) * 100


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024
