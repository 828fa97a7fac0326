"""`janus bench restore`: what bringing weights back costs against the raw speed of the
same bytes on the same machine, in the same run (PAPER.md §8, issue [L]).

Synthetic segments of each size (default 64 MiB to 2 GiB), in this process's own cpu
pool, through the code the worker runs:
- H2D: a weight segment filled from a host copy by engine/restore.Copier (chunks, several
  in flight), against one plain copy of the same bytes into resident memory
  (`h2d_vs_memcpy` = memcpy time / restore time). Warm keeps its freed pool pages resident
  on cpu devices, so the restore writes resident pages; `h2d_fresh_pages_vs_memcpy` is the
  same copy into pages given back to the OS (what a Cold start writes into);
- D2D: engine/worker_lifecycle.pull_segment (match the pieces, chunked batch read over
  Mooncake, sampled checksums) from a peer process into a fresh segment, against a raw
  Mooncake read of the same bytes from the same peer into resident memory
  (`d2d_vs_raw_transfer`) and into a fresh segment like the fork's
  (`d2d_vs_raw_transfer_same_pages`: what the fork's own work costs);
- Cold: the converted image read into a segment whose pages were given back to the OS
  (Copier.read_file: chunked preads in flight), against a sequential read() of the same
  file into one resident buffer (`cold_vs_disk`) and into pages given back to the OS
  (`cold_vs_disk_same_pages`); the file is in the page cache for all of them.
Then through a real daemon serving the same small model (SmolLM2-135M-Instruct by
default) on two cpu devices:
- `control_overhead_ms`: client-side time of `ctl state active` (Warm -> Active) minus the
  transfer and first-token phases: everything but moving bytes and the first token;
- `source_tpot_p99_increase_pct`: the p99 inter-token gap of a stream on the source
  device while forks to the other device run, against the same stream's gaps before;
- `warm_first_token_s` / `cold_first_token_s`: a request to the model while its only
  instances are Warm / Cold, sent to the first streamed token (the request wakes one);
- `cold_rss_after_mib`: the worker's RSS once the model is Cold on its device.
The machine is shared and noisy: medians of a few repeats; ratios (same bytes, same run)
mean more than absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from janusd.bench import daemon_proc

if TYPE_CHECKING:  # torch loads in the functions: `janus --help` builds every bench's parser
    import torch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes-mib", default="64,256,1024,2048", help="synthetic segment sizes (MiB)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per size and path (median)")
    p.add_argument("--streams", type=int, default=4, help="chunked copies in flight")
    p.add_argument("--chunk-mib", type=int, default=64, help="chunk size")
    p.add_argument("--checkpoint", default="builtin:smollm2-135m-instruct", help="model for the daemon part")
    p.add_argument("--no-daemon", action="store_true", help="synthetic segments only")
    p.add_argument("--forks", type=int, default=3, help="forks during the source stream")
    p.add_argument("--cache-dir", default=None, help="checkpoint cache dir (default: the config default)")
    p.add_argument("--torch-threads", type=int, default=1, help="torch threads per worker")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))] if s else float("nan")


def _fill(t: torch.Tensor) -> None:
    import torch

    gen = torch.Generator().manual_seed(1)
    step = 64 << 20
    for a in range(0, t.numel(), step):
        n = min(step, t.numel() - a)
        t[a: a + n].copy_(torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen))


def _synthetic(sizes: list[int], args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    import torch

    from janusd.engine.restore import Copier, release_backing
    from janusd.engine.worker_lifecycle import pull_segment
    from janusd.lifecycle.transfer import GlobalRegionTransport, Piece
    from janusd.memory import DevicePool
    from janusd.wire import worker_msgs as wm

    import msgspec

    page = 2 << 20
    pool = DevicePool("cpu", max(sizes) // page + 2, page, background=False)
    transport = GlobalRegionTransport(pool.global_base, pool.global_nbytes)
    copier = Copier(args.streams, args.chunk_mib << 20)
    rows = []

    def fresh(n: int) -> Any:
        return pool.alloc_weights("w", n)

    def drop(seg: Any, give_back: bool = True) -> None:
        """Free the segment; give_back: its host memory too (as Cold does; Warm keeps it)."""
        if give_back:
            release_backing("cpu", pool.global_base, page, seg.page_ids)
        pool.free("w")

    for n in sizes:
        row: dict[str, Any] = {"mib": n >> 20}
        host = torch.empty(n, dtype=torch.uint8)
        _fill(host)
        # H2D: into a fresh segment (as a restore gets) vs memcpy into resident memory
        seg = fresh(n)
        dst = seg.tensor()[:n]
        dst.copy_(host)
        memcpy = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            dst.copy_(host)
            memcpy.append(time.perf_counter() - t0)
        del dst
        drop(seg)
        h2d: list[float] = []
        fresh_h2d: list[float] = []
        for give_back, out in ((False, h2d), (True, fresh_h2d)):
            # Warm keeps its freed pool pages resident (the restore gets them back); pages
            # given back to the OS (Cold) pay the kernel's zeroing on first touch
            for _ in range(args.repeats):
                seg = fresh(n)
                if not give_back:
                    seg.tensor()[:n].fill_(0)  # resident, as after the model left for Warm
                t0 = time.perf_counter()
                copier.copy(seg.tensor()[:n], host)
                out.append(time.perf_counter() - t0)
                ok = torch.equal(seg.tensor()[n - (1 << 20): n], host[n - (1 << 20):])
                drop(seg, give_back=True)
        row.update(memcpy_s=_median(memcpy), h2d_s=_median(h2d), h2d_vs_memcpy=_median(memcpy) / _median(h2d),
                   h2d_fresh_pages_s=_median(fresh_h2d),
                   h2d_fresh_pages_vs_memcpy=_median(memcpy) / _median(fresh_h2d), h2d_bytes_ok=ok)
        # Cold: the image file mapped and copied vs a sequential read of the same file
        path = work / f"image-{n >> 20}.bin"
        with open(path, "wb") as fh:
            fh.write(memoryview(host.numpy()))  # type: ignore[arg-type]
        buf = bytearray(1 << 24)
        disk, disk_fresh, cold = [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
            disk.append(time.perf_counter() - t0)
            seg = fresh(n)  # the same sequential read into pages given back to the OS
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                f.readinto(memoryview(seg.tensor()[:n].numpy()))  # type: ignore[arg-type]
            disk_fresh.append(time.perf_counter() - t0)
            drop(seg)
            t0 = time.perf_counter()
            seg = fresh(n)  # pages given back to the OS when the model went Cold
            copier.read_file(seg.tensor()[:n], path)
            cold.append(time.perf_counter() - t0)
            drop(seg)
        path.unlink()
        row.update(disk_read_s=_median(disk), cold_s=_median(cold), cold_vs_disk=_median(disk) / _median(cold),
                   disk_read_fresh_pages_s=_median(disk_fresh),
                   cold_vs_disk_same_pages=_median(disk_fresh) / _median(cold))
        del host
        # D2D: a peer process's segment, raw read vs the fork's pull (pieces, chunks, checksums)
        peer = subprocess.Popen([sys.executable, "-m", "janusd.bench.restore_peer", str(n)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            src = msgspec.convert(json.loads(peer.stdout.readline()), wm.ForkSource)  # type: ignore[union-attr]
            def raw_read(seg: Any) -> None:
                off = 0
                pieces = []
                for a, m in src.pieces:  # one piece per run of the source's pages, into ours
                    pieces.append(Piece(a, seg.global_offset + off, m))
                    off += m
                transport.read(src.session, src.global_base, pieces)

            raw, raw_fresh, fork = [], [], []
            seg = fresh(n)
            seg.tensor()[:n].fill_(0)  # resident destination
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                raw_read(seg)
                raw.append(time.perf_counter() - t0)
            drop(seg)
            for _ in range(args.repeats):
                seg = fresh(n)  # destination pages given back to the OS, as the fork's get
                t0 = time.perf_counter()
                raw_read(seg)
                raw_fresh.append(time.perf_counter() - t0)
                drop(seg)
                t0 = time.perf_counter()
                seg = fresh(n)
                pull_segment(transport, src, seg, args.chunk_mib << 20)
                fork.append(time.perf_counter() - t0)
                drop(seg)
        finally:
            peer.stdin.close()  # type: ignore[union-attr]
            peer.wait(30)
        row.update(raw_transfer_s=_median(raw), d2d_s=_median(fork), d2d_vs_raw_transfer=_median(raw) / _median(fork),
                   raw_transfer_fresh_pages_s=_median(raw_fresh),
                   d2d_vs_raw_transfer_same_pages=_median(raw_fresh) / _median(fork), d2d_gbps=n / _median(fork) / 1e9)
        rows.append({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})
    transport.close()
    pool.close()
    return rows


# ---- through a daemon ----
def _ctl(sock: str, req: Any) -> dict[str, Any]:
    from janusd.ctl_cli import call
    from janusd.wire import admin_msgs as am

    reply = call(sock, req, 600.0)
    if isinstance(reply, am.AdminError):
        raise RuntimeError(f"ctl: {reply.message}")
    return reply.data


def _stream(port: int, model: str, max_tokens: int, on_token: Any = None) -> list[float]:
    """Arrival times (s after sending) of each streamed token."""
    return daemon_proc.stream_completion(port, model, "Tell me a long story about the sea.", max_tokens, on_token)[0]


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmRSS:")) / 1024


def _daemon(args: argparse.Namespace) -> dict[str, Any]:
    from janusd.config import ServerConfig, cache_dir
    from janusd.wire import admin_msgs as am

    cache = args.cache_dir or str(cache_dir(ServerConfig()))
    run_dir = Path(tempfile.mkdtemp(prefix="janus-bench-restore-"))
    sock = str(run_dir / "admin.sock")
    text = (f'[server]\nport = 0\nadmin_socket = "{sock}"\ncache_dir = "{cache}"\nmodel_wait_timeout_s = 120.0\n'
            f"[devices]\ncount = 2\nmemory_mib = 2048\n"
            f'[[models]]\nname = "m"\ncheckpoint = "{args.checkpoint}"\nkv_cache_mib = 256\n'
            f"ttft_slo_ms = 600000.0\ntpot_slo_ms = 600000.0\ndevices = [0, 1]\ncold_devices = [1]\n")
    proc, port = daemon_proc.start(text, run_dir, args.torch_threads, {"m": 1})
    out: dict[str, Any] = {}
    try:
        _stream(port, "m", 4)  # warm-up
        pids = {w["device"]: w["pid"] for w in _ctl(sock, am.StatusReq())["workers"]}
        out["worker_rss_idle_mib"] = round(_rss_mib(pids[1]), 1)  # device 1: the model Cold, nothing loaded yet
        # fixed control overhead of an activation: Warm -> Active on device 0, client side
        overhead, phases = [], []
        for _ in range(args.repeats):
            _ctl(sock, am.StateReq("m", 0, "warm"))
            t0 = time.perf_counter()
            r = _ctl(sock, am.StateReq("m", 0, "active"))
            wall = time.perf_counter() - t0
            overhead.append(wall - r["phases"].get("transfer", 0.0) - r["phases"].get("first_token", 0.0))
            phases.append(r["phases"])
        out["control_overhead_ms"] = round(_median(overhead) * 1e3, 2)
        out["warm_restore_phases_s"] = phases[-1]
        # source TPOT p99 before vs during forks 0 -> 1 (device 1 back to Cold after each)
        n_before, n_total = 80, 80 + 60 * args.forks
        started = threading.Event()
        forks_done: list[int] = []

        def on_token(i: int) -> None:
            if i == n_before:
                started.set()

        res: dict[str, list[float]] = {}
        th = threading.Thread(target=lambda: res.setdefault("t", _stream(port, "m", n_total, on_token)))
        th.start()
        started.wait(600)
        fork_rows = []
        for _ in range(args.forks):
            k = len(res.get("t", [])) or 0
            r = _ctl(sock, am.ForkReq("m", 0, 1))
            fork_rows.append(r)
            _ctl(sock, am.StateReq("m", 1, "cold"))
            forks_done.append(k)
        th.join(600)
        times = res["t"]
        gaps = [b - a for a, b in zip(times, times[1:])]
        before, during = gaps[5:n_before - 1], gaps[n_before:]
        out["source_tpot_p99_before_ms"] = round(_p99(before) * 1e3, 2)
        out["source_tpot_p99_during_ms"] = round(_p99(during) * 1e3, 2)
        out["source_tpot_p99_increase_pct"] = round((_p99(during) / _p99(before) - 1) * 100, 1)
        out["fork_paths"] = [r["path"] for r in fork_rows]
        out["fork_phases_s"] = fork_rows[-1]["phases"]
        # first token through the API: the only instances Warm (then Cold), the request wakes one;
        # against the first token of the same request to an Active instance
        out["active_first_token_s"] = round(_median([_stream(port, "m", 1)[0] for _ in range(args.repeats)]), 4)
        _ctl(sock, am.StateReq("m", 0, "warm"))
        warm = [_stream(port, "m", 1)[0]]
        for _ in range(args.repeats - 1):
            _ctl(sock, am.StateReq("m", 0, "warm"))
            warm.append(_stream(port, "m", 1)[0])
        _ctl(sock, am.StateReq("m", 0, "cold"))
        time.sleep(0.5)
        out["cold_rss_after_mib"] = round(_rss_mib(pids[0]), 1)
        cold = [_stream(port, "m", 1)[0]]
        for _ in range(args.repeats - 1):
            _ctl(sock, am.StateReq("m", 0, "cold"))
            cold.append(_stream(port, "m", 1)[0])
        _ctl(sock, am.StateReq("m", 0, "cold"))
        out["cold_restore_phases_s"] = _ctl(sock, am.StateReq("m", 0, "active"))["phases"]
        out["warm_first_token_s"] = round(_median(warm), 4)
        out["cold_first_token_s"] = round(_median(cold), 4)
        out["first_tokens_s"] = {"warm": [round(x, 4) for x in warm], "cold": [round(x, 4) for x in cold]}
    finally:
        daemon_proc.stop(proc)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(x) << 20 for x in args.sizes_mib.split(",")]
    with tempfile.TemporaryDirectory(prefix="janus-bench-restore-") as work:
        rows = _synthetic(sizes, args, Path(work))
    daemon = {} if args.no_daemon else _daemon(args)
    worst = lambda key: round(min(r[key] for r in rows), 3)  # noqa: E731
    result: dict[str, Any] = {"bench": "restore", "streams": args.streams, "chunk_mib": args.chunk_mib,
                              "cpus": os.cpu_count(), "by_size": rows, **daemon}
    result.update(d2d_vs_raw_transfer_same_pages=worst("d2d_vs_raw_transfer_same_pages"),
                  cold_vs_disk_same_pages=worst("cold_vs_disk_same_pages"),
                  h2d_vs_memcpy=worst("h2d_vs_memcpy"), d2d_vs_raw_transfer=worst("d2d_vs_raw_transfer"),
                  cold_vs_disk=worst("cold_vs_disk"))
    for key in ("control_overhead_ms", "source_tpot_p99_increase_pct", "warm_first_token_s", "cold_first_token_s",
                "cold_rss_after_mib"):
        if key in result:
            result[key] = result.pop(key)  # the keys last, in its order
    return result
