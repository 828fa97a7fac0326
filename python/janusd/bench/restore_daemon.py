"""`janus bench restore`'s daemon part (bench/restore.py): a real daemon serving the small
model on two cpu devices (model "m" on devices 0 and 1, Cold on 1), measured from the
client: control overhead, source TPOT during forks (bench/restore_tpot.py), first tokens
of a Warm or Cold model and a Cold worker's RSS."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from janusd.bench import daemon_proc
from janusd.bench.restore_client import cached_pct, ctl, image_weights, rss_mib, stream
from janusd.bench.restore_stats import median
from janusd.bench.restore_tpot import source_tpot


def _config(args: argparse.Namespace, sock: str, cache: str) -> str:
    return (f'[server]\nport = 0\nadmin_socket = "{sock}"\ncache_dir = "{cache}"\nmodel_wait_timeout_s = 120.0\n'
            f"[devices]\ncount = 2\nmemory_mib = 2048\nresident_mib = {args.resident_mib}\n"
            + (f"transfer_nice = {args.transfer_nice}\n" if args.transfer_nice is not None else "")
            + (f"[lifecycle]\nfork_bandwidth_mib_s = {args.fork_bandwidth_mib_s}\n"
               if args.fork_bandwidth_mib_s is not None else "")
            + f'[[models]]\nname = "m"\ncheckpoint = "{args.checkpoint}"\nkv_cache_mib = 256\nmax_model_len = 4096\n'
            f'dtype = "{args.dtype}"\n'
            f"ttft_slo_ms = 600000.0\ntpot_slo_ms = 600000.0\ndevices = [0, 1]\ncold_devices = [1]\n")


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings in effect (the config's defaults unless given)."""
    from janusd.config import DevicesConfig, LifecycleConfig

    return {
        "dtype": args.dtype, "resident_mib": args.resident_mib,
        "transfer_nice": DevicesConfig().transfer_nice if args.transfer_nice is None else args.transfer_nice,
        "fork_bandwidth_mib_s": (LifecycleConfig().fork_bandwidth_mib_s if args.fork_bandwidth_mib_s is None
                                 else args.fork_bandwidth_mib_s)}


def _control_overhead(sock: str, repeats: int) -> dict[str, Any]:
    """Fixed control overhead of an activation: Warm -> Active on device 0, client side,
    less the transfer and first-token phases."""
    from janusd.wire import admin_msgs as am

    overhead, phases = [], []
    for _ in range(repeats):
        ctl(sock, am.StateReq("m", 0, "warm"))
        t0 = time.perf_counter()
        r = ctl(sock, am.StateReq("m", 0, "active"))
        wall = time.perf_counter() - t0
        overhead.append(wall - r["phases"].get("transfer", 0.0) - r["phases"].get("first_token", 0.0))
        phases.append(r["phases"])
    return {"control_overhead_ms": round(median(overhead) * 1e3, 2), "warm_restore_phases_s": phases[-1]}


def _first_tokens(port: int, sock: str, args: argparse.Namespace, cache: str, pids: dict[int, int],
                  idle_rss_mib: float) -> dict[str, Any]:
    """First token through the API: the only instances Warm (then Cold), the request wakes
    one; against the first token of the same request to an Active instance. On the way,
    the RSS of device 0's worker once the model is Cold on it."""
    from janusd.wire import admin_msgs as am

    out: dict[str, Any] = {}
    out["active_first_token_s"] = round(median([stream(port, "m", 1)[0] for _ in range(args.repeats)]), 4)
    ctl(sock, am.StateReq("m", 0, "warm"))
    warm = [stream(port, "m", 1)[0]]
    for _ in range(args.repeats - 1):
        ctl(sock, am.StateReq("m", 0, "warm"))
        warm.append(stream(port, "m", 1)[0])
    ctl(sock, am.StateReq("m", 0, "cold"))
    time.sleep(0.5)
    out["cold_rss_after_mib"] = round(rss_mib(pids[0]), 1)
    out["cold_rss_over_idle_mib"] = round(out["cold_rss_after_mib"] - idle_rss_mib, 1)
    image = image_weights(args, cache)  # written by now (Warm wrote it if no run had)
    out["cold_image_cached_pct"] = round(cached_pct(image), 1)  # before the first Cold start
    cold = [stream(port, "m", 1)[0]]
    for _ in range(args.repeats - 1):
        ctl(sock, am.StateReq("m", 0, "cold"))
        cold.append(stream(port, "m", 1)[0])
    # one Cold start from the disk: the image dropped from the page cache after the
    # readahead of going Cold finished (what a Cold start costs when memory pressure
    # evicted the image since; not the product's usual path, reported beside it)
    ctl(sock, am.StateReq("m", 0, "cold"))
    if image is not None:
        from janusd.engine.host_image import drop_cached

        deadline = time.monotonic() + 10
        while cached_pct(image) < 99 and time.monotonic() < deadline:
            time.sleep(0.05)
        drop_cached(image)
        out["cold_uncached_image_cached_pct"] = round(cached_pct(image), 1)
        out["cold_uncached_first_token_s"] = round(stream(port, "m", 1)[0], 4)
    ctl(sock, am.StateReq("m", 0, "cold"))
    out["cold_restore_phases_s"] = ctl(sock, am.StateReq("m", 0, "active"))["phases"]
    out["warm_first_token_s"] = round(median(warm), 4)
    out["cold_first_token_s"] = round(median(cold), 4)
    out["first_tokens_s"] = {"warm": [round(x, 4) for x in warm], "cold": [round(x, 4) for x in cold]}
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from janusd.config import ServerConfig, cache_dir
    from janusd.wire import admin_msgs as am

    cache = args.cache_dir or str(cache_dir(ServerConfig()))
    run_dir = Path(tempfile.mkdtemp(prefix="janus-bench-restore-"))
    sock = str(run_dir / "admin.sock")
    text = _config(args, sock, cache)
    # the model's host image (the file a Cold start reads) out of the page cache, if it exists,
    # as a reboot or memory pressure leaves an image written in an earlier run: the first Cold
    # start then finds what the daemon itself put in the cache (lifecycle.cold_prefetch_image)
    image = image_weights(args, cache)
    if image is not None:
        from janusd.engine.host_image import drop_cached

        drop_cached(image)
    proc, port = daemon_proc.start(text, run_dir, args.torch_threads, {"m": 1})
    out = _settings(args)
    try:
        stream(port, "m", 4)  # warm-up
        pids = {w["device"]: w["pid"] for w in ctl(sock, am.StatusReq())["workers"]}
        out["worker_rss_idle_mib"] = round(rss_mib(pids[1]), 1)  # device 1: the model Cold, nothing loaded yet
        out.update(_control_overhead(sock, args.repeats))
        out.update(source_tpot(port, sock, args))
        out.update(_first_tokens(port, sock, args, cache, pids, out["worker_rss_idle_mib"]))
    finally:
        daemon_proc.stop(proc)
    return out
